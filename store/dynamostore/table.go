package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxkit/outbox"
)

// TableClient is the part of the DynamoDB API the table helpers call;
// *dynamodb.Client implements it.
type TableClient interface {
	CreateTable(ctx context.Context, in *ddb.CreateTableInput, optFns ...func(*ddb.Options)) (*ddb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *ddb.DescribeTableInput, optFns ...func(*ddb.Options)) (*ddb.DescribeTableOutput, error)
}

var _ TableClient = (*ddb.Client)(nil)

// CreateTableInput returns the definition of an outbox table for cfg: a string
// partition key and a string sort key, on-demand billing, no index. Adjust it before
// creating the table if you need to (tags, deletion protection, encryption); keep the
// key schema.
func CreateTableInput(cfg Config) (*ddb.CreateTableInput, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &ddb.CreateTableInput{
		TableName:   aws.String(cfg.TableName),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(cfg.PartitionKeyAttributeName), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(cfg.SortKeyAttributeName), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(cfg.PartitionKeyAttributeName), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(cfg.SortKeyAttributeName), KeyType: types.KeyTypeRange},
		},
	}, nil
}

// CreateIfNotExists creates the outbox table unless it exists, then waits until it is
// ACTIVE. It is safe to call from several processes at once: a process that loses the
// race to create the table waits for the winner's table. It fails with
// [outbox.ErrMisconfigured] when an existing table's key schema does not match cfg.
// Meant for development, tests and samples; provision production tables with your
// infrastructure tooling.
func CreateIfNotExists(ctx context.Context, client TableClient, cfg Config) error {
	in, err := CreateTableInput(cfg)
	if err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	desc, err := describe(ctx, client, cfg.TableName)
	if err != nil {
		return err
	}
	if desc == nil {
		_, err := client.CreateTable(ctx, in)
		if _, inUse := errors.AsType[*types.ResourceInUseException](err); err != nil && !inUse {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("dynamostore: create table %q: %w", cfg.TableName, err)
		}
	}
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		desc, err = describe(ctx, client, cfg.TableName)
		if err != nil {
			return err
		}
		// Some emulators report no status at all; their tables are usable at once.
		if desc != nil && (desc.TableStatus == types.TableStatusActive || desc.TableStatus == "") {
			return checkKeySchema(desc, cfg)
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// describe returns the table's description, or nil if it does not exist.
func describe(ctx context.Context, client TableClient, name string) (*types.TableDescription, error) {
	out, err := client.DescribeTable(ctx, &ddb.DescribeTableInput{TableName: aws.String(name)})
	if _, missing := errors.AsType[*types.ResourceNotFoundException](err); missing {
		return nil, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("dynamostore: describe table %q: %w", name, err)
	}
	return out.Table, nil
}

func checkKeySchema(desc *types.TableDescription, cfg Config) error {
	want := map[string]types.KeyType{
		cfg.PartitionKeyAttributeName: types.KeyTypeHash,
		cfg.SortKeyAttributeName:      types.KeyTypeRange,
	}
	ok := len(desc.KeySchema) == 2
	for _, k := range desc.KeySchema {
		if want[aws.ToString(k.AttributeName)] != k.KeyType {
			ok = false
		}
	}
	for _, d := range desc.AttributeDefinitions {
		if _, key := want[aws.ToString(d.AttributeName)]; key && d.AttributeType != types.ScalarAttributeTypeS {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("%w: dynamostore: table %q exists but its key schema is not a string %s partition key and a string %s sort key",
			outbox.ErrMisconfigured, cfg.TableName, cfg.PartitionKeyAttributeName, cfg.SortKeyAttributeName)
	}
	return nil
}

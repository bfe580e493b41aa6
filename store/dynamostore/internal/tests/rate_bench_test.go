package tests

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// countingClient is a DynamoDB API client that counts every request it passes on, by
// what the request is for: the idle probe, the coordination and relay reads, a
// heartbeat, a renewal, a backlog sample, and so on.
type countingClient struct {
	dynamostore.Client
	mu   sync.Mutex
	kind map[string]int
}

func newCountingClient(c dynamostore.Client) *countingClient {
	return &countingClient{Client: c, kind: map[string]int{}}
}

func (c *countingClient) add(kind string) {
	c.mu.Lock()
	c.kind[kind]++
	c.mu.Unlock()
}

// take returns the counts since the last call and starts again.
func (c *countingClient) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.kind
	c.kind = map[string]int{}
	return out
}

func attrS(v types.AttributeValue) string {
	s, _ := v.(*types.AttributeValueMemberS)
	if s == nil {
		return ""
	}
	return s.Value
}

func (c *countingClient) Query(ctx context.Context, in *ddb.QueryInput, opts ...func(*ddb.Options)) (*ddb.QueryOutput, error) {
	pk := attrS(in.ExpressionAttributeValues[":pk"])
	consistent := in.ConsistentRead != nil && *in.ConsistentRead
	kind := "other-read"
	switch {
	case strings.HasSuffix(pk, "#COORDINATION") && consistent:
		kind = "coordination-read"
	case strings.HasSuffix(pk, "#COORDINATION") && strings.Contains(*in.KeyConditionExpression, "begins_with"):
		kind = "relay-read"
	case strings.HasSuffix(pk, "#COORDINATION"):
		kind = "check"
	case in.Select == types.SelectCount:
		kind = "stats-read"
	case strings.Contains(pk, "#MESSAGES#") && consistent:
		kind = "fetch"
	case strings.Contains(pk, "#MESSAGES#") && in.ProjectionExpression != nil && strings.Contains(*in.ProjectionExpression, "created"):
		kind = "stats-read"
	case strings.Contains(pk, "#MESSAGES#"):
		kind = "probe"
	case strings.Contains(pk, "#SEQUENCE#"):
		kind = "counter-read"
	}
	c.add(kind)
	return c.Client.Query(ctx, in, opts...)
}

// writeKind names a coordination write by the item it writes.
func writeKind(op string, key map[string]types.AttributeValue) string {
	sk := attrS(key["SK"])
	switch {
	case strings.HasPrefix(sk, "RELAY#"):
		return "relay-" + op
	case strings.HasPrefix(sk, "LEASE#"):
		return "lease-" + op
	}
	return op
}

func (c *countingClient) UpdateItem(ctx context.Context, in *ddb.UpdateItemInput, opts ...func(*ddb.Options)) (*ddb.UpdateItemOutput, error) {
	c.add(writeKind("update", in.Key))
	return c.Client.UpdateItem(ctx, in, opts...)
}

func (c *countingClient) PutItem(ctx context.Context, in *ddb.PutItemInput, opts ...func(*ddb.Options)) (*ddb.PutItemOutput, error) {
	c.add(writeKind("put", in.Item))
	return c.Client.PutItem(ctx, in, opts...)
}

func (c *countingClient) DeleteItem(ctx context.Context, in *ddb.DeleteItemInput, opts ...func(*ddb.Options)) (*ddb.DeleteItemOutput, error) {
	c.add(writeKind("delete", in.Key))
	return c.Client.DeleteItem(ctx, in, opts...)
}

func (c *countingClient) BatchWriteItem(ctx context.Context, in *ddb.BatchWriteItemInput, opts ...func(*ddb.Options)) (*ddb.BatchWriteItemOutput, error) {
	c.add("batch-write")
	return c.Client.BatchWriteItem(ctx, in, opts...)
}

func (c *countingClient) TransactWriteItems(ctx context.Context, in *ddb.TransactWriteItemsInput, opts ...func(*ddb.Options)) (*ddb.TransactWriteItemsOutput, error) {
	c.add("transaction")
	return c.Client.TransactWriteItems(ctx, in, opts...)
}

// reportRates reports the requests per second of counts over elapsed, in all and by
// kind.
func reportRates(b *testing.B, counts map[string]int, elapsed time.Duration) {
	total := 0
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		total += counts[k]
		b.ReportMetric(float64(counts[k])/elapsed.Seconds(), k+"/s")
	}
	b.ReportMetric(float64(total)/elapsed.Seconds(), "requests/s")
}

// BenchmarkIdleRequestRate measures the DynamoDB requests per second of relays that
// have nothing to publish, at the relay's default timings (poll 1 s, renew 10 s, lease
// 30 s, backlog sample 30 s), counted by a wrapper around the client of each relay's
// store: "idle" is one relay holding all 8 buckets of an empty table; "standby" is
// the fifth relay of a fleet on 2 buckets (two holders, and two standbys before it in
// line, since its id sorts last), a standby far back in line. One iteration is one second of observation: run
// with -benchtime=120x (or more) for rates that carry a whole number of rounds.
func BenchmarkIdleRequestRate(b *testing.B) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func(b *testing.B, d *testDB, cfg dynamostore.Config, id string) (*relay.Relay, *countingClient) {
		client := newCountingClient(d.client)
		s, err := dynamostore.New(client, cfg)
		require.NoError(b, err)
		b.Cleanup(func() { _ = s.Close() })
		disp, err := relay.New(s, outboxtest.NewRecorder(), relay.Config{RelayID: id, Logger: quiet})
		require.NoError(b, err)
		require.NoError(b, disp.Start(context.Background()))
		b.Cleanup(func() { _ = disp.Stop(context.Background()) })
		return disp, client
	}
	// settle waits until disp has run two more rounds than it had, within a minute.
	settle := func(b *testing.B, disp *relay.Relay) {
		rounds := disp.Stats().Rounds
		deadline := time.Now().Add(time.Minute)
		for disp.Stats().Rounds < rounds+2 {
			require.True(b, time.Now().Before(deadline), "the relay did not settle")
			time.Sleep(100 * time.Millisecond)
		}
	}
	measure := func(b *testing.B, client *countingClient) {
		client.take()
		b.ResetTimer()
		begin := time.Now()
		for b.Loop() {
			time.Sleep(time.Second)
		}
		elapsed := time.Since(begin)
		b.StopTimer()
		reportRates(b, client.take(), elapsed)
	}

	b.Run("idle", func(b *testing.B) {
		d := newTestDB(b)
		table := d.newStore(b, dynamostore.Config{BucketCount: 8}).Config()
		disp, client := start(b, d, table, "relay-idle")
		deadline := time.Now().Add(time.Minute)
		for len(disp.Owned()) < 8 {
			require.True(b, time.Now().Before(deadline), "the relay did not take the buckets")
			time.Sleep(100 * time.Millisecond)
		}
		settle(b, disp)
		measure(b, client)
	})

	b.Run("standby", func(b *testing.B) {
		d := newTestDB(b)
		table := d.newStore(b, dynamostore.Config{BucketCount: 2}).Config()
		var first []*relay.Relay
		for _, id := range []string{"relay-a", "relay-b", "relay-c", "relay-d"} {
			disp, _ := start(b, d, table, id)
			first = append(first, disp)
		}
		// Two of them hold a bucket each, the other two are the standbys first in line.
		split := func() bool {
			holders := 0
			for _, disp := range first {
				switch len(disp.Owned()) {
				case 0:
				case 1:
					holders++
				default:
					return false
				}
			}
			return holders == 2
		}
		deadline := time.Now().Add(time.Minute)
		for !split() {
			require.True(b, time.Now().Before(deadline), "the first four relays did not split the buckets")
			time.Sleep(100 * time.Millisecond)
		}
		last, client := start(b, d, table, "relay-z")
		settle(b, last)
		require.Empty(b, last.Owned(), "the last relay is a standby")
		measure(b, client)
		require.Empty(b, last.Owned(), "the last relay stayed a standby")
	})
}

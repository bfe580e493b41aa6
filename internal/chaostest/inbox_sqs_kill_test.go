package chaostest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox"
	emulator "github.com/outboxkit/outbox/internal/sqsemulator"
	dynamostore "github.com/outboxkit/outbox/store/dynamodb"
	sqstransport "github.com/outboxkit/outbox/transport/sqs"
)

// TestInboxSurvivesKilledSQSConsumers: consumer processes receive from SQS and apply
// each message through an inbox on DynamoDB (one TransactWriteItems with the key and
// the effect). They are SIGKILLed between a unit's commit and the message's delete,
// and at random points: every message's effect is applied exactly once.
func TestInboxSurvivesKilledSQSConsumers(t *testing.T) {
	const n = 120
	ctx := context.Background()
	dynSrv := httptest.NewServer(server.NewServer())
	t.Cleanup(dynSrv.Close)
	dyn := ddb.New(ddb.Options{Region: "us-east-1", BaseEndpoint: aws.String(dynSrv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
	table := "inbox-kill"
	require.NoError(t, dynamostore.CreateIfNotExists(ctx, dyn, dynamostore.Config{TableName: table}))

	sqsSrv := emulator.Start(t)
	queue := sqsSrv.CreateQueue(t, "payments", nil)
	tr, err := sqstransport.New(sqsSrv.Client(), sqstransport.Config{Resolver: sqstransport.Queues{"payments": queue}})
	require.NoError(t, err)
	ids := map[string]bool{}
	var envs []*outbox.Envelope
	for i := range n {
		env, err := outbox.NewEnvelope(outbox.Message{Topic: "payments", Key: []byte(fmt.Sprint("key-", i%13)), Payload: []byte(fmt.Sprint(i))}, outbox.DefaultBucketCount)
		require.NoError(t, err)
		envs = append(envs, env)
		ids[env.ID.String()] = true
	}
	require.NoError(t, tr.Publish(ctx, envs))

	bin := buildConsumer(t)
	args := []string{"-dynamodb", dynSrv.URL, "-dynamodb-table", table, "-sqs", sqsSrv.URL, "-queue", queue,
		"-consumer", "billing", "-visibility", "2s", "-max-poll", "5"}
	start := func(id string, extra ...string) *consumerProc {
		return startConsumer(t, bin, id, append(append([]string(nil), args...), extra...)...)
	}

	began := time.Now()
	survivor := start("survivor")
	procs := []*consumerProc{survivor}
	for i := range 2 {
		victim := start(fmt.Sprint("after-commit-", i), "-pause", "300ms")
		procs = append(procs, victim)
		select {
		case <-victim.onCommit:
		case <-victim.exited:
			t.Fatalf("consumer exited before processing: %v", victim.err)
		case <-time.After(2 * time.Minute):
			t.Fatalf("consumer %s processed nothing within two minutes", victim.id)
		}
		victim.kill(t)
		t.Logf("%v: killed %s after a commit", time.Since(began).Round(time.Millisecond), victim.id)
	}
	rng := rand.New(rand.NewPCG(14, 15))
	for i := range 2 {
		victim := start(fmt.Sprint("random-", i))
		procs = append(procs, victim)
		time.Sleep(time.Duration(100+rng.IntN(900)) * time.Millisecond)
		victim.kill(t)
		t.Logf("%v: killed %s", time.Since(began).Round(time.Millisecond), victim.id)
	}

	var counts map[string]int
	require.Eventually(t, func() bool {
		counts = dynamoEffects(t, dyn, table)
		for id := range ids {
			if counts[id] == 0 {
				return false
			}
		}
		return true
	}, 3*time.Minute, 200*time.Millisecond, "every message's effect is applied")
	t.Logf("%v: every effect applied", time.Since(began).Round(time.Millisecond))
	requireOnce(t, ids, counts)
	require.Len(t, counts, n)
	// The messages of the killed units come back after their visibility timeout and
	// are found duplicates; wait for them, then stop.
	require.Eventually(t, func() bool {
		dups := 0
		for _, p := range procs {
			_, _, d := p.counts()
			dups += d
		}
		return dups >= 2
	}, 2*time.Minute, 50*time.Millisecond, "the messages of the units killed before their delete were received again and skipped")
	survivor.stop(t)
	requireOnce(t, ids, dynamoEffects(t, dyn, table))
}

// dynamoEffects counts the effect items per message id.
func dynamoEffects(t *testing.T, dyn *ddb.Client, table string) map[string]int {
	t.Helper()
	out := map[string]int{}
	var start map[string]types.AttributeValue
	for {
		res, err := dyn.Scan(context.Background(), &ddb.ScanInput{TableName: aws.String(table), ExclusiveStartKey: start, ConsistentRead: aws.Bool(true)})
		require.NoError(t, err)
		for _, item := range res.Items {
			pk, _ := item["PK"].(*types.AttributeValueMemberS)
			if pk != nil && strings.HasPrefix(pk.Value, "EFFECT#") {
				out[strings.TrimPrefix(pk.Value, "EFFECT#")]++
			}
		}
		if len(res.LastEvaluatedKey) == 0 {
			return out
		}
		start = res.LastEvaluatedKey
	}
}

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
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	emulator "github.com/outboxkit/outbox/internal/sqsemulator"
	"github.com/outboxkit/outbox/store/dynamostore"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// TestInboxSurvivesKilledSQSConsumers: consumer processes receive from SQS and apply
// each message through an inbox on DynamoDB (one TransactWriteItems with the key and
// the effect). They are SIGKILLed between a unit's commit and the message's delete,
// and at random points: every message's effect is applied exactly once.
func TestInboxSurvivesKilledSQSConsumers(t *testing.T) {
	const n = 120
	rig := newSQSRig(t, "payments")
	ids := rig.publish(t, n, "payments")
	dyn, table := rig.dyn, rig.table
	start := func(id string, extra ...string) *consumerProc {
		return rig.start(t, id, "payments", append([]string{"-consumer", "billing"}, extra...)...)
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

// TestInboxTwoSQSConsumerProcessesRaceOnEveryKey: the same messages are sent to two
// queues, each received by a process of its own under one consumer name, so the two
// race on every key. Each message's effect is applied once.
func TestInboxTwoSQSConsumerProcessesRaceOnEveryKey(t *testing.T) {
	const n = 80
	rig := newSQSRig(t, "refunds-a", "refunds-b")
	ids := rig.publish(t, n, "refunds-a", "refunds-b")
	common := []string{"-consumer", "refunds", "-handler-time", "2ms", "-visibility", "30s"}
	a := rig.start(t, "a", "refunds-a", common...)
	b := rig.start(t, "b", "refunds-b", common...)
	require.Eventually(t, func() bool {
		_, ca, _ := a.counts()
		_, cb, _ := b.counts()
		return ca >= n && cb >= n
	}, 3*time.Minute, 50*time.Millisecond, "both processes process every message (applied or duplicate)")
	a.stop(t)
	b.stop(t)
	requireOnce(t, ids, dynamoEffects(t, rig.dyn, rig.table))
	_, _, da := a.counts()
	_, _, db := b.counts()
	require.Equal(t, n, da+db, "between them, the two processes applied each message once and skipped it once")
}

// sqsRig is a DynamoDB table (on an in-process API server) and SQS queues (on the
// emulator) that consumer processes share.
type sqsRig struct {
	dyn    *ddb.Client
	dynURL string
	table  string
	sqs    *emulator.Server
	queues map[string]string // topic → queue URL
	bin    string
}

func newSQSRig(t *testing.T, topics ...string) *sqsRig {
	t.Helper()
	dynSrv := httptest.NewServer(server.NewServer())
	t.Cleanup(dynSrv.Close)
	dyn := ddb.New(ddb.Options{Region: "us-east-1", BaseEndpoint: aws.String(dynSrv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
	table := "inbox-kill"
	require.NoError(t, dynamostore.CreateIfNotExists(context.Background(), dyn, dynamostore.Config{TableName: table}))
	srv := emulator.Start(t)
	queues := map[string]string{}
	for _, topic := range topics {
		queues[topic] = srv.CreateQueue(t, topic, nil)
	}
	return &sqsRig{dyn: dyn, dynURL: dynSrv.URL, table: table, sqs: srv, queues: queues, bin: buildConsumer(t)}
}

// publish sends the same n keyed messages to every topic through the outbox's SQS
// transport and returns their ids.
func (r *sqsRig) publish(t *testing.T, n int, topics ...string) map[string]bool {
	t.Helper()
	tr, err := sqstransport.New(r.sqs.Client(), sqstransport.Config{Resolver: sqstransport.Queues(r.queues)})
	require.NoError(t, err)
	ids := map[string]bool{}
	for _, topic := range topics {
		var envs []*driver.Envelope
		for i := range n {
			env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: []byte(fmt.Sprint("key-", i%13)), Payload: []byte(fmt.Sprint(i))}, driver.DefaultBucketCount)
			require.NoError(t, err)
			// The same message on every queue: one id, so one key.
			env.ID, _ = uuid.Parse(fmt.Sprintf("00000000-0000-7000-8000-%012d", i))
			envs = append(envs, env)
			ids[env.ID.String()] = true
		}
		require.NoError(t, tr.Publish(context.Background(), envs))
	}
	return ids
}

func (r *sqsRig) start(t *testing.T, id, topic string, extra ...string) *consumerProc {
	t.Helper()
	args := []string{"-dynamodb", r.dynURL, "-dynamodb-table", r.table, "-sqs", r.sqs.URL, "-queue", r.queues[topic],
		"-visibility", "2s", "-max-poll", "5"}
	return startConsumer(t, r.bin, id, append(args, extra...)...)
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

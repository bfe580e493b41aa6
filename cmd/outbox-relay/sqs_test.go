package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/sqsemulator"
)

// TestRelayFromSQLiteToSQS runs the relay on the other store and broker family: a
// SQLite file (the relay applies the migrations) and the SQS emulator.
func TestRelayFromSQLiteToSQS(t *testing.T) {
	ctx := context.Background()
	emu := sqsemulator.Start(t)
	queueURL := emu.CreateQueue(t, "orders", nil)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")

	dsn := "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")
	st, err := openStore(ctx, storeOptions{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	require.NoError(t, st.SQL.Migrate(ctx))
	const n = 50
	var envs []*driver.Envelope
	for i := range n {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "k%d", i%7), Payload: fmt.Appendf(nil, "payload %d", i)}, st.BucketCount())
		require.NoError(t, err)
		envs = append(envs, env)
	}
	require.NoError(t, st.Enqueue(ctx, envs...))

	p := startRelay(t, "-store", dsn, "-migrate", "-sqs", "-aws-region", "us-east-1", "-aws-endpoint", emu.URL,
		"-listen", "127.0.0.1:0", "-relay-id", "sqs-relay", "-poll-interval", "50ms",
		"-lease-duration", "6s", "-lease-renew-interval", "1s")
	var addr string
	select {
	case addr = <-p.addr:
	case <-p.done:
		t.Fatalf("the relay exited: %v", p.exitErr)
	case <-time.After(60 * time.Second):
		t.Fatal("the relay did not report its endpoints")
	}
	eventually(t, 60*time.Second, "ready", func() bool {
		code, _ := get(t, "http://"+addr+"/readyz")
		return code == http.StatusOK
	})

	client := emu.Client()
	got := map[string]bool{}
	deadline := time.Now().Add(60 * time.Second)
	for len(got) < n {
		require.True(t, time.Now().Before(deadline), "received %d of %d", len(got), n)
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		require.NoError(t, err)
		for _, m := range out.Messages {
			got[aws.ToString(m.Body)] = true
			_, err := client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle})
			require.NoError(t, err)
		}
	}
	for i := range n {
		require.True(t, got[fmt.Sprintf("payload %d", i)], "message %d", i)
	}
	eventually(t, 60*time.Second, "the sent count in the metrics", func() bool {
		_, body := get(t, "http://"+addr+"/metrics")
		sent, _ := metric(body, "messaging_client_sent_messages_total", []string{`messaging_system="aws_sqs"`}, "error_type")
		return sent == n
	})

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the relay did not stop after SIGTERM")
	}
	require.NoError(t, p.exitErr)
	view, err := st.ReadCoordination(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, view.Leases)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "bucket %d still leased after SIGTERM", l.Bucket)
	}
}

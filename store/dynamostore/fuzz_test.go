package dynamostore

import (
	"bytes"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// fuzzHeaders turns fuzz input into headers: pieces cut at 0xff alternate key and
// value; a value of exactly "\x00" stands for nil.
func fuzzHeaders(data []byte) []outbox.Header {
	hs := []outbox.Header{}
	parts := bytes.Split(data, []byte{0xff})
	for i := 0; i+1 < len(parts); i += 2 {
		v := parts[i+1]
		if bytes.Equal(v, []byte{0}) {
			v = nil
		}
		hs = append(hs, outbox.Header{Key: string(parts[i]), Value: v})
	}
	return hs
}

func sameHeaders(t *testing.T, want, got []outbox.Header) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%d headers, want %d", len(got), len(want))
	}
	for i := range want {
		if want[i].Key != got[i].Key || !bytes.Equal(want[i].Value, got[i].Value) || (want[i].Value == nil) != (got[i].Value == nil) {
			t.Fatalf("header %d: %q=%q, want %q=%q", i, got[i].Key, got[i].Value, want[i].Key, want[i].Value)
		}
	}
}

// FuzzMessageItemRoundTrip: any envelope survives its item layout: key, payload and
// headers byte for byte (nil and empty apart), partition, times to the tick.
func FuzzMessageItemRoundTrip(f *testing.F) {
	f.Add("orders", []byte("k"), []byte("v"), []byte("h\xffv\xffn\xff\x00"), int32(2), int64(7), 3, "boom", false, false)
	f.Add("", []byte{}, []byte(nil), []byte(nil), int32(-1), int64(0), 0, "", true, true)
	f.Fuzz(func(t *testing.T, topic string, key, payload, headerData []byte, partition int32, seq int64, attempts int, lastErr string, nilKey, nilPayload bool) {
		k := keys{prefix: "OUTBOX", pk: "PK", sk: "SK"}
		env := &driver.Envelope{Message: outbox.Message{ID: uuid.Must(uuid.NewV7())}, Seq: max(seq, 0), BucketCount: 8, Attempts: max(attempts, 0), LastError: lastErr}
		env.Topic = topic
		if !nilKey {
			env.Key = key
		}
		if !nilPayload {
			env.Payload = payload
		}
		if headerData != nil {
			env.Headers = fuzzHeaders(headerData)
		}
		if partition >= 0 {
			env.Partition = &partition
		}
		env.CreatedAt = time.Unix(1_700_000_000, int64(seq%1e9)*100).UTC()
		got, err := k.decodeMessage(k.messageItem(env, k.messages(3)), 3, driver.Pending)
		if err != nil {
			t.Fatalf("decode what was written: %v", err)
		}
		if got.ID != env.ID || got.Seq != env.Seq || got.Topic != env.Topic || got.BucketCount != 8 || got.Attempts != env.Attempts || got.LastError != env.LastError {
			t.Fatalf("fields changed: %+v, want %+v", got, env)
		}
		if !bytes.Equal(got.Key, env.Key) || (got.Key == nil) != (env.Key == nil) || !bytes.Equal(got.Payload, env.Payload) || (got.Payload == nil) != (env.Payload == nil) {
			t.Fatalf("key or payload changed")
		}
		if !got.CreatedAt.Equal(env.CreatedAt) {
			t.Fatalf("created %s, want %s", got.CreatedAt, env.CreatedAt)
		}
		if (got.Partition == nil) != (env.Partition == nil) || (got.Partition != nil && *got.Partition != *env.Partition) {
			t.Fatalf("partition changed")
		}
		sameHeaders(t, env.Headers, got.Headers)
	})
}

// FuzzDecodeMessageItem: an item with arbitrary attribute values is decoded or
// refused with an error, never a panic.
func FuzzDecodeMessageItem(f *testing.F) {
	f.Add("0000000000000000001", uuid.Must(uuid.NewV7()).String(), []byte("\x01\x01k\x02v"), "3", "638000000000000000", "2", "x")
	f.Add("-1", "zz", []byte{0xff}, "99999999999999999999", "-9", "1e3", "")
	f.Fuzz(func(t *testing.T, sk, id string, headers []byte, partition, created, attempts, next string) {
		k := keys{prefix: "OUTBOX", pk: "PK", sk: "SK"}
		item := map[string]types.AttributeValue{
			"PK":              &types.AttributeValueMemberS{Value: k.messages(1)},
			"SK":              &types.AttributeValueMemberS{Value: sk},
			attrMessageID:     &types.AttributeValueMemberS{Value: id},
			attrHeaders:       &types.AttributeValueMemberB{Value: headers},
			attrPartition:     &types.AttributeValueMemberN{Value: partition},
			attrCreatedAt:     &types.AttributeValueMemberN{Value: created},
			attrAttempts:      &types.AttributeValueMemberN{Value: attempts},
			attrNextAttemptAt: &types.AttributeValueMemberS{Value: next}, // the wrong type
		}
		_, _ = k.decodeMessage(item, 1, driver.Pending)
	})
}

// Package tests holds the tests of package dynamostreams that run against a DynamoDB
// API server in the process, in a package no application imports (go mod tidy loads
// the tests of the packages an application imports).
package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox/store/dynamostore"
)

// testDB is one in-process DynamoDB API server behind a proxy that counts requests
// per operation, and an SDK client that talks to the proxy.
//
// The server evaluates numbers as float64, while DynamoDB keeps 38 digits: 18-digit
// UTC ticks (lease expiries, heartbeats) would compare wrongly in the lease
// protocol's conditions. The proxy rebases tick values on the way in and back, as
// the store's own test proxy does.
type testDB struct {
	client *ddb.Client
	mu     sync.Mutex
	reqs   map[string]int
}

const tickBase = 639_000_000_000_000_000

var tickAttributes = map[string]bool{
	"CreatedAtUtc": true, "NextAttemptAtUtc": true, "ParkedAtUtc": true,
	"ExpiresAtUtc": true, "LastSeenUtc": true, "StoppedAtUtc": true,
}

func rebaseTicks(body []byte, toServer bool) []byte {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return body
	}
	var walk func(v any, name string)
	walk = func(v any, name string) {
		switch v := v.(type) {
		case map[string]any:
			if n, ok := v["N"].(string); ok && len(v) == 1 {
				x, err := strconv.ParseInt(n, 10, 64)
				switch {
				case err != nil:
				case toServer && x >= 100_000_000_000_000_000:
					v["N"] = strconv.FormatInt(x-tickBase, 10)
				case !toServer && tickAttributes[name]:
					v["N"] = strconv.FormatInt(x+tickBase, 10)
				}
				return
			}
			for k, e := range v {
				walk(e, k)
			}
		case []any:
			for _, e := range v {
				walk(e, name)
			}
		}
	}
	walk(doc, "")
	out, err := json.Marshal(doc)
	if err != nil {
		return body
	}
	return out
}

func newTestDB(t testing.TB) *testDB {
	t.Helper()
	backend := httptest.NewServer(server.NewServer())
	t.Cleanup(backend.Close)
	target, err := url.Parse(backend.URL)
	require.NoError(t, err)
	d := &testDB{reqs: map[string]int{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			if r.Out.Body == nil {
				return
			}
			body, _ := io.ReadAll(r.Out.Body)
			body = rebaseTicks(body, true)
			r.Out.Body = io.NopCloser(bytes.NewReader(body))
			r.Out.ContentLength = int64(len(body))
			r.Out.Header.Set("Content-Length", fmt.Sprint(len(body)))
		},
		ModifyResponse: func(resp *http.Response) error {
			op := resp.Request.Header.Get("X-Amz-Target")
			op = op[strings.LastIndex(op, ".")+1:]
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			_ = resp.Body.Close()
			body = rebaseTicks(body, false)
			d.mu.Lock()
			d.reqs[op]++
			d.mu.Unlock()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			resp.ContentLength = int64(len(body))
			resp.Header.Set("Content-Length", fmt.Sprint(len(body)))
			return nil
		},
	}
	front := httptest.NewServer(rp)
	t.Cleanup(front.Close)
	d.client = ddb.New(ddb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(front.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	return d
}

// take returns the requests per operation since the last call.
func (d *testDB) take() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.reqs
	d.reqs = map[string]int{}
	return r
}

var tableSeq atomic.Int64

func (d *testDB) newStore(t testing.TB, cfg dynamostore.Config) *dynamostore.Store {
	t.Helper()
	cfg.TableName = fmt.Sprintf("streams-%d", tableSeq.Add(1))
	require.NoError(t, dynamostore.CreateIfNotExists(context.Background(), d.client, cfg))
	s, err := dynamostore.New(d.client, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	d.take()
	return s
}

// streamOf builds the KEYS_ONLY stream records DynamoDB Streams would deliver for the
// items of a table, in the order given: it reads each item's key from the table, as
// the stream does.
type streamOf struct {
	seq int
	ev  events.DynamoDBEvent
}

func (s *streamOf) add(event events.DynamoDBOperationType, pk, sk string) string {
	s.seq++
	id := fmt.Sprintf("%021d", s.seq)
	s.ev.Records = append(s.ev.Records, events.DynamoDBEventRecord{
		AWSRegion: "us-east-1", EventID: fmt.Sprint(s.seq), EventName: string(event), EventSource: "aws:dynamodb", EventVersion: "1.1",
		Change: events.DynamoDBStreamRecord{
			Keys: map[string]events.DynamoDBAttributeValue{
				"PK": events.NewStringAttribute(pk), "SK": events.NewStringAttribute(sk),
			},
			SequenceNumber: id, SizeBytes: int64(len(pk) + len(sk)), StreamViewType: "KEYS_ONLY",
		},
	})
	return id
}

// keysOf reads every item key of a partition, in sort key order.
func keysOf(t *testing.T, d *testDB, table, pk string) []string {
	t.Helper()
	out, err := d.client.Query(context.Background(), &ddb.QueryInput{
		TableName:                 aws.String(table),
		KeyConditionExpression:    aws.String("PK = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: pk}},
		ConsistentRead:            aws.Bool(true),
	})
	require.NoError(t, err)
	var sks []string
	for _, item := range out.Items {
		sks = append(sks, item["SK"].(*types.AttributeValueMemberS).Value)
	}
	return sks
}

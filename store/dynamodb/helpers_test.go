package dynamostore_test

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

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox"
	dynamostore "github.com/outboxkit/outbox/store/dynamodb"
)

// testDB is one in-process DynamoDB API server with a counting reverse proxy in front,
// and an SDK client that talks to the proxy.
type testDB struct {
	server *server.Server
	client *ddb.Client
	proxy  *proxy
}

// proxy counts requests per operation and ConditionalCheckFailedException responses,
// and can lose the response of chosen requests after the server applied them.
type proxy struct {
	mu       sync.Mutex
	requests map[string]int
	refused  int
	// loseResponses, per operation, is how many upcoming responses are replaced by an
	// internal server error (the request itself was applied).
	loseResponses map[string]int
	// serial serialises requests, for tests that run table operations concurrently.
	serial bool
	serMu  sync.Mutex
}

var tableSeq atomic.Int64

// newTestDB starts a server and proxy for one test.
func newTestDB(t testing.TB) *testDB {
	t.Helper()
	srv := server.NewServer()
	backend := httptest.NewServer(srv)
	t.Cleanup(backend.Close)
	target, err := url.Parse(backend.URL)
	require.NoError(t, err)
	p := &proxy{requests: map[string]int{}, loseResponses: map[string]int{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			hideEmptyBinaries(r.Out)
		},
		ModifyResponse: p.inspect,
	}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.serialised() {
			p.serMu.Lock()
			defer p.serMu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	client := ddb.New(ddb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(front.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	return &testDB{server: srv, client: client, proxy: p}
}

func (p *proxy) serialised() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.serial
}

// The DynamoDB API server differs from DynamoDB in two ways that matter here, and the
// proxy evens them out on the wire so the server stores, compares and returns what
// DynamoDB would:
//
//   - Its expression evaluator fails on any item of the table holding an empty binary
//     attribute, which DynamoDB allows (the store writes one for an empty key or
//     payload). Empty binaries travel as a marker.
//   - It evaluates numbers as float64, while DynamoDB keeps 38 digits: 18-digit UTC
//     ticks lose their last digits in updates and compare wrongly in conditions. Tick
//     values travel rebased by tickBase, which keeps them within float64's exact
//     integers for dates from about 1998 to 2054.
var (
	emptyBinary  = []byte(`{"B":""}`)
	binaryMarker = []byte(`{"B":"AG1pbmlkeW4tZW1wdHktYmluYXJ5AA=="}`)
)

const tickBase = 639_000_000_000_000_000

// tickAttributes are the attributes that hold ticks in items the server returns.
var tickAttributes = map[string]bool{
	"CreatedAtUtc": true, "NextAttemptAtUtc": true, "ParkedAtUtc": true,
	"ExpiresAtUtc": true, "LastSeenUtc": true, "StoppedAtUtc": true,
}

// rebaseTicks walks a JSON document and shifts tick numbers: toServer subtracts
// tickBase from every number of 18 digits (only ticks are that large), the way back
// adds it to every number held by a tick attribute.
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

func hideEmptyBinaries(r *http.Request) {
	if r.Body == nil {
		return
	}
	body, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		return
	}
	body = bytes.ReplaceAll(body, emptyBinary, binaryMarker)
	body = rebaseTicks(body, true)
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", fmt.Sprint(len(body)))
}

func (p *proxy) inspect(resp *http.Response) error {
	op := resp.Request.Header.Get("X-Amz-Target")
	op = op[strings.LastIndex(op, ".")+1:]
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	body = bytes.ReplaceAll(rebaseTicks(body, false), binaryMarker, emptyBinary)
	p.mu.Lock()
	p.requests[op]++
	if bytes.Contains(body, []byte("ConditionalCheckFailedException")) {
		p.refused++
	}
	if p.loseResponses[op] > 0 {
		p.loseResponses[op]--
		body = []byte(`{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected: response lost"}`)
		resp.StatusCode = http.StatusInternalServerError
		resp.Status = "500 Internal Server Error"
	}
	p.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", fmt.Sprint(len(body)))
	return nil
}

// counts returns the requests per operation and the refused conditional writes since
// the last reset, and resets them.
func (p *proxy) take() (map[string]int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	reqs, refused := p.requests, p.refused
	p.requests, p.refused = map[string]int{}, 0
	return reqs, refused
}

func (p *proxy) refusedSoFar() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

func (p *proxy) loseNext(op string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.loseResponses[op] += n
}

// uniqueTable returns a table name no other test uses.
func uniqueTable(t testing.TB) string {
	return fmt.Sprintf("outbox-%d", tableSeq.Add(1))
}

// newStore creates a table for opts (a unique one when opts.TableName is empty) and
// returns a store on it.
func (d *testDB) newStore(t testing.TB, opts dynamostore.Config) *dynamostore.Store {
	t.Helper()
	if opts.TableName == "" {
		opts.TableName = uniqueTable(t)
	}
	require.NoError(t, dynamostore.CreateIfNotExists(context.Background(), d.client, opts))
	s, err := dynamostore.New(d.client, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	d.proxy.take()
	return s
}

// envelope builds a pending envelope for topic and key with bucketCount buckets.
func envelope(t testing.TB, bucketCount int, topic string, key, payload []byte, headers ...outbox.Header) *outbox.Envelope {
	t.Helper()
	env, err := outbox.NewEnvelope(outbox.Message{Topic: topic, Key: key, Payload: payload, Headers: headers}, bucketCount)
	require.NoError(t, err)
	return env
}

// keyForBucket returns a key that lands in bucket among n buckets.
func keyForBucket(t testing.TB, bucket, n int) []byte {
	t.Helper()
	for i := 0; i < 10_000; i++ {
		k := []byte(fmt.Sprintf("key-%d", i))
		if outbox.BucketOf(&outbox.Message{Key: k}, [16]byte{}, n) == bucket {
			return k
		}
	}
	t.Fatalf("no key found for bucket %d", bucket)
	return nil
}

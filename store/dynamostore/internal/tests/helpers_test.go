// Package tests holds the tests of package dynamostore that run against a DynamoDB API
// server in the process: the store suite and the chaos run, the store's own tests,
// the relay fleet, the benchmarks, and the runnable examples. They live in a package no
// application imports because go mod tidy also loads the tests of the packages an
// application imports: in package dynamostore, the test-only server they need would be
// downloaded by every application that uses the store.
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// testDB is one in-process DynamoDB API server with a counting reverse proxy in front,
// and an SDK client that talks to the proxy.
type testDB struct {
	server *server.Server
	client *ddb.Client
	proxy  *proxy
}

// proxy counts requests per operation and ConditionalCheckFailedException responses,
// describing each refused write, and can lose the response of chosen requests after
// the server applied them.
type proxy struct {
	mu       sync.Mutex
	requests map[string]int
	refused  int
	// refusals describes the refused writes counted in refused.
	refusals []refusal
	// attempts lists, per SDK invocation, what each of its attempts got, so the
	// refusal of a retried request shows what the earlier attempts got.
	attempts map[string][]string
	// loseResponses, per operation, is how many upcoming responses are replaced by an
	// internal server error (the request itself was applied).
	loseResponses map[string]int
	// serial serialises requests, for tests that run table operations concurrently.
	serial bool
	serMu  sync.Mutex
	// last holds, per operation, the last request as the client sent it and the
	// response as the client got it.
	last map[string]exchange
	// limits enforces DynamoDB's item and key sizes; overLimit counts the requests it
	// refused, per operation.
	limits    *limits
	overLimit map[string]int
	// queries counts Query requests per partition key value and consistency.
	queries map[queryKind]int
}

// queryKind is the partition a Query read and whether it was strongly consistent.
type queryKind struct {
	pk         string
	consistent bool
}

// countQuery counts a Query by its partition key value (the :pk value) and
// consistency. The caller holds p.mu.
func (p *proxy) countQuery(body []byte) {
	var in struct {
		ConsistentRead            bool
		ExpressionAttributeValues map[string]map[string]any
	}
	if json.Unmarshal(body, &in) != nil {
		return
	}
	pk, _ := in.ExpressionAttributeValues[":pk"]["S"].(string)
	if p.queries == nil {
		p.queries = map[queryKind]int{}
	}
	p.queries[queryKind{pk, in.ConsistentRead}]++
}

// queriesOf returns how many strongly and eventually consistent Queries read the
// partition pk so far.
func (p *proxy) queriesOf(pk string) (consistent, eventual int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queries[queryKind{pk, true}], p.queries[queryKind{pk, false}]
}

// refuseOverLimit answers a request over one of DynamoDB's size limits with the
// ValidationException DynamoDB sends, and reports whether it did.
func (p *proxy) refuseOverLimit(w http.ResponseWriter, r *http.Request) bool {
	op := r.Header.Get("X-Amz-Target")
	op = op[strings.LastIndex(op, ".")+1:]
	body, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return false
	}
	msg := p.limits.check(op, body)
	if msg == "" {
		return false
	}
	p.mu.Lock()
	p.requests[op]++
	if p.overLimit == nil {
		p.overLimit = map[string]int{}
	}
	p.overLimit[op]++
	p.mu.Unlock()
	out, _ := json.Marshal(map[string]string{"__type": "com.amazon.coral.validate#ValidationException", "message": msg})
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(out)
	return true
}

// overLimitSoFar returns how many requests of op the size limits refused.
func (p *proxy) overLimitSoFar(op string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.overLimit[op]
}

// exchange is one request and its response, as the client saw them.
type exchange struct{ sent, got []byte }

var tableSeq atomic.Int64

// newTestDB starts a server and proxy for one test.
func newTestDB(t testing.TB) *testDB {
	t.Helper()
	srv := server.NewServer()
	backend := httptest.NewServer(srv)
	t.Cleanup(backend.Close)
	target, err := url.Parse(backend.URL)
	require.NoError(t, err)
	p := &proxy{requests: map[string]int{}, loseResponses: map[string]int{}, attempts: map[string][]string{}, last: map[string]exchange{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			at := time.Now()
			r.SetURL(target)
			body := hideEmptyBinaries(r.Out)
			r.Out = r.Out.WithContext(context.WithValue(r.Out.Context(), sentKey{}, sentRequest{body: body, at: at}))
		},
		ModifyResponse: p.inspect,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.attempt(r, "no response: "+err.Error())
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	p.limits = &limits{backend: backend.URL}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.serialised() {
			p.serMu.Lock()
			defer p.serMu.Unlock()
		}
		if p.refuseOverLimit(w, r) {
			return
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

// hideEmptyBinaries rewrites the request body for the server, and returns it as the
// client sent it.
func hideEmptyBinaries(r *http.Request) []byte {
	if r.Body == nil {
		return nil
	}
	sent, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		return nil
	}
	body := bytes.ReplaceAll(sent, emptyBinary, binaryMarker)
	body = rebaseTicks(body, true)
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", fmt.Sprint(len(body)))
	return sent
}

// sentKey carries a sentRequest from the proxy's Rewrite to inspect.
type sentKey struct{}

// sentRequest is a request body as the client sent it, and when the proxy got it.
type sentRequest struct {
	body []byte
	at   time.Time
}

// refusal describes one write the server refused with ConditionalCheckFailedException.
type refusal struct {
	At        time.Time // when the proxy received the request
	Op        string    // the operation, e.g. UpdateItem
	Item      string    // the item's key: which lease, relay record or message
	Condition string    // the ConditionExpression, names and values filled in
	Attempt   string    // the SDK's attempt header: attempt=2 and later are retries
	Earlier   []string  // what the earlier attempts of the same call got
}

func (r refusal) String() string {
	s := fmt.Sprintf("%s %s %s if %s [%s]", r.At.UTC().Format("15:04:05.000000"), r.Op, r.Item, r.Condition, r.Attempt)
	if len(r.Earlier) > 0 {
		s += fmt.Sprintf(", earlier attempts: %v", r.Earlier)
	}
	return s
}

// describeWrite reads the item key and the condition of a write request body; tick
// values show as UTC times.
func describeWrite(op string, sent sentRequest) refusal {
	r := refusal{At: sent.at, Op: op}
	var in struct {
		Key                       map[string]map[string]any
		Item                      map[string]map[string]any
		ConditionExpression       string
		ExpressionAttributeNames  map[string]string
		ExpressionAttributeValues map[string]map[string]any
	}
	if err := json.Unmarshal(sent.body, &in); err != nil {
		r.Item = fmt.Sprintf("(request body not decoded: %v)", err)
		return r
	}
	key := in.Key
	if key == nil {
		// A PutItem's item: its key attributes, named as the tests name them, and a
		// message's ID.
		key = map[string]map[string]any{}
		for name, v := range in.Item {
			if strings.EqualFold(name, "PK") || strings.EqualFold(name, "SK") || name == "MessageId" {
				key[name] = v
			}
		}
	}
	var parts []string
	for name, v := range key {
		parts = append(parts, name+"="+showValue(v))
	}
	slices.Sort(parts)
	r.Item = strings.Join(parts, " ")
	cond := in.ConditionExpression
	for name, attr := range in.ExpressionAttributeNames {
		cond = strings.ReplaceAll(cond, name, attr)
	}
	for name, v := range in.ExpressionAttributeValues {
		cond = strings.ReplaceAll(cond, name, name+"("+showValue(v)+")")
	}
	r.Condition = cond
	return r
}

// showValue renders an attribute value, a tick count as a UTC time.
func showValue(v map[string]any) string {
	if n, ok := v["N"].(string); ok {
		if x, err := strconv.ParseInt(n, 10, 64); err == nil && x >= 100_000_000_000_000_000 {
			const unixEpochTicks = 621_355_968_000_000_000
			return time.Unix(0, (x-unixEpochTicks)*100).UTC().Format("15:04:05.000000")
		}
		return n
	}
	if s, ok := v["S"].(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
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
	sent, _ := resp.Request.Context().Value(sentKey{}).(sentRequest)
	body = p.limits.returnOldItems(op, sent.body, body)
	p.mu.Lock()
	lose := p.loseResponses[op] > 0
	outcome := resp.Status
	if lose {
		outcome += ", response lost"
	}
	earlier := p.attemptLocked(resp.Request, outcome)
	p.requests[op]++
	if bytes.Contains(body, []byte("ConditionalCheckFailedException")) {
		p.refused++
		r := describeWrite(op, sent)
		r.Attempt, r.Earlier = resp.Request.Header.Get("Amz-Sdk-Request"), earlier
		p.refusals = append(p.refusals, r)
	}
	if lose {
		p.loseResponses[op]--
		body = []byte(`{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected: response lost"}`)
		resp.StatusCode = http.StatusInternalServerError
		resp.Status = "500 Internal Server Error"
	}
	p.last[op] = exchange{sent: sent.body, got: body}
	if op == "Query" {
		p.countQuery(sent.body)
	}
	p.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", fmt.Sprint(len(body)))
	return nil
}

// take returns the requests per operation and the refused conditional writes since
// the last reset, and resets them.
func (p *proxy) take() (map[string]int, int) {
	reqs, refusals := p.takeRefusals()
	return reqs, len(refusals)
}

// takeRefusals is take with a description of each refused write.
func (p *proxy) takeRefusals() (map[string]int, []refusal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	reqs, refusals := p.requests, p.refusals
	p.requests, p.refused, p.refusals = map[string]int{}, 0, nil
	return reqs, refusals
}

// attempt records what one attempt of an SDK call got (the SDK names the call in a
// header), and returns what the call's earlier attempts got.
func (p *proxy) attempt(r *http.Request, outcome string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attemptLocked(r, outcome)
}

func (p *proxy) attemptLocked(r *http.Request, outcome string) []string {
	call := r.Header.Get("Amz-Sdk-Invocation-Id")
	if call == "" {
		return nil
	}
	if len(p.attempts) >= 100_000 {
		clear(p.attempts) // bounds benchmarks; a call's attempts come within seconds
	}
	earlier := p.attempts[call]
	p.attempts[call] = append(slices.Clip(earlier), r.Header.Get("Amz-Sdk-Request")+": "+outcome)
	return earlier
}

// lastExchange returns the last request of op and its response, decoded.
func (p *proxy) lastExchange(t testing.TB, op string) (sent, got map[string]any) {
	t.Helper()
	p.mu.Lock()
	x, ok := p.last[op]
	p.mu.Unlock()
	require.True(t, ok, "no %s went through the proxy", op)
	require.NoError(t, json.Unmarshal(x.sent, &sent))
	require.NoError(t, json.Unmarshal(x.got, &got))
	return sent, got
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
func envelope(t testing.TB, bucketCount int, topic string, key, payload []byte, headers ...outbox.Header) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: key, Payload: payload, Headers: headers}, bucketCount)
	require.NoError(t, err)
	return env
}

// keyForBucket returns a key that lands in bucket among n buckets.
func keyForBucket(t testing.TB, bucket, n int) []byte {
	t.Helper()
	for i := 0; i < 10_000; i++ {
		k := []byte(fmt.Sprintf("key-%d", i))
		if driver.BucketOf(&outbox.Message{Key: k}, n) == bucket {
			return k
		}
	}
	t.Fatalf("no key found for bucket %d", bucket)
	return nil
}

// relaySide is everything the store's relay side implements.
type relaySide interface {
	driver.Store
	driver.Admin
	driver.Notifier
	driver.Prober
	driver.BacklogSampler
	MessageKey(pk, sk string) (bucket int, seq int64, ok bool)
}

// side returns the relay side of s, for the calls beyond driver.Store.
func side(s *dynamostore.Store) relaySide { return s.Driver().(relaySide) }

// message is a message for topic and key.
func message(topic string, key, payload []byte) outbox.Message {
	return outbox.Message{Topic: topic, Key: key, Payload: payload}
}

// createItems sends msgs on an application scope and returns the items
// CreateTransactWriteItems makes of them: their sequence numbers are reserved,
// nothing is written.
func createItems(t testing.TB, s *dynamostore.Store, msgs ...outbox.Message) ([]types.TransactWriteItem, error) {
	t.Helper()
	send, err := outbox.NewSender(s, outbox.SenderConfig{})
	require.NoError(t, err)
	ctx, scope := outbox.NewScope(context.Background())
	defer scope.Release()
	for _, m := range msgs {
		require.NoError(t, send.Send(ctx, m))
	}
	items, err := s.CreateTransactWriteItems(ctx)
	require.Zero(t, scope.Len(), "the messages left the scope")
	return items, err
}

// itemSeq returns the Seq of a message Put of CreateTransactWriteItems.
func itemSeq(t testing.TB, it types.TransactWriteItem) int64 {
	t.Helper()
	require.NotNil(t, it.Put)
	sk, ok := it.Put.Item["SK"].(*types.AttributeValueMemberS)
	require.True(t, ok, "a message Put has a string sort key")
	seq, err := strconv.ParseInt(sk.Value, 10, 64)
	require.NoError(t, err)
	return seq
}

// overItem is a message within the store's MaxMessageSize whose item is over what
// the store writes: a thousand headers take more room in the item than their Size
// counts.
func overItem(s *dynamostore.Store) outbox.Message {
	hs := make([]outbox.Header, 1000)
	for i := range hs {
		hs[i] = outbox.Header{Key: "h"}
	}
	return outbox.Message{Topic: "t", Key: []byte("k"), Headers: hs,
		Payload: make([]byte, s.MaxMessageSize()-len("t")-len("k")-len(hs))}
}

// envelopesOf takes the envelopes of a fetched batch.
func envelopesOf(b driver.Batch, err error) ([]*driver.Envelope, error) { return b.Envelopes, err }

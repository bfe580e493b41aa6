package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// envPrefix starts the environment variable of every flag.
const envPrefix = "OUTBOX_"

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

var errHelp = errors.New("help")

// flags is a command's flag set with the store flags every command takes.
func (c *cli) flags(name, args string) *flag.FlagSet {
	fs := flag.NewFlagSet("outboxctl "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.StringVar(&c.store.DSN, "store", "", "the store: postgres://…, mysql://…, sqlite:PATH or dynamodb://TABLE (required)")
	fs.StringVar(&c.store.Table, "table", "", "SQL stores: the messages table; default outbox_messages")
	fs.IntVar(&c.store.Buckets, "buckets", 0, "the store's bucket count; default the count the store records (SQL: its settings table; DynamoDB: its messages and relays), else 8; a count that differs from the recorded one is refused")
	fs.StringVar(&c.store.Region, "aws-region", "", "DynamoDB: the AWS region; default the SDK's (AWS_REGION)")
	fs.StringVar(&c.store.Endpoint, "aws-endpoint", "", "DynamoDB: an endpoint URL instead of AWS's; default none")
	addLogModeFlags(fs, &c.store)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: outboxctl %s -store DSN %s\n\nFlags (each also OUTBOX_ + its name in upper case, '-' as '_'):\n", name, args)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args, then fills unset flags from the environment.
// Flags may come before, between or after the arguments ("show ID -json").
func (c *cli) parse(fs *flag.FlagSet, args []string) error {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return errHelp
			}
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if args[0] == "--" {
			c.pos = append(c.pos, args[1:]...)
			break
		}
		c.pos, args = append(c.pos, args[0]), args[1:]
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := os.LookupEnv(envName(f.Name)); ok && !set[f.Name] && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%w: %s=%q: %v", errUsage, envName(f.Name), v, err)
			}
		}
	})
	return envErr
}

// open connects to the store with the bucket count it records (see
// storeconn.Store.RecordedBucketCount). A -buckets that differs from the recorded
// count is a usage error: a store read with another count shows some of its
// messages as if they were all, and requeues or purges only those.
func (c *cli) open(ctx context.Context) (*openedStore, error) {
	st, err := openStore(ctx, c.store)
	if err != nil {
		return nil, err
	}
	if c.only != nil {
		if err := c.only(st); err != nil {
			_ = st.Close()
			return nil, err
		}
	}
	if c.noLearn {
		return st, nil
	}
	rec, err := st.RecordedBucketCount(ctx)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	switch {
	case rec.Count == 0 && c.store.Buckets != 0:
		c.bucketsFrom = "-buckets; the store records no count"
		return st, nil
	case rec.Count == 0:
		c.bucketsFrom = "the default; the store records no count"
		return st, nil
	case rec.Count == st.BucketCount():
		c.bucketsFrom = "from " + rec.Source
		return st, nil
	}
	_ = st.Close()
	if c.store.Buckets != 0 {
		return nil, fmt.Errorf("%w: -buckets %d: the store has %d buckets (from %s); drop -buckets, and outboxctl reads the count from the store",
			errUsage, c.store.Buckets, rec.Count, rec.Source)
	}
	opts := c.store
	opts.Buckets = rec.Count
	if st, err = openStore(ctx, opts); err != nil {
		return nil, err
	}
	c.bucketsFrom = "from " + rec.Source
	return st, nil
}

// admin returns the store's operator surface.
func admin(st *openedStore) (driver.Admin, error) {
	a, ok := st.Store.(driver.Admin)
	if !ok {
		return nil, fmt.Errorf("the %s store does not implement driver.Admin", st.Kind)
	}
	return a, nil
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// withStore parses, runs check (when not nil: it validates the command's flags and
// arguments before anything connects), opens the store and runs fn.
func (c *cli) withStore(ctx context.Context, fs *flag.FlagSet, args []string, check func() error, fn func(st *openedStore) error) error {
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	st, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	return fn(st)
}

// noArgs is a check that refuses arguments to a command that takes only flags.
func (c *cli) noArgs(name string) func() error {
	return func() error {
		if len(c.pos) > 0 {
			return fmt.Errorf("%w: %s takes no arguments, only flags (%q)", errUsage, name, c.pos[0])
		}
		return nil
	}
}

// statsView is the JSON of stats.
type statsView struct {
	Buckets          int       `json:"buckets"`
	Pending          []int     `json:"pending"`
	PendingTotal     int       `json:"pending_total"`
	PendingLimit     int       `json:"pending_limit"`
	Capped           bool      `json:"capped"`
	Parked           int       `json:"parked"`
	OldestPending    time.Time `json:"oldest_pending,omitzero"`
	OldestPendingAge float64   `json:"oldest_pending_age_seconds"`
	// Stream is the slot lag of a store in the SQL store's log mode; absent otherwise.
	Stream *streamView `json:"stream,omitempty"`
}

// streamView is the JSON of a stream's lag (driver.StreamLag).
type streamView struct {
	LagBytes   int64   `json:"lag_bytes"`
	Active     bool    `json:"active"`
	AgeSeconds float64 `json:"age_seconds"`
}

func newStatsView(st driver.Backlog, now time.Time) statsView {
	v := statsView{Buckets: len(st.Pending), Pending: st.Pending, PendingLimit: st.PendingLimit, Parked: st.Parked, OldestPending: st.OldestPending}
	for _, n := range st.Pending {
		v.PendingTotal += n
		if st.PendingLimit > 0 && n >= st.PendingLimit {
			v.Capped = true
		}
	}
	if !st.OldestPending.IsZero() {
		v.OldestPendingAge = max(now.Sub(st.OldestPending).Seconds(), 0)
	}
	if v.Pending == nil {
		v.Pending = []int{}
	}
	if st.Stream != nil {
		v.Stream = &streamView{LagBytes: st.Stream.Bytes, Active: st.Stream.Active, AgeSeconds: st.Stream.Age.Seconds()}
	}
	return v
}

func cmdStats(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("stats", "[-json]")
	fs.BoolVar(&c.json, "json", false, "print JSON")
	return c.withStore(ctx, fs, args, c.noArgs("stats"), func(st *openedStore) error {
		a, err := admin(st)
		if err != nil {
			return err
		}
		s, err := a.Stats(ctx)
		if err != nil {
			return err
		}
		v := newStatsView(s, time.Now())
		v.Buckets = st.BucketCount()
		if c.json {
			return c.printJSON(v)
		}
		more := ""
		if v.Capped {
			more = fmt.Sprintf(" (at least: a bucket reached the count limit of %d)", v.PendingLimit)
		}
		fmt.Fprintf(c.stdout, "buckets: %d (%s)\npending: %d%s\nparked:  %d\n", v.Buckets, c.bucketsFrom, v.PendingTotal, more, v.Parked)
		if v.OldestPending.IsZero() {
			fmt.Fprintln(c.stdout, "oldest pending: none")
		} else {
			fmt.Fprintf(c.stdout, "oldest pending: %s (%s ago)\n", v.OldestPending.UTC().Format(time.RFC3339), time.Duration(v.OldestPendingAge*float64(time.Second)).Round(time.Second))
		}
		if v.Stream != nil {
			fmt.Fprintf(c.stdout, "stream:  %d bytes behind, reader active: %t, lag %s\n", v.Stream.LagBytes, v.Stream.Active, time.Duration(v.Stream.AgeSeconds*float64(time.Second)).Round(time.Millisecond))
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "BUCKET\tPENDING")
		for b, n := range v.Pending {
			fmt.Fprintf(tw, "%d\t%d\n", b, n)
		}
		return tw.Flush()
	})
}

func parseStatus(s string) (driver.Status, error) {
	switch strings.ToLower(s) {
	case "pending":
		return driver.Pending, nil
	case "parked":
		return driver.Parked, nil
	case "dispatched":
		return driver.Dispatched, nil
	}
	return 0, fmt.Errorf("%w: -status %q: use pending, parked or dispatched", errUsage, s)
}

// filter selects messages.
type filter struct {
	topic  string
	bucket int // -1: any
	// key is a key as messageView shows it (text, or base64 when not UTF-8); "": any.
	key string
}

func (f filter) match(e *driver.Envelope) bool {
	if f.key != "" {
		if k, _ := text(e.Key); e.Key == nil || k != f.key {
			return false
		}
	}
	return (f.topic == "" || e.Topic == f.topic) && (f.bucket < 0 || e.Bucket == f.bucket)
}

// scan pages through the messages with status that match f, calling fn for each,
// until fn returns false or limit (if > 0) matched.
func scan(ctx context.Context, a driver.Admin, status driver.Status, f filter, limit int, fn func(*driver.Envelope) bool) error {
	const page = 500
	var cur driver.Cursor
	if f.bucket >= 0 {
		cur = driver.Cursor{Bucket: f.bucket} // Seqs start at 1
	}
	matched := 0
	for {
		envs, err := a.List(ctx, status, cur, page)
		if err != nil {
			return err
		}
		for _, e := range envs {
			if f.bucket >= 0 && e.Bucket > f.bucket {
				return nil
			}
			if !f.match(e) {
				continue
			}
			matched++
			if !fn(e) || (limit > 0 && matched >= limit) {
				return nil
			}
		}
		if len(envs) < page {
			return nil
		}
		cur = driver.After(envs[len(envs)-1])
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// messageView is the JSON of a message.
type messageView struct {
	ID            string       `json:"id"`
	Topic         string       `json:"topic"`
	Key           *string      `json:"key"`
	KeyBase64     bool         `json:"key_base64,omitempty"`
	Bucket        int          `json:"bucket"`
	Seq           int64        `json:"seq"`
	Status        string       `json:"status"`
	CreatedAt     time.Time    `json:"created_at"`
	Attempts      int          `json:"attempts"`
	NextAttemptAt time.Time    `json:"next_attempt_at,omitzero"`
	LastError     string       `json:"last_error,omitempty"`
	DispatchedAt  time.Time    `json:"dispatched_at,omitzero"`
	Size          int          `json:"size"`
	Headers       []headerView `json:"headers,omitempty"`
	Payload       *string      `json:"payload,omitempty"`
	PayloadBase64 bool         `json:"payload_base64,omitempty"`
}

type headerView struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Base64 bool   `json:"base64,omitempty"`
}

// text renders bytes as text when they are valid UTF-8, else as base64.
func text(b []byte) (string, bool) {
	if utf8.Valid(b) {
		return string(b), false
	}
	return base64.StdEncoding.EncodeToString(b), true
}

func newMessageView(e *driver.Envelope, full bool) messageView {
	v := messageView{ID: e.ID.String(), Topic: e.Topic, Bucket: e.Bucket, Seq: e.Seq, Status: e.Status.String(),
		CreatedAt: e.CreatedAt, Attempts: e.Attempts, NextAttemptAt: e.NextAttemptAt, LastError: e.LastError,
		DispatchedAt: e.DispatchedAt, Size: e.Size()}
	if e.Key != nil {
		k, b64 := text(e.Key)
		v.Key, v.KeyBase64 = &k, b64
	}
	if full {
		for _, h := range e.Headers {
			val, b64 := text(h.Value)
			v.Headers = append(v.Headers, headerView{Key: h.Key, Value: val, Base64: b64})
		}
		if e.Payload != nil {
			p, b64 := text(e.Payload)
			v.Payload, v.PayloadBase64 = &p, b64
		}
	}
	return v
}

func cmdList(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("list", "[-status S] [-topic T] [-bucket N] [-limit N] [-json]")
	status := fs.String("status", "parked", "pending, parked or dispatched")
	topic := fs.String("topic", "", "only this topic")
	bucket := fs.Int("bucket", -1, "only this bucket; -1 for all")
	limit := fs.Int("limit", 100, "at most this many messages; 0 for all")
	fs.BoolVar(&c.json, "json", false, "print JSON, one array")
	var s driver.Status
	check := func() (err error) {
		if err := c.noArgs("list")(); err != nil {
			return err
		}
		if s, err = parseStatus(*status); err != nil {
			return err
		}
		if *limit < 0 {
			return fmt.Errorf("%w: -limit %d: give 0 (every message) or more", errUsage, *limit)
		}
		if *bucket < -1 {
			return fmt.Errorf("%w: -bucket %d: give a bucket number, or -1 for all", errUsage, *bucket)
		}
		return nil
	}
	return c.withStore(ctx, fs, args, check, func(st *openedStore) error {
		if n := st.BucketCount(); *bucket >= n {
			return fmt.Errorf("%w: -bucket %d: the store has %d buckets, 0 to %d (%s)", errUsage, *bucket, n, n-1, c.bucketsFrom)
		}
		a, err := admin(st)
		if err != nil {
			return err
		}
		views := []messageView{}
		err = scan(ctx, a, s, filter{topic: *topic, bucket: *bucket}, *limit, func(e *driver.Envelope) bool {
			views = append(views, newMessageView(e, false))
			return true
		})
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(views)
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTOPIC\tBUCKET\tSEQ\tSTATUS\tATTEMPTS\tCREATED\tLAST ERROR")
		for _, v := range views {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d\t%s\t%s\n", v.ID, v.Topic, v.Bucket, v.Seq, v.Status, v.Attempts,
				v.CreatedAt.UTC().Format(time.RFC3339), oneLine(v.LastError, 80))
		}
		return tw.Flush()
	})
}

// oneLine shortens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// find looks a message up by ID: through driver.Finder when the store has it,
// otherwise by reading every status (the DynamoDB store has no index by ID).
func find(ctx context.Context, st *openedStore, id uuid.UUID) (*driver.Envelope, error) {
	if f, ok := st.Store.(driver.Finder); ok {
		e, err := f.Find(ctx, id)
		if errors.Is(err, driver.ErrNotFound) {
			return nil, fmt.Errorf("%w: no message has ID %s", errNotFound, id)
		}
		return e, err
	}
	a, err := admin(st)
	if err != nil {
		return nil, err
	}
	var found *driver.Envelope
	for _, s := range []driver.Status{driver.Parked, driver.Pending, driver.Dispatched} {
		err := scan(ctx, a, s, filter{bucket: -1}, 0, func(e *driver.Envelope) bool {
			if e.ID == id {
				found = e
				return false
			}
			return true
		})
		if err != nil {
			return nil, err
		}
		if found != nil {
			return found, nil
		}
	}
	return nil, fmt.Errorf("%w: no message has ID %s", errNotFound, id)
}

func cmdShow(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("show", "ID [-json]")
	fs.BoolVar(&c.json, "json", false, "print JSON")
	var id uuid.UUID
	check := func() (err error) {
		if len(c.pos) != 1 {
			return fmt.Errorf("%w: show takes one message ID", errUsage)
		}
		if id, err = uuid.Parse(c.pos[0]); err != nil {
			return fmt.Errorf("%w: %q is not a message ID (a UUID): %v", errUsage, c.pos[0], err)
		}
		return nil
	}
	return c.withStore(ctx, fs, args, check, func(st *openedStore) error {
		e, err := find(ctx, st, id)
		if err != nil {
			return err
		}
		v := newMessageView(e, true)
		if c.json {
			return c.printJSON(v)
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		key := "(none)"
		if v.Key != nil {
			key = *v.Key
		}
		rows := [][2]string{{"id", v.ID}, {"topic", v.Topic}, {"key", key}, {"bucket", fmt.Sprint(v.Bucket)},
			{"seq", fmt.Sprint(v.Seq)}, {"status", v.Status}, {"created", v.CreatedAt.UTC().Format(time.RFC3339Nano)},
			{"attempts", fmt.Sprint(v.Attempts)}, {"size", fmt.Sprint(v.Size)}}
		if !v.NextAttemptAt.IsZero() {
			rows = append(rows, [2]string{"next attempt", v.NextAttemptAt.UTC().Format(time.RFC3339)})
		}
		if v.LastError != "" {
			rows = append(rows, [2]string{"last error", v.LastError})
		}
		for _, h := range v.Headers {
			rows = append(rows, [2]string{"header " + h.Key, h.Value})
		}
		payload := "(tombstone)"
		if v.Payload != nil {
			payload = *v.Payload
			if v.PayloadBase64 {
				payload = "base64:" + payload
			}
		}
		rows = append(rows, [2]string{"payload", payload})
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
		}
		return tw.Flush()
	})
}

// selection is what requeue and purge act on.
type selection struct {
	all   bool
	topic string
	ids   []uuid.UUID
}

func (c *cli) selectionFlags(fs *flag.FlagSet) (*bool, *string, *bool, *bool) {
	all := fs.Bool("all", false, "every parked message")
	topic := fs.String("topic", "", "every parked message of this topic")
	dry := fs.Bool("dry-run", false, "report what would change, change nothing")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	return all, topic, dry, quiet
}

func parseSelection(pos []string, all bool, topic string) (selection, error) {
	sel := selection{all: all, topic: topic}
	for _, a := range pos {
		id, err := uuid.Parse(a)
		if err != nil {
			return sel, fmt.Errorf("%w: %q is not a message ID (a UUID): %v", errUsage, a, err)
		}
		sel.ids = append(sel.ids, id)
	}
	n := 0
	for _, b := range []bool{all, topic != "", len(sel.ids) > 0} {
		if b {
			n++
		}
	}
	if n != 1 {
		return sel, fmt.Errorf("%w: name what to act on: -all, -topic T, or message IDs (exactly one of them)", errUsage)
	}
	return sel, nil
}

// batchSize is how many IDs one Requeue or Purge call carries.
const batchSize = 100

// apply runs op on the selection in batches and reports progress. A run cut short
// (ctx ended) returns errInterrupted after the batch in flight; running it again
// finishes the rest, since requeued and purged messages are no longer parked.
func (c *cli) apply(ctx context.Context, a driver.Admin, verb string, sel selection, dry, quiet bool,
	op func(ctx context.Context, ids ...uuid.UUID) (int, error)) error {
	ids := sel.ids
	if len(ids) == 0 {
		err := scan(ctx, a, driver.Parked, filter{topic: sel.topic, bucket: -1}, 0, func(e *driver.Envelope) bool {
			ids = append(ids, e.ID)
			return true
		})
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%w before anything changed", errInterrupted)
			}
			return err
		}
	}
	if dry {
		what := "parked messages"
		if len(sel.ids) > 0 {
			what = "messages named (those not parked are skipped)"
			if verb == "purged" {
				what = "messages named (those that exist are deleted)"
			}
		}
		fmt.Fprintf(c.stdout, "dry run: %d %s would be %s\n", len(ids), what, verb)
		return nil
	}
	done := 0
	progress := newProgress(c.stderr, len(ids), quiet || len(ids) <= batchSize)
	for i := 0; i < len(ids); i += batchSize {
		if ctx.Err() != nil {
			progress.finish()
			fmt.Fprintf(c.stdout, "%s %d of %d\n", verb, done, len(ids))
			return fmt.Errorf("%w after %d of %d; run the same command again to finish", errInterrupted, done, len(ids))
		}
		batch := ids[i:min(i+batchSize, len(ids))]
		// The batch in flight finishes even if an interrupt arrives meanwhile.
		n, err := op(context.WithoutCancel(ctx), batch...)
		done += n
		if err != nil {
			progress.finish()
			fmt.Fprintf(c.stdout, "%s %d of %d\n", verb, done, len(ids))
			return err
		}
		progress.step(i+len(batch), done)
	}
	progress.finish()
	fmt.Fprintf(c.stdout, "%s %d of %d\n", verb, done, len(ids))
	return nil
}

// progress draws a bar on stderr for long runs.
type progress struct {
	w     io.Writer
	total int
	off   bool
}

func newProgress(w io.Writer, total int, off bool) *progress {
	return &progress{w: w, total: total, off: off}
}

func (p *progress) step(seen, done int) {
	if p.off {
		return
	}
	const width = 30
	filled := width * seen / max(p.total, 1)
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d (%d changed)", strings.Repeat("#", filled), strings.Repeat(".", width-filled), seen, p.total, done)
}

func (p *progress) finish() {
	if !p.off {
		fmt.Fprintln(p.w)
	}
}

func cmdRequeue(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("requeue", "(-all | -topic T | ID…) [-dry-run] [-quiet]")
	all, topic, dry, quiet := c.selectionFlags(fs)
	var sel selection
	check := func() (err error) {
		sel, err = parseSelection(c.pos, *all, *topic)
		return err
	}
	return c.withStore(ctx, fs, args, check, func(st *openedStore) error {
		a, err := admin(st)
		if err != nil {
			return err
		}
		return c.apply(ctx, a, "requeued", sel, *dry, *quiet, a.Requeue)
	})
}

func cmdPurge(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("purge", "(-all | -topic T | ID…) [-dry-run] [-quiet]")
	all, topic, dry, quiet := c.selectionFlags(fs)
	var sel selection
	check := func() (err error) {
		sel, err = parseSelection(c.pos, *all, *topic)
		return err
	}
	return c.withStore(ctx, fs, args, check, func(st *openedStore) error {
		a, err := admin(st)
		if err != nil {
			return err
		}
		return c.apply(ctx, a, "purged", sel, *dry, *quiet, a.Purge)
	})
}

// leasesView is the JSON of leases.
type leasesView struct {
	Leases []leaseView `json:"leases"`
	// Stream is the lease of the stream's reader (bucket -1) of a store that has a
	// stream (the SQL store's log mode); absent otherwise.
	Stream *leaseView  `json:"stream,omitempty"`
	Relays []relayView `json:"relays"`
}

type leaseView struct {
	Bucket    int       `json:"bucket"`
	Owner     string    `json:"owner"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	Free      bool      `json:"free"`
}

type relayView struct {
	ID          string    `json:"id"`
	LastSeen    time.Time `json:"last_seen"`
	StoppedAt   time.Time `json:"stopped_at,omitzero"`
	BucketCount int       `json:"bucket_count"`
	Owned       int       `json:"owned"`
	// Instance is the process (host/pid/nonce) that wrote the last heartbeat.
	Instance string `json:"instance,omitempty"`
}

func newLeasesView(view driver.Coordination, buckets int, now time.Time) leasesView {
	v := leasesView{Leases: []leaseView{}, Relays: []relayView{}}
	byBucket := map[int]driver.Lease{}
	for _, l := range view.Leases {
		byBucket[l.Bucket] = l
	}
	owned := map[string]int{}
	for b := range buckets {
		l := byBucket[b]
		free := l.Free(now)
		if !free {
			owned[l.Owner]++
		}
		v.Leases = append(v.Leases, leaseView{Bucket: b, Owner: l.Owner, ExpiresAt: l.ExpiresAt, Free: free})
	}
	for _, r := range view.Relays {
		rv := relayView{ID: r.ID, LastSeen: r.LastSeen, StoppedAt: r.StoppedAt, BucketCount: r.BucketCount, Owned: owned[r.ID]}
		if !r.Instance.IsZero() {
			rv.Instance = r.Instance.String()
		}
		v.Relays = append(v.Relays, rv)
	}
	return v
}

// readLeases reads the leases and relays, and the stream lease of a store that has a
// stream (driver.StreamLease, which ReadCoordination leaves out).
func readLeases(ctx context.Context, st *openedStore, now time.Time) (leasesView, driver.Coordination, error) {
	view, err := st.ReadCoordination(ctx)
	if err != nil {
		return leasesView{}, view, err
	}
	v := newLeasesView(view, st.BucketCount(), now)
	if _, ok := st.Store.(driver.Streamer); ok {
		l, _, err := st.StreamLease(ctx)
		if err != nil {
			return v, view, err
		}
		v.Stream = &leaseView{Bucket: driver.StreamLease, Owner: l.Owner, ExpiresAt: l.ExpiresAt, Free: l.Free(now)}
	}
	return v, view, nil
}

func cmdLeases(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("leases", "[-json]")
	fs.BoolVar(&c.json, "json", false, "print JSON")
	return c.withStore(ctx, fs, args, c.noArgs("leases"), func(st *openedStore) error {
		now := time.Now()
		v, _, err := readLeases(ctx, st, now)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(v)
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "BUCKET\tOWNER\tEXPIRES")
		row := func(name string, l leaseView) {
			owner, exp := l.Owner, "-"
			if l.Free {
				owner = "(free)"
			} else {
				exp = fmt.Sprintf("%s (in %s)", l.ExpiresAt.UTC().Format(time.RFC3339), l.ExpiresAt.Sub(now).Round(time.Second))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", name, owner, exp)
		}
		for _, l := range v.Leases {
			row(fmt.Sprint(l.Bucket), l)
		}
		if v.Stream != nil {
			row("stream", *v.Stream) // the reader of the log mode's slot
		}
		fmt.Fprintln(tw, "\nRELAY\tLAST SEEN\tSTATE\tBUCKETS\tINSTANCE")
		for _, r := range v.Relays {
			state := "active"
			switch {
			case !r.StoppedAt.IsZero():
				state = "stopped " + r.StoppedAt.UTC().Format(time.RFC3339)
			case now.Sub(r.LastSeen) > time.Minute:
				state = "silent"
			}
			instance := r.Instance
			if instance == "" {
				instance = "-" // written by an older version
			}
			fmt.Fprintf(tw, "%s\t%s (%s ago)\t%s\t%d\t%s\n", r.ID, r.LastSeen.UTC().Format(time.RFC3339), now.Sub(r.LastSeen).Round(time.Second), state, r.Owned, instance)
		}
		return tw.Flush()
	})
}

func cmdMigrate(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("migrate", "[-status] [-log-mode]")
	status := fs.Bool("status", false, "change nothing: list the migrations applied to the tables, when, and any this outboxctl would apply")
	c.only = sqlOnly("migrate")
	return c.withStore(ctx, fs, args, c.noArgs("migrate"), func(st *openedStore) error {
		if *status {
			return c.migrationStatus(ctx, st)
		}
		if err := st.SQL.Migrate(ctx); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "migrated: the %s tables are up to date\n", st.Kind)
		if cfg := st.SQL.Config(); cfg.Mode == sqlstore.LogMode {
			fmt.Fprintf(c.stdout, "log mode: the publication %s and the replication slot %s exist\n", cfg.Publication, cfg.Slot)
		}
		return nil
	})
}

// migrationStatus prints the versions applied to the store's tables and those this
// program knows but the tables lack.
func (c *cli) migrationStatus(ctx context.Context, st *openedStore) error {
	applied, err := st.Migrations(ctx)
	if err != nil {
		return err
	}
	known := st.SQL.MigrationVersions()
	done := map[int]bool{}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tAPPLIED")
	for _, m := range applied {
		done[m.Version] = true
		fmt.Fprintf(tw, "%d\t%s\n", m.Version, m.AppliedAt.UTC().Format(time.RFC3339))
	}
	var missing []string
	for _, v := range known {
		if !done[v] {
			missing = append(missing, fmt.Sprint(v))
			fmt.Fprintf(tw, "%d\t(not applied)\n", v)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case len(applied) == 0:
		fmt.Fprintf(c.stdout, "the %s tables were never migrated: run outboxctl migrate\n", st.Kind)
	case len(missing) > 0:
		fmt.Fprintf(c.stdout, "behind: version %s not applied: run outboxctl migrate\n", strings.Join(missing, ", "))
	default:
		fmt.Fprintln(c.stdout, "up to date")
	}
	return nil
}

// sqlOnly refuses a store that is not a SQL store, for the command name.
func sqlOnly(name string) func(*openedStore) error {
	return func(st *openedStore) error {
		if st.SQL == nil {
			return fmt.Errorf("%w: %s is for SQL stores; for DynamoDB run create-table", errUsage, name)
		}
		return nil
	}
}

func cmdDropLog(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("drop-log", "-yes [-slot S] [-publication P]")
	yes := fs.Bool("yes", false, "confirm the drop: the messages in the log that no relay has read yet are lost with the slot")
	c.noLearn = true // nothing here depends on the bucket count
	c.only = func(st *openedStore) error {
		if st.Kind != "postgres" {
			return fmt.Errorf("%w: drop-log is for PostgreSQL stores, the only ones with a log mode", errUsage)
		}
		return nil
	}
	check := func() error {
		if err := c.noArgs("drop-log")(); err != nil {
			return err
		}
		if !*yes {
			return fmt.Errorf("%w: drop-log drops the log mode's replication slot and publication, and the messages in the log that no relay has read yet are lost with them: pass -yes to confirm", errUsage)
		}
		// The log mode's names, -slot and -publication included, whether or not the
		// writers still run in it (a store switched back to the table mode).
		if isPostgres(c.store.DSN) {
			c.store.LogMode = true
		}
		return nil
	}
	return c.withStore(ctx, fs, args, check, func(st *openedStore) error {
		cfg := st.SQL.Config()
		if err := st.SQL.DropLog(ctx); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "dropped the replication slot %s and the publication %s (if they existed): the server keeps no write-ahead log for them; outboxctl migrate -log-mode creates them again\n", cfg.Slot, cfg.Publication)
		return nil
	})
}

func cmdDDL(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("ddl", "")
	c.only = sqlOnly("ddl")
	return c.withStore(ctx, fs, args, c.noArgs("ddl"), func(st *openedStore) error {
		for _, s := range st.SQL.DDL() {
			fmt.Fprintf(c.stdout, "%s;\n\n", s)
		}
		return nil
	})
}

func cmdCreateTable(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("create-table", "")
	c.noLearn = true // the table may not exist yet
	c.only = func(st *openedStore) error {
		if st.Dynamo == nil {
			return fmt.Errorf("%w: create-table is for DynamoDB; for SQL stores run migrate", errUsage)
		}
		return nil
	}
	return c.withStore(ctx, fs, args, c.noArgs("create-table"), func(st *openedStore) error {
		if err := dynamoCreateTable(ctx, st); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "table %s is ready\n", st.DDBConfig.TableName)
		return nil
	})
}

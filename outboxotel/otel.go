package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
)

// Defaults.
const (
	DefaultPrefix     = "outbox"
	DefaultMaxTopics  = 100
	DefaultBacklogTTL = 90 * time.Second
	// OtherTopic is the destination name reported for topics beyond MaxTopics.
	OtherTopic = "_OTHER"
	// ScopeName is the instrumentation scope of every instrument.
	ScopeName = "github.com/outboxkit/outbox/outboxotel"
)

// Config configures an [Observer]. The zero value is valid.
type Config struct {
	// MeterProvider creates the instruments. Defaults to otel.GetMeterProvider(), a
	// no-op until the application installs an SDK provider.
	MeterProvider metric.MeterProvider
	// Prefix starts the names of the instruments that no semantic convention
	// names: letters, digits, '.' and '_'. Defaults to "outbox".
	Prefix string
	// MessagingSystem is the messaging.system attribute ("kafka", "aws_sqs",
	// "rabbitmq", ...). Defaults to "": the attribute is left out.
	MessagingSystem string
	// RelayID, when set, is the outbox.relay.id attribute of the owned-buckets
	// gauge. Defaults to "": left out (the resource names the process).
	RelayID string
	// MaxTopics bounds the distinct messaging.destination.name values; topics seen
	// after that many are reported as OtherTopic. Defaults to 100.
	MaxTopics int
	// BacklogTTL is how long after its last backlog sample a relay keeps reporting
	// the backlog gauges: a relay that lost bucket 0 stops sampling, and its stale
	// figures must not sit beside the new holder's. Set it above the relay's
	// BacklogInterval plus its LeaseRenewInterval. Defaults to 90 s.
	BacklogTTL time.Duration
	// TracerProvider, when set, records a producer span per message and publish
	// call ("send TOPIC"), continuing the trace context captured with the message
	// (the headers that middleware/tracecontext stamps at Send). Pass
	// otel.GetTracerProvider() to use the global one. Defaults to nil: no spans.
	TracerProvider trace.TracerProvider
	// Propagator reads the captured trace context from a message's headers.
	// Defaults to propagation.TraceContext{} (W3C traceparent and tracestate).
	Propagator propagation.TextMapPropagator
	// Now is the clock, for tests. Defaults to time.Now.
	Now func() time.Time
}

var prefixPattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.]*$`)

func (c Config) withDefaults() Config {
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.MaxTopics == 0 {
		c.MaxTopics = DefaultMaxTopics
	}
	if c.BacklogTTL == 0 {
		c.BacklogTTL = DefaultBacklogTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first setting that cannot work, as an error wrapping
// [outbox.ErrMisconfigured] that names the field.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case !prefixPattern.MatchString(c.Prefix):
		return fmt.Errorf("%w: outboxotel: Config.Prefix %q must start with a letter and hold only letters, digits, '.' and '_'", outbox.ErrMisconfigured, c.Prefix)
	case c.MaxTopics < 1:
		return fmt.Errorf("%w: outboxotel: Config.MaxTopics is %d; it must be at least 1 (0 selects %d)", outbox.ErrMisconfigured, c.MaxTopics, DefaultMaxTopics)
	case c.BacklogTTL < 0:
		return fmt.Errorf("%w: outboxotel: Config.BacklogTTL is %s; it must be positive (0 selects %s)", outbox.ErrMisconfigured, c.BacklogTTL, DefaultBacklogTTL)
	}
	return nil
}

// Observer turns a relay's measurements into OpenTelemetry instruments. It
// implements [relay.Observer]; one Observer serves one relay (its gauges
// hold that relay's figures). Build it with [New].
type Observer struct {
	cfg   Config
	trace *tracing // nil: no spans

	sent, completed, retried, parked, deleted, refused, rounds, clashes metric.Int64Counter
	duration, lag                                                       metric.Float64Histogram
	reg                                                                 metric.Registration

	base   attribute.Set // messaging.system, if set
	topics sync.Map      // topic -> *topicAttrs
	mu     sync.Mutex    // guards nTopics and the gauge state below
	// nTopics counts the distinct topics given their own attributes.
	nTopics int
	owned   int64
	ownedOK bool
	sample  driver.Backlog
	at      time.Time
}

// topicAttrs are the attribute sets of one topic, built once.
type topicAttrs struct {
	plain metric.MeasurementOption
	// send is the publish call's set (messaging.operation.name and type "send"), and
	// with error.type.
	send, sendPermanent, sendTransient, sendTimeout metric.MeasurementOption
	// The option slices passed on the hot path, built once so a measurement
	// allocates nothing.
	addPlain                            []metric.AddOption
	addSent, addPermanent, addTransient []metric.AddOption
	recPlain                            []metric.RecordOption
}

// sendOf returns the send set for a call or message outcome of error type typ.
func (a *topicAttrs) sendOf(typ string) metric.MeasurementOption {
	switch typ {
	case "permanent":
		return a.sendPermanent
	case "transient":
		return a.sendTransient
	case "timeout":
		return a.sendTimeout
	}
	return a.send
}

// Lag and duration histogram boundaries, in seconds.
var (
	durationBounds = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	lagBounds      = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
)

// New builds an Observer and registers its instruments with cfg.MeterProvider. It
// fails, with an error wrapping [outbox.ErrMisconfigured], for settings
// [Config.Validate] refuses, or if the provider refuses an instrument.
func New(cfg Config) (*Observer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m := cfg.MeterProvider.Meter(ScopeName)
	o := &Observer{cfg: cfg, trace: newTracing(cfg)}
	if cfg.MessagingSystem != "" {
		o.base = attribute.NewSet(attribute.String("messaging.system", cfg.MessagingSystem))
	}
	p := cfg.Prefix + "."
	var err error
	counter := func(name, unit, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return c
	}
	o.sent = counter("messaging.client.sent.messages", "{message}", "Messages the relay handed to the broker; error.type is set on those that failed.")
	o.completed = counter(p+"messages.completed", "{message}", "Messages the broker acknowledged and the store then forgot (deleted, or marked dispatched).")
	o.retried = counter(p+"messages.retried", "{message}", "Messages rescheduled with backoff after a failed attempt.")
	o.parked = counter(p+"messages.parked", "{message}", "Messages parked: a permanent failure, or out of attempts.")
	o.deleted = counter(p+"messages.deleted", "{message}", "Dispatched messages deleted by retention cleanup.")
	o.refused = counter(p+"lease.refused_writes", "{write}", "Conditional lease and heartbeat writes the store refused; a healthy fleet in steady state refuses none.")
	o.rounds = counter(p+"coordination.rounds", "{round}", "Coordination rounds of the worker; error.type is set on failed ones.")
	o.clashes = counter(p+"relay.instance_clashes", "{heartbeat}", "Heartbeats of another live process found under this relay's ID: two processes share one relay ID; a healthy fleet has none.")
	if err != nil {
		return nil, fmt.Errorf("%w: outboxotel: %w", outbox.ErrMisconfigured, err)
	}
	if o.duration, err = m.Float64Histogram("messaging.client.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one publish call to the broker (one batch)."),
		metric.WithExplicitBucketBoundaries(durationBounds...)); err != nil {
		return nil, fmt.Errorf("%w: outboxotel: %w", outbox.ErrMisconfigured, err)
	}
	if o.lag, err = m.Float64Histogram(p+"message.lag", metric.WithUnit("s"),
		metric.WithDescription("Time from capture (the message's CreatedAt) to the broker's acknowledgement."),
		metric.WithExplicitBucketBoundaries(lagBounds...)); err != nil {
		return nil, fmt.Errorf("%w: outboxotel: %w", outbox.ErrMisconfigured, err)
	}
	owned, err1 := m.Int64ObservableGauge(p+"relay.owned_buckets", metric.WithUnit("{bucket}"),
		metric.WithDescription("Buckets this relay may publish from, as of its last coordination round."))
	pending, err2 := m.Int64ObservableGauge(p+"backlog.pending", metric.WithUnit("{message}"),
		metric.WithDescription("Pending messages per bucket at the last backlog sample, capped per bucket by the store."))
	oldest, err3 := m.Float64ObservableGauge(p+"backlog.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest pending message at the last backlog sample; 0 when none is pending."))
	parkedNow, err4 := m.Int64ObservableGauge(p+"backlog.parked", metric.WithUnit("{message}"),
		metric.WithDescription("Parked messages at the last backlog sample."))
	// The stream's gauges, for a store that has one (the SQL store's log mode).
	streamBytes, err5 := m.Int64ObservableGauge(p+"stream.lag.bytes", metric.WithUnit("By"),
		metric.WithDescription("How much of the stream the store keeps for its reader at the last backlog sample (PostgreSQL: the write-ahead log between the slot's confirmed position and the current one)."))
	streamAge, err6 := m.Float64ObservableGauge(p+"stream.lag.age", metric.WithUnit("s"),
		metric.WithDescription("How long ago the stream's reader last confirmed what was written, at the last backlog sample (PostgreSQL: the slot's flush lag); 0 when unknown or idle."))
	streamActive, err7 := m.Int64ObservableGauge(p+"stream.active", metric.WithUnit("{reader}"),
		metric.WithDescription("1 when a reader had the stream open at the last backlog sample, else 0."))
	for _, e := range []error{err1, err2, err3, err4, err5, err6, err7} {
		if e != nil {
			return nil, fmt.Errorf("%w: outboxotel: %w", outbox.ErrMisconfigured, e)
		}
	}
	var relayOpt metric.ObserveOption = metric.WithAttributeSet(o.base)
	if cfg.RelayID != "" {
		relayOpt = metric.WithAttributes(append(o.base.ToSlice(), attribute.String("outbox.relay.id", cfg.RelayID))...)
	}
	baseOpt := metric.WithAttributeSet(o.base)
	o.reg, err = m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.ownedOK {
			obs.ObserveInt64(owned, o.owned, relayOpt)
		}
		if o.at.IsZero() || o.cfg.Now().Sub(o.at) > o.cfg.BacklogTTL {
			return nil
		}
		for b, n := range o.sample.Pending {
			obs.ObserveInt64(pending, int64(n), metric.WithAttributes(append(o.base.ToSlice(), attribute.Int("outbox.bucket", b))...))
		}
		age := 0.0
		if !o.sample.OldestPending.IsZero() {
			age = max(o.at.Sub(o.sample.OldestPending).Seconds(), 0)
		}
		obs.ObserveFloat64(oldest, age, baseOpt)
		obs.ObserveInt64(parkedNow, int64(o.sample.Parked), baseOpt)
		if s := o.sample.Stream; s != nil {
			active := int64(0)
			if s.Active {
				active = 1
			}
			obs.ObserveInt64(streamBytes, s.Bytes, baseOpt)
			obs.ObserveFloat64(streamAge, s.Age.Seconds(), baseOpt)
			obs.ObserveInt64(streamActive, active, baseOpt)
		}
		return nil
	}, owned, pending, oldest, parkedNow, streamBytes, streamAge, streamActive)
	if err != nil {
		return nil, fmt.Errorf("%w: outboxotel: %w", outbox.ErrMisconfigured, err)
	}
	// Counters of rare events exist at zero from the start, so alerts can be written
	// against them before the first event.
	ctx := context.Background()
	o.deleted.Add(ctx, 0, metric.WithAttributeSet(o.base))
	o.clashes.Add(ctx, 0, metric.WithAttributeSet(o.base))
	for _, op := range refusableWrites {
		o.refused.Add(ctx, 0, metric.WithAttributeSet(o.base), metric.WithAttributes(attribute.String("outbox.lease.operation", op)))
	}
	return o, nil
}

// refusableWrites are the conditional writes [relay.Observer.RefusedWrite] names.
var refusableWrites = []string{"heartbeat", "claim", "renew", "release", "delete_relay"}

// Close unregisters the gauges' callback. Counters and histograms stay with the
// provider.
func (o *Observer) Close() error { return o.reg.Unregister() }

var _ relay.Observer = (*Observer)(nil)

// attrs returns topic's attribute sets, bounded by MaxTopics: the first MaxTopics
// distinct topics get their own, every later one shares OtherTopic's.
func (o *Observer) attrs(topic string) *topicAttrs {
	if a, ok := o.topics.Load(topic); ok {
		return a.(*topicAttrs)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if a, ok := o.topics.Load(topic); ok { // created meanwhile
		return a.(*topicAttrs)
	}
	name := topic
	if o.nTopics >= o.cfg.MaxTopics {
		name = OtherTopic
		// Topics beyond the bound are not remembered (their number is not bounded):
		// each of their measurements takes the lock once.
		if a, ok := o.topics.Load(OtherTopic); ok {
			return a.(*topicAttrs)
		}
	} else {
		o.nTopics++
	}
	base := o.base.ToSlice()
	set := func(extra ...attribute.KeyValue) metric.MeasurementOption {
		kv := append(append([]attribute.KeyValue(nil), base...), attribute.String("messaging.destination.name", name))
		return metric.WithAttributeSet(attribute.NewSet(append(kv, extra...)...))
	}
	op := []attribute.KeyValue{attribute.String("messaging.operation.name", "send"), attribute.String("messaging.operation.type", "send")}
	sendWith := func(typ string) metric.MeasurementOption {
		return set(append(slices.Clone(op), attribute.String("error.type", typ))...)
	}
	a := &topicAttrs{
		plain:         set(),
		send:          set(op...),
		sendPermanent: sendWith("permanent"),
		sendTransient: sendWith("transient"),
		sendTimeout:   sendWith("timeout"),
	}
	a.addPlain = []metric.AddOption{a.plain}
	a.addSent, a.addPermanent, a.addTransient = []metric.AddOption{a.send}, []metric.AddOption{a.sendPermanent}, []metric.AddOption{a.sendTransient}
	a.recPlain = []metric.RecordOption{a.plain}
	o.topics.Store(name, a)
	return a
}

// Published implements [relay.Observer]: each message sent, labelled with its own
// outcome; the call's duration, once per topic the call carried, labelled with that
// topic's first failure; and each acknowledged message's lag.
func (o *Observer) Published(ctx context.Context, batch, acked []*driver.Envelope, start time.Time, took time.Duration, err error) {
	if o.trace != nil {
		o.trace.published(ctx, batch, acked, start, took, err)
	}
	ackAt := start.Add(took)
	for _, e := range acked {
		a := o.attrs(e.Topic)
		o.sent.Add(ctx, 1, a.addSent...)
		if !e.CreatedAt.IsZero() {
			o.lag.Record(ctx, max(ackAt.Sub(e.CreatedAt).Seconds(), 0), a.recPlain...)
		}
	}
	var failed map[[16]byte]error
	if len(acked) < len(batch) {
		failed = failures(batch, acked, err)
		for _, e := range batch {
			cause, bad := failed[e.ID]
			if !bad {
				continue
			}
			a := o.attrs(e.Topic)
			if driver.IsPermanent(cause) {
				o.sent.Add(ctx, 1, a.addPermanent...)
			} else {
				o.sent.Add(ctx, 1, a.addTransient...)
			}
		}
	}
	if len(batch) == 0 {
		o.duration.Record(ctx, took.Seconds(), metric.WithAttributeSet(o.base))
		return
	}
	// Per topic: the first failure among its messages, if any.
	outcome := make(map[string]string, 1)
	var topics []string
	for _, e := range batch {
		typ, seen := outcome[e.Topic]
		if !seen {
			topics = append(topics, e.Topic)
		}
		if cause, bad := failed[e.ID]; bad && typ == "" {
			typ = errorType(cause)
		}
		outcome[e.Topic] = typ
	}
	for _, topic := range topics {
		o.duration.Record(ctx, took.Seconds(), o.attrs(topic).sendOf(outcome[topic]))
	}
}

// failures maps each message of batch that was not acknowledged to its cause: its
// own error in a [driver.PublishError], else the call's error.
func failures(batch, acked []*driver.Envelope, err error) map[[16]byte]error {
	failed := make(map[[16]byte]error, len(batch)-len(acked))
	if err == nil {
		err = errors.New("not acknowledged")
	}
	ackedIDs := make(map[[16]byte]bool, len(acked))
	for _, e := range acked {
		ackedIDs[e.ID] = true
	}
	for _, e := range batch {
		if !ackedIDs[e.ID] {
			failed[e.ID] = err
		}
	}
	if pe, ok := errors.AsType[*driver.PublishError](err); ok {
		for _, f := range pe.Failed {
			if _, bad := failed[f.ID]; bad {
				failed[f.ID] = f.Err
			}
		}
	}
	return failed
}

func errorType(err error) string {
	switch {
	case err == nil:
		return ""
	case driver.IsPermanent(err):
		return "permanent"
	case ctxErr(err):
		return "timeout"
	}
	return "transient"
}

func ctxErr(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// Completed implements [relay.Observer].
func (o *Observer) Completed(ctx context.Context, envs []*driver.Envelope) {
	for _, e := range envs {
		o.completed.Add(ctx, 1, o.attrs(e.Topic).addPlain...)
	}
}

// Retried implements [relay.Observer].
func (o *Observer) Retried(ctx context.Context, env *driver.Envelope, _ int, _ string) {
	o.retried.Add(ctx, 1, o.attrs(env.Topic).plain)
}

// Parked implements [relay.Observer].
func (o *Observer) Parked(ctx context.Context, env *driver.Envelope, permanent bool, _ string) {
	reason := "attempts"
	if permanent {
		reason = "permanent"
	}
	o.parked.Add(ctx, 1, o.attrs(env.Topic).plain, metric.WithAttributes(attribute.String("outbox.park.reason", reason)))
}

// RetentionDeleted implements [relay.Observer].
func (o *Observer) RetentionDeleted(ctx context.Context, n int) {
	o.deleted.Add(ctx, int64(n), metric.WithAttributeSet(o.base))
}

// RefusedWrite implements [relay.Observer].
func (o *Observer) RefusedWrite(ctx context.Context, op string) {
	o.refused.Add(ctx, 1, metric.WithAttributeSet(o.base), metric.WithAttributes(attribute.String("outbox.lease.operation", op)))
}

// InstanceClash implements [relay.Observer]. The instances are not attributes: their
// nonces would make a new series per process.
func (o *Observer) InstanceClash(ctx context.Context, _, _ driver.Instance) {
	o.clashes.Add(ctx, 1, metric.WithAttributeSet(o.base))
}

// Round implements [relay.Observer].
func (o *Observer) Round(ctx context.Context, owned int, _ bool, err error) {
	if err != nil {
		o.rounds.Add(ctx, 1, metric.WithAttributeSet(o.base), metric.WithAttributes(attribute.String("error.type", "store")))
		return
	}
	o.rounds.Add(ctx, 1, metric.WithAttributeSet(o.base))
	o.mu.Lock()
	o.owned, o.ownedOK = int64(owned), true
	o.mu.Unlock()
}

// Backlog implements [relay.Observer].
func (o *Observer) Backlog(_ context.Context, sample driver.Backlog, at time.Time) {
	o.mu.Lock()
	o.sample, o.at = sample, at
	o.mu.Unlock()
}

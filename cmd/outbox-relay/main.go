// Command outbox-relay is a production relay process: it drains an outbox store to a
// broker with a relay (package relay), serves health, readiness and Prometheus metrics, logs
// JSON through log/slog, and on SIGTERM (or SIGINT) stops gracefully, handing its
// bucket leases back so that its peers take over at once. It then closes the
// transport, which waits (within -stop-timeout) for the Kafka produce calls the
// relay left in flight, and only then the broker client.
//
//	outbox-relay -store postgres://app@db/app -kafka-brokers kafka-1:9092,kafka-2:9092
//
// With -log-mode it relays a PostgreSQL store in the SQL store's log mode: one relay
// of the fleet, the one holding the stream lease, reads the messages from the
// replication slot (-slot, -publication, -replication-url), and moves what the broker
// keeps refusing for -stream-retry-budget into the table, which every relay drains.
//
//	outbox-relay -store postgres://relay@db/app -log-mode -kafka-brokers kafka-1:9092
//
// Every flag can also be set through an environment variable: OUTBOX_ and the flag's
// name in upper case with '-' as '_' (-kafka-brokers is OUTBOX_KAFKA_BROKERS). A flag
// on the command line wins over the variable. Run with -help for every flag.
//
// Endpoints (on -listen, 127.0.0.1:9090 by default):
//
//	/healthz  200 while the worker runs; 503 with the reason once it stopped on its own
//	/readyz   200 once the relay holds its fair share of the buckets, or is a standby in
//	          a valid plan (relay.Relay.Ready); 503 otherwise
//	/metrics  Prometheus exposition of the outboxotel instruments and the Go runtime's
//
// The metrics carry an OpenTelemetry resource (target_info on /metrics) whose
// service.name is -service-name, else OTEL_SERVICE_NAME, else the service.name in
// OTEL_RESOURCE_ATTRIBUTES, else outbox-relay; OTEL_RESOURCE_ATTRIBUTES adds its
// other attributes.
//
// Exit codes, the same rule as outboxctl's:
//
//	0  stopped gracefully (SIGTERM or SIGINT)
//	1  the relay could not start for a cause outside its flags (the store or the
//	   broker cannot be reached), or its worker stopped on its own
//	2  bad usage or input: an unknown flag or an argument, a flag value that cannot be
//	   parsed or used (-batch-size 0, an unparsable -store, a -table that is no table
//	   name), flags that contradict each other or the store (-kafka-ack-timeout
//	   longer than a lease, tables migrated for another -buckets, tables that were
//	   never migrated, -log-mode on a server without wal_level=logical or without
//	   the slot); the message names the flag
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	outboxotel "github.com/outboxkit/outbox/outboxotel"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/transport/kafkatransport"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// options are the relay's flags.
type options struct {
	store                storeOptions
	migrate              bool
	kafkaBrokers         string
	sqs                  bool
	listen               string
	relayID              string
	batchSize            int
	pollInterval         time.Duration
	leaseDuration        time.Duration
	leaseRenewInterval   time.Duration
	maxAttempts          int
	backoffBase          time.Duration
	backoffMax           time.Duration
	retention            time.Duration
	maxConcurrency       int
	backlogInterval      time.Duration
	stopTimeout          time.Duration
	logLevel             string
	metricsPrefix        string
	unordered            bool
	kafkaAllowAutoCreate bool
	kafkaAckTimeout      time.Duration
	serviceName          string
	streamRetryBudget    time.Duration
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stderr))
}

// envPrefix starts the environment variable of every flag.
const envPrefix = "OUTBOX_"

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("outbox-relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.store.DSN, "store", "", "the store: postgres://USER@HOST/DB?sslmode=…, mysql://USER@tcp(HOST:3306)/DB?parseTime=true, sqlite:PATH, or dynamodb://TABLE (required)")
	fs.StringVar(&o.store.Table, "table", "", "SQL stores: the messages table (the lease and relay tables are named after it); default outbox_messages")
	fs.IntVar(&o.store.Buckets, "buckets", 0, "the store's bucket count; it must equal every writer's, and SQL tables migrated for another count refuse the relay (exit 2); default 8")
	fs.StringVar(&o.store.Region, "aws-region", "", "DynamoDB and SQS: the AWS region; default the SDK's (AWS_REGION, shared config)")
	fs.StringVar(&o.store.Endpoint, "aws-endpoint", "", "DynamoDB and SQS: an endpoint URL instead of AWS's (a local emulator); default none")
	addLogModeFlags(fs, &o.store)
	fs.DurationVar(&o.streamRetryBudget, "stream-retry-budget", 0, "with -log-mode: how long the stream's reader retries a failed publish in place before it moves the message, and its key's later ones, into the table; default 3s, or half of -lease-duration minus -lease-renew-interval if that is shorter")
	fs.BoolVar(&o.migrate, "migrate", false, "apply the SQL migrations (with -log-mode: and create the publication and the slot), or create the DynamoDB table, before starting; default false")
	fs.StringVar(&o.kafkaBrokers, "kafka-brokers", "", "publish to Kafka through these seed brokers, comma-separated HOST:PORT (one of -kafka-brokers and -sqs is required)")
	fs.BoolVar(&o.kafkaAllowAutoCreate, "kafka-allow-auto-create", false, "Kafka: let the broker create a missing topic on first publish; default false (a missing topic is retried, then parked)")
	fs.DurationVar(&o.kafkaAckTimeout, "kafka-ack-timeout", kafkatransport.DefaultAckTimeout, "Kafka: the longest one publish waits for the brokers' acknowledgements (halfway, what was not sent yet is withdrawn); it must be under -lease-duration minus -lease-renew-interval")
	fs.BoolVar(&o.sqs, "sqs", false, "publish to SQS: each topic is a queue name, looked up once; default false")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:9090", "address of the /healthz, /readyz and /metrics endpoints; empty turns them off")
	fs.StringVar(&o.relayID, "relay-id", "", "this relay's id in leases and heartbeats, unique among live relays; default the host name and a random suffix")
	fs.IntVar(&o.batchSize, "batch-size", relay.DefaultBatchSize, "most messages fetched from a bucket and published in one call")
	fs.DurationVar(&o.pollInterval, "poll-interval", relay.DefaultPollInterval, "how often to look for due messages without a wake-up")
	fs.DurationVar(&o.leaseDuration, "lease-duration", relay.DefaultLeaseDuration, "how long a bucket lease and a heartbeat stay valid; a crashed relay's buckets move this long after its last renewal")
	fs.DurationVar(&o.leaseRenewInterval, "lease-renew-interval", relay.DefaultLeaseRenewInterval, "how often to heartbeat, re-plan and renew leases; at most a third of -lease-duration")
	fs.IntVar(&o.maxAttempts, "max-attempts", relay.DefaultMaxAttempts, "failed attempts that park a message")
	fs.DurationVar(&o.backoffBase, "backoff-base", relay.DefaultBackoffBase, "delay after the first failure, doubled per further failure")
	fs.DurationVar(&o.backoffMax, "backoff-max", relay.DefaultBackoffMax, "cap of the retry delay")
	fs.DurationVar(&o.retention, "retention", 0, "keep dispatched messages this long (SQL stores); 0 deletes them once acknowledged")
	fs.IntVar(&o.maxConcurrency, "max-concurrency", relay.DefaultMaxConcurrency, "buckets drained in parallel")
	fs.DurationVar(&o.backlogInterval, "backlog-interval", relay.DefaultBacklogInterval, "how often the relay holding bucket 0 samples the backlog for the metrics; negative turns sampling off")
	fs.BoolVar(&o.unordered, "unordered", false, "let a failed message retry without holding back the later messages of its key; default false")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 30*time.Second, "on SIGTERM, how long in-flight batches may take before they are cut short (the leases are handed back either way), and then how long the broker client's unanswered requests may take before it is closed")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.metricsPrefix, "metrics-prefix", outboxotel.DefaultPrefix, "prefix of the outbox's own metric names")
	fs.StringVar(&o.serviceName, "service-name", "", "the service.name of the OpenTelemetry resource the metrics carry (target_info on /metrics); default OTEL_SERVICE_NAME, else the service.name in OTEL_RESOURCE_ATTRIBUTES, else "+defaultServiceName)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: outbox-relay -store DSN (-kafka-brokers HOSTS | -sqs) [flags]\n\n"+
			"Relays an outbox store to a broker. Every flag may be set by an environment variable\n"+
			"named %s and the flag in upper case with '-' as '_' (-kafka-brokers: %s).\n\nFlags:\n",
			envPrefix, envName("kafka-brokers"))
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), "\nEndpoints on -listen: /healthz, /readyz, /metrics.\nExit codes: 0 graceful stop, 1 the store or broker failed (at start, or the worker stopped on its own),\n2 bad usage or input (a flag that cannot be used, flags that contradict each other or the store: the message names the flag).\n")
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	// Environment variables fill the flags the command line left unset.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := os.LookupEnv(envName(f.Name)); ok && !set[f.Name] && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return o, envErr
	}
	switch {
	case o.store.DSN == "":
		return o, fmt.Errorf("no store: pass -store or set %s", envName("store"))
	case o.kafkaBrokers == "" && !o.sqs:
		return o, fmt.Errorf("no broker: pass -kafka-brokers HOST:PORT,… or -sqs (or set %s / %s)", envName("kafka-brokers"), envName("sqs"))
	case o.kafkaBrokers != "" && o.sqs:
		return o, errors.New("two brokers: pass either -kafka-brokers or -sqs, not both")
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return o, err
	}
	// A zero would silently select the default: each of these flags has its default
	// written out, so 0 and less are refused, naming the flag.
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"-kafka-ack-timeout", o.kafkaAckTimeout}, {"-poll-interval", o.pollInterval}, {"-lease-duration", o.leaseDuration},
		{"-lease-renew-interval", o.leaseRenewInterval}, {"-backoff-base", o.backoffBase}, {"-backoff-max", o.backoffMax},
		{"-stop-timeout", o.stopTimeout},
	} {
		if d.v <= 0 {
			return o, fmt.Errorf("%s %s: it must be positive", d.flag, d.v)
		}
	}
	for _, n := range []struct {
		flag string
		v    int
	}{{"-batch-size", o.batchSize}, {"-max-attempts", o.maxAttempts}, {"-max-concurrency", o.maxConcurrency}} {
		if n.v < 1 {
			return o, fmt.Errorf("%s %d: it must be at least 1", n.flag, n.v)
		}
	}
	if o.retention < 0 {
		return o, fmt.Errorf("-retention %s: give 0 (delete once acknowledged) or a positive duration", o.retention)
	}
	switch {
	case o.streamRetryBudget < 0:
		return o, fmt.Errorf("-stream-retry-budget %s: it must be positive (leave it unset for the default)", o.streamRetryBudget)
	case o.streamRetryBudget > 0 && !o.store.LogMode:
		return o, errors.New("-stream-retry-budget is a setting of the log mode: add -log-mode, or drop -stream-retry-budget")
	}
	return o, nil
}

// checkAckTimeout refuses a Kafka ack timeout that a publish cannot wait out inside
// a lease: a publish may start with LeaseDuration − LeaseRenewInterval left on its
// lease, and one still waiting when the lease runs out is abandoned and counts as
// an attempt. cfg has been validated; its zero durations take the relay's defaults.
func checkAckTimeout(o options, cfg relay.Config) error {
	if o.kafkaBrokers == "" {
		return nil
	}
	lease := cmp.Or(cfg.LeaseDuration, relay.DefaultLeaseDuration)
	renew := cmp.Or(cfg.LeaseRenewInterval, relay.DefaultLeaseRenewInterval)
	if room := lease - renew; o.kafkaAckTimeout >= room {
		return fmt.Errorf("-kafka-ack-timeout %s must be under -lease-duration (%s) minus -lease-renew-interval (%s), %s: a publish may wait that long for the brokers and must finish inside its lease; shorten -kafka-ack-timeout or lengthen -lease-duration",
			o.kafkaAckTimeout, lease, renew, room)
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("-log-level %q: use debug, info, warn or error", s)
	}
	return l, nil
}

// errWorkerStopped marks the worker stopping on its own (exit code 1, even when
// the cause is a misconfiguration such as a bucket count mismatch).
var errWorkerStopped = errors.New("the worker stopped on its own")

// run is the whole program; it returns the exit code.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "outbox-relay:", err)
		return 2
	}
	level, _ := parseLevel(o.logLevel)
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := runRelay(ctx, o, log); err != nil {
		err = inFlagTerms(err)
		log.Error("outbox-relay: stopped", "error", err)
		if !errors.Is(err, errWorkerStopped) && (errors.Is(err, errUsage) || errors.Is(err, outbox.ErrMisconfigured)) {
			return 2
		}
		return 1
	}
	return 0
}

// configFlags name the flag of each configuration field this program sets from one,
// for the errors of the packages it configures ("relay.Config.BatchSize is 0" reads
// "-batch-size is 0"). The relay's fields are also named bare in those messages
// ("at most a third of LeaseDuration").
var configFlags = []struct {
	field, flag string
	bare        bool
}{
	{"BatchSize", "-batch-size", true},
	{"PollInterval", "-poll-interval", true},
	{"LeaseRenewInterval", "-lease-renew-interval", true},
	{"LeaseDuration", "-lease-duration", true},
	{"MaxAttempts", "-max-attempts", true},
	{"BackoffBase", "-backoff-base", true},
	{"BackoffMax", "-backoff-max", true},
	{"Retention", "-retention", true},
	{"MaxConcurrency", "-max-concurrency", true},
	{"BacklogInterval", "-backlog-interval", true},
	{"RelayID", "-relay-id", false},
	{"BucketCount", "-buckets", false},
	{"TableName", "-store", false},
	{"Table", "-table", false},
	{"Prefix", "-metrics-prefix", false},
	{"AckTimeout", "-kafka-ack-timeout", false},
	{"StreamRetryBudget", "-stream-retry-budget", true},
	{"Slot", "-slot", false},
	{"Publication", "-publication", false},
	{"ReplicationURL", "-replication-url", false},
}

var flagTerms = func() *strings.Replacer {
	var pairs []string
	for _, c := range configFlags {
		pairs = append(pairs, "relay.Config."+c.field, c.flag, "Config."+c.field, c.flag)
	}
	for _, c := range configFlags {
		if c.bare {
			pairs = append(pairs, c.field, c.flag)
		}
	}
	return strings.NewReplacer(pairs...)
}()

// inFlagTerms rewrites an error about a misconfiguration in the terms of the flags
// the operator typed; it still wraps what err wraps.
func inFlagTerms(err error) error {
	if !errors.Is(err, errUsage) && !errors.Is(err, outbox.ErrMisconfigured) {
		return err
	}
	if msg := flagTerms.Replace(err.Error()); msg != err.Error() {
		return renamed{msg, err}
	}
	return err
}

type renamed struct {
	msg string
	err error
}

func (r renamed) Error() string { return r.msg }
func (r renamed) Unwrap() error { return r.err }

func runRelay(ctx context.Context, o options, log *slog.Logger) error {
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stopSignals()

	cfg := relay.Config{
		RelayID:            o.relayID,
		BatchSize:          o.batchSize,
		PollInterval:       o.pollInterval,
		LeaseDuration:      o.leaseDuration,
		LeaseRenewInterval: o.leaseRenewInterval,
		MaxAttempts:        o.maxAttempts,
		BackoffBase:        o.backoffBase,
		BackoffMax:         o.backoffMax,
		Retention:          o.retention,
		MaxConcurrency:     o.maxConcurrency,
		BacklogInterval:    o.backlogInterval,
		Unordered:          o.unordered,
		StreamRetryBudget:  o.streamRetryBudget,
		Logger:             log,
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if err := checkAckTimeout(o, cfg); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := openStore(openCtx, o.store)
	if err != nil {
		return err
	}
	defer func() {
		if err := st.Close(); err != nil {
			log.Warn("outbox-relay: closing the store", "error", err)
		}
	}()
	if o.migrate {
		if err := migrate(openCtx, st); err != nil {
			return err
		}
	}
	transport, system, closeTransport, err := openTransport(openCtx, o)
	if err != nil {
		return err
	}
	// Runs once the relay has stopped (or never started): what the transport still has
	// in flight gets -stop-timeout to end before the broker client is closed.
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.stopTimeout)
		defer cancel()
		if err := closeTransport(closeCtx); err != nil {
			log.Warn("outbox-relay: closing the transport", "error", err)
		}
	}()

	registry, provider, err := newMetrics(ctx, o.serviceName)
	if err != nil {
		return err
	}
	defer func() { _ = provider.Shutdown(context.WithoutCancel(ctx)) }()

	if cfg.RelayID == "" {
		// Settled here, as the relay would, because the metrics name it too.
		if cfg.RelayID, err = defaultRelayID(); err != nil {
			return err
		}
	}
	obs, err := outboxotel.New(outboxotel.Config{MeterProvider: provider, Prefix: o.metricsPrefix, MessagingSystem: system, RelayID: cfg.RelayID})
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	defer func() { _ = obs.Close() }()
	cfg.Observer = obs
	// The store's own relay side, so the relay finds its optional capabilities.
	d, err := relay.New(st, transport, cfg)
	if err != nil {
		return err
	}

	var srv *http.Server
	if o.listen != "" {
		ln, err := net.Listen("tcp", o.listen)
		if err != nil {
			return fmt.Errorf("%w: -listen %s: %w", errUsage, o.listen, err)
		}
		srv = &http.Server{Handler: endpoints(d, registry), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("outbox-relay: endpoints stopped", "error", err)
			}
		}()
		log.Info("outbox-relay: endpoints listening", "address", ln.Addr().String())
	}

	// The worker's own context never ends: SIGTERM is turned into a Stop with a
	// deadline, so in-flight batches get -stop-timeout to finish.
	if err := d.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	log.Info("outbox-relay: started", "relay", d.RelayID(), "store", st.Kind, "log_mode", o.store.LogMode, "broker", system, "buckets", st.BucketCount())

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("outbox-relay: stopping; handing the leases back")
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.stopTimeout)
		err := d.Stop(stopCtx)
		cancel()
		if err != nil {
			log.Warn("outbox-relay: graceful stop incomplete; leases not handed back lapse after the lease duration", "error", err)
		} else {
			log.Info("outbox-relay: stopped; leases handed back")
		}
	case <-d.Stopped():
		if err := d.Err(); err != nil {
			runErr = fmt.Errorf("%w: %w", errWorkerStopped, err)
		}
	}
	if srv != nil {
		shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = srv.Shutdown(shutCtx)
		cancel()
	}
	return runErr
}

// defaultServiceName is the relay's service.name unless -service-name or the
// environment names another.
const defaultServiceName = "outbox-relay"

// newMetrics builds the meter provider the outbox's instruments record on and the
// registry /metrics exports them from, with the Go runtime's and the process's
// collectors. Its resource is the one the OpenTelemetry environment variables
// describe (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME) and the SDK's own
// attributes, with service.name set to serviceName, else to the environment's,
// else to defaultServiceName.
func newMetrics(ctx context.Context, serviceName string) (*prometheus.Registry, *sdkmetric.MeterProvider, error) {
	env, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, nil, fmt.Errorf("%w: OTEL_RESOURCE_ATTRIBUTES or OTEL_SERVICE_NAME: %w", errUsage, err)
	}
	if serviceName == "" {
		serviceName = defaultServiceName
		if v, ok := env.Set().Value(semconv.ServiceNameKey); ok && v.AsString() != "" {
			serviceName = v.AsString()
		}
	}
	res, err := resource.Merge(env, resource.NewSchemaless(semconv.ServiceName(serviceName)))
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	return registry, sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res)), nil
}

// defaultRelayID is the host name and a random suffix.
func defaultRelayID() (string, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "relay"
	}
	var suffix [4]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return "", fmt.Errorf("relay id: %w", err)
	}
	return host + "-" + hex.EncodeToString(suffix[:]), nil
}

// migrate creates or upgrades the store's tables (in log mode, and the publication and
// the slot).
func migrate(ctx context.Context, st *openedStore) error {
	switch {
	case st.SQL != nil:
		return st.SQL.Migrate(ctx)
	case st.Dynamo != nil:
		return dynamoCreateTable(ctx, st)
	}
	return nil
}

// openTransport builds the broker client and the transport, and returns what closes
// both once the relay has stopped.
func openTransport(ctx context.Context, o options) (driver.Transport, string, func(context.Context) error, error) {
	if o.kafkaBrokers != "" {
		opts := []kgo.Opt{kgo.SeedBrokers(strings.Split(o.kafkaBrokers, ",")...), kgo.RecordPartitioner(kafkatransport.Partitioner(nil))}
		if o.kafkaAllowAutoCreate {
			opts = append(opts, kgo.AllowAutoTopicCreation())
		}
		client, err := kgo.NewClient(opts...)
		if err != nil {
			return nil, "", nil, fmt.Errorf("%w: kafka: %w", errUsage, err)
		}
		tr, err := kafkatransport.New(client, kafkatransport.Config{AckTimeout: o.kafkaAckTimeout})
		if err != nil {
			client.Close()
			return nil, "", nil, err
		}
		closeKafka := func(ctx context.Context) error {
			// The transport waits for the produce calls the relay left in flight;
			// closing the client then fails whatever it still holds.
			err := tr.Close(ctx)
			client.Close()
			return err
		}
		return tr, "kafka", closeKafka, nil
	}
	cfg, err := awsConfig(ctx, o.store.Region)
	if err != nil {
		return nil, "", nil, err
	}
	client := sqs.NewFromConfig(cfg, func(so *sqs.Options) {
		if o.store.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.store.Endpoint)
		}
	})
	tr, err := sqstransport.New(client, sqstransport.Config{})
	if err != nil {
		return nil, "", nil, err
	}
	return tr, "aws_sqs", func(context.Context) error { return nil }, nil
}

// endpoints serves /healthz, /readyz and /metrics.
func endpoints(d *relay.Relay, registry *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, ok bool, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-d.Stopped():
			reason := "stopped"
			if err := d.Err(); err != nil {
				reason = err.Error()
			}
			reply(w, false, map[string]any{"status": "stopped", "relay": d.RelayID(), "error": reason})
		default:
			reply(w, true, map[string]any{"status": "ok", "relay": d.RelayID()})
		}
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ready := d.Ready()
		owned := d.Owned()
		if owned == nil {
			owned = []int{}
		}
		status := "ready"
		if !ready {
			status = "not ready"
		}
		st := d.Stats()
		reply(w, ready, map[string]any{"status": status, "relay": d.RelayID(), "owned": owned,
			"published": st.Published, "parked": st.Parked, "refused_writes": st.RefusedWrites, "diverted": st.Diverted})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	return mux
}

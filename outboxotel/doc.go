// Package outboxotel reports a relay's measurements as OpenTelemetry metrics,
// and optionally a producer span per published message.
//
// Build an [Observer] and pass it as the relay's Config.Observer:
//
//	obs, err := outboxotel.New(outboxotel.Config{MessagingSystem: "kafka"})
//	if err != nil { ... }
//	d, err := relay.New(store, transport, relay.Config{Observer: obs})
//
// The instruments come from Config.MeterProvider, which defaults to the global
// provider (otel.GetMeterProvider): until the application installs an SDK provider
// every instrument is a no-op. The core modules never import OpenTelemetry; only an
// application that imports this package compiles it.
//
// # Instruments
//
// Names follow the OpenTelemetry messaging semantic conventions where one exists;
// the others are under Config.Prefix ("outbox" by default):
//
//	messaging.client.sent.messages       counter    {message}  messages handed to the broker, by
//	                                                             messaging.destination.name and
//	                                                             messaging.operation.name "send"; error.type
//	                                                             ("permanent" or "transient"), each message's
//	                                                             own, on failures
//	messaging.client.operation.duration  histogram  s          one Transport.Publish call (operation "send"),
//	                                                             recorded once per topic it carried, error.type
//	                                                             the topic's first failure
//	outbox.message.lag                   histogram  s          capture (Envelope.CreatedAt) to broker acknowledgement
//	outbox.messages.completed            counter    {message}  acknowledged and forgotten by the store
//	outbox.messages.retried              counter    {message}  rescheduled after a failed attempt
//	outbox.messages.parked               counter    {message}  parked; outbox.park.reason "permanent" or "attempts"
//	outbox.messages.deleted              counter    {message}  dispatched messages deleted by retention (0 from the start)
//	outbox.lease.refused_writes          counter    {write}    conditional writes the store refused, by outbox.lease.operation
//	                                                             (each at 0 from the start)
//	outbox.coordination.rounds           counter    {round}    worker rounds, error.type on failed ones
//	outbox.relay.instance_clashes        counter    {heartbeat} heartbeats of another live process under this
//	                                                             relay's ID: two processes share it (0 from the start)
//	outbox.relay.owned_buckets           gauge      {bucket}   buckets this relay may publish from
//	outbox.backlog.pending               gauge      {message}  pending messages per outbox.bucket (capped per bucket by the store)
//	outbox.backlog.oldest_age            gauge      s          age of the oldest pending message at the last sample
//	outbox.backlog.parked                gauge      {message}  parked messages at the last sample
//	outbox.stream.lag.bytes              gauge      By         the store's stream kept for its reader (the SQL
//	                                                             store's log mode: WAL bytes behind the slot's
//	                                                             confirmed position) at the last sample
//	outbox.stream.lag.age                gauge      s          how long ago the stream's reader confirmed what
//	                                                             was written (the slot's flush lag); 0 when idle
//	outbox.stream.active                 gauge      {reader}   1 when a reader had the stream open, else 0
//
// # Traces
//
// Three pieces make one trace from the request that sent a message to the consumer
// that handles it: [CaptureSpans] in the route, before tracecontext.Stamp, records
// "create TOPIC" in the caller's trace and its context is stamped on the message;
// Config.TracerProvider makes the relay record "send TOPIC" per message as a child of
// it; [Extract] gives the consumer a context that continues it.
//
// The backlog and stream gauges come from the samples that the relay holding bucket 0
// takes every relay Config.BacklogInterval; the other relays of a fleet report
// none, so summing across relays does not double count. A relay whose last sample
// is older than Config.BacklogTTL stops reporting them. The stream gauges exist only
// for a store whose samples carry a stream (driver.Backlog.Stream: the SQL store on
// PostgreSQL with a log-mode slot).
//
// # Semantics
//
//   - Attribute cardinality is bounded: topics become messaging.destination.name up
//     to Config.MaxTopics distinct ones, later ones are reported as "_OTHER"; buckets
//     are bounded by the bucket count; the other attributes take a few fixed values.
//   - messaging.client.sent.messages counts broker acknowledgements;
//     outbox.messages.completed counts what the store then forgot, which is what
//     the relay's Stats.Published counts. They differ only when a Complete fails
//     (the messages go out again).
//   - Every method records into instruments and returns: nothing blocks a drain.
//
// # Limitations
//
//   - Spans: with Config.TracerProvider set, each message of each publish call gets
//     a producer span ("send TOPIC") that continues the trace context captured with
//     the message; a message without one starts a new trace. The span covers the
//     whole call (the transport reports no per-message timing) and is recorded after
//     the call returned. [CaptureSpans] adds the capture's span; the transports'
//     Decode helpers return headers, not a context: a consumer passes them to
//     [Extract].
//   - Stores report no metrics of their own beyond the backlog samples.
//   - The owned-buckets gauge keeps its last value after the worker stops, until
//     the process ends or the reader stops collecting.
package outboxotel

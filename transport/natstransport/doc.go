// Package natstransport is the outbox transport for NATS JetStream, built on
// nats.go's jetstream package.
//
// The caller connects (nats.Connect), builds the JetStream context
// (jetstream.New(nc)) and passes it to [New]; the transport never dials and never
// closes the connection. Streams belong to the deployment: the transport creates
// none, and each topic's subject must be captured by a stream. A consumer turns
// messages back into what was sent with [Decode] (or [DecodeMsg]), or hands a
// [Source] to an inbox.Consumer (github.com/outboxkit/outbox/inbox), which applies
// each message's effects once and acknowledges it after the unit of work committed.
//
//	js, err := jetstream.New(nc)
//	transport, err := natstransport.New(js, natstransport.Config{})
//	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport})
//
// # Semantics
//
//   - Topic → subject ([Config.Subject] maps it; by default the subject is the topic).
//     The payload is the message's data, byte for byte.
//   - Every message carries the Nats-Msg-Id header set to the envelope's id, so the
//     stream's duplicate window (StreamConfig.Duplicates, 2 minutes by default) drops a
//     copy the relay publishes again — after a lost acknowledgement, a relay crash or
//     a lease move — and acknowledges it as a duplicate. It also carries the
//     [outbox.HeaderMessageID] header and, unless the application set one or
//     [Config.OmitIdempotencyKey] is set, an [outbox.HeaderIdempotencyKey] header, both
//     equal to the id.
//   - The key travels in the [HeaderKey] header when it is plain header text (valid
//     UTF-8 without CR, LF or NUL, no leading or trailing blank), in
//     [HeaderKeyBase64] otherwise; a nil key in neither. A nil payload is marked by
//     [HeaderTombstone], since NATS cannot tell it from an empty one.
//   - Application headers travel as NATS headers of their own when every name is
//     printable ASCII without ':' (and none is the transport's own or starts with
//     "Nats-"), every value is plain header text, and the names are in sorted order —
//     the common case of a few headers such as traceparent and x-correlation-id.
//     That is NATS's own wire format, kept so that consumers and tools that do not
//     use [Decode] see ordinary headers; NATS headers are a map of text values, so
//     anything else would not come back unchanged. Otherwise all of them travel
//     packed, in order and byte for byte, in the [HeaderPacked] header: the base64
//     (standard, padded; header values are text) of the encoding every store uses,
//     [driver.EncodeHeaders]. [Decode] restores them either way, in capture order
//     with duplicates and empty values; a nil value stays nil when packed and
//     arrives empty as a NATS header of its own.
//   - [Transport.Publish] hands the whole batch to the connection as asynchronous
//     publishes (PublishMsgAsync) and waits once for the acknowledgements. It returns
//     nil only when the stream acknowledged every message (a dropped duplicate counts:
//     the stream has the message). Otherwise it returns a [*driver.PublishError]
//     naming each message that was not acknowledged. Permanent failures
//     ([driver.Permanent]): no stream captures the subject (checked with a stream
//     lookup once nothing answered), a topic that maps to an invalid subject, a
//     message over [Config.MaxMessageSize], the server's max_payload or the stream's
//     max_msg_size (also wrapping [outbox.ErrTooLarge]), JetStream not enabled.
//     Everything else — a dropped connection, a missing acknowledgement
//     ([Config.AckTimeout]), a full stream with the discard-new policy, a stream that
//     exists but did not answer — is transient.
//   - Per-key order: JetStream stores one connection's publishes to one stream in the
//     order they were sent. By default ([Config.PipelineKeys] false) the transport
//     does not promise [driver.KeyOrderKeeper], so the relay puts at most one
//     message per key in a Publish call and publishes a key's next message only after
//     the stream acknowledged the previous one: a key's first deliveries keep their
//     commit order through every failure, as long as one stream captures the key's
//     topic. With PipelineKeys a key's messages share a call; see its documentation
//     for when that order can break.
//   - [Transport.Ping] ([driver.Pinger]) asks JetStream for the account's information,
//     so the relay can tell an unreachable server from refused messages.
//
// # Limitations
//
//   - Delivery is at least once. The duplicate window drops the relay's copies only
//     while it lasts: a message published again after it (a retry after a long
//     outage, a parked message requeued later) is stored twice. Consumers deduplicate
//     on the message id.
//   - A message handed to a connection that then drops may be lost or may reach the
//     stream later from the client's reconnect buffer; the transport reports it failed
//     (transient) either way and the relay publishes it again.
//   - Publish stops waiting after [Config.AckTimeout]; the JetStream context still
//     tracks the unacknowledged publishes until their acknowledgement arrives or the
//     connection reconnects, and they count against its limit of pending async
//     publishes (jetstream.WithPublishAsyncMaxPending, 4000 by default). Build the
//     context with jetstream.WithPublishAsyncTimeout to bound that too.
//   - Permission violations are reported by the server asynchronously, not on the
//     publish: a subject the connection may not publish to shows as a missing
//     acknowledgement (transient), and the connection's error handler sees the
//     violation.
//   - Headers that must be packed are sent base64, and binary keys too, so they take
//     4/3 of their size on the wire; a message within [Config.MaxMessageSize] whose
//     encoding exceeds max_payload fails permanently at publish.
package natstransport

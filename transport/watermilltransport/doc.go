// Package watermilltransport is the outbox transport for any Watermill publisher
// ([message.Publisher] from github.com/ThreeDotsLabs/watermill): every broker Watermill
// has an adapter for — AMQP, Kafka, NATS, Google Cloud Pub/Sub, SQL, Redis Streams and
// more — is one constructor away.
//
// The caller builds the publisher with its adapter and passes it to [New]; the
// transport never dials and never closes it. A consumer turns what a Watermill
// subscriber receives back into messages with [Decode], or registers [Handler] with
// its router, which applies each message's effects once through an inbox
// (github.com/outboxkit/outbox/inbox) with the inbox consumer's own step.
//
//	pub, err := amqp.NewPublisher(amqp.NewDurableQueueConfig(url), logger)
//	transport, err := watermilltransport.New(pub, watermilltransport.Config{
//		Ping: func(context.Context) error { ... pub.IsConnected() ... },
//	})
//
// # Semantics
//
//   - Topic → the Watermill topic ([Config.Topic] maps it; the adapter decides what a
//     topic is on its broker). The message UUID is the message id.
//   - Metadata carry everything else, as Watermill metadata are a map of strings: the
//     application's headers by name, the message id as [outbox.HeaderMessageID], an
//     [outbox.HeaderIdempotencyKey] equal to the id unless the application set one or
//     [Config.OmitIdempotencyKey], [MetadataHeaders] (the header names in order, with
//     the values of repeated names and of values that are not UTF-8 inline in
//     base64), the key ([MetadataKey], or [MetadataKeyBase64] for a key that is not
//     UTF-8; absent for a keyless message), [MetadataTombstone] for a nil payload and
//     [MetadataTopic]. [Decode] restores the message exactly. Keys do not reach the
//     broker's own key (a Kafka record key, say) unless the adapter's marshaler reads
//     [MetadataKey].
//   - Publish makes one publisher call per topic in the batch — more when a key moves
//     between topics within the batch, so its messages still go out in order — one
//     call after the other. A Watermill publisher reports a call, not a message: when
//     a call fails, every message of it is reported failed (some may have reached the
//     broker; they are published again), transient unless [Config.Permanent]
//     classifies the error, and the later messages of their keys in the batch are held
//     back (failed, transient). That is the promise of [driver.KeyOrderKeeper], so the
//     relay sends a key's messages together — unless [Config.PartialFailures]
//     says the publisher may write a call's later messages after failing an earlier
//     one; then a call carries at most one message of a key.
//   - Refused before sending, permanently and on their own: a message over
//     [Config.MaxMessageSize] ([outbox.ErrTooLarge]) and one with a header named like a
//     metadata entry the transport writes ([outbox.ErrInvalidMessage]). Set
//     MaxMessageSize, so an oversized message does not fail its whole call.
//   - Each message carries the Publish context (message.Message.SetContext), for
//     adapters that honour it.
//   - [Transport.Ping] calls [Config.Ping] ([driver.Pinger]); without it, it reports nil,
//     and the relay behaves as with a transport that cannot ping.
//
// # Limitations
//
//   - Delivery is at least once, and a failed call duplicates whatever part of it
//     reached the broker. Consumers deduplicate on the message id.
//   - Per-key order holds only as far as the adapter keeps a call's messages in order,
//     stops at a call's first failure (or [Config.PartialFailures] is set), and the
//     broker keeps them in order (one queue, one partition); the transport cannot see
//     any of it. Watermill's AMQP publisher publishes a call's messages one by one on
//     one channel and stops at the first failure.
//   - Failures cannot be told apart per message: one bad message in a call fails the
//     call's other messages with it, transiently unless [Config.Permanent] says
//     otherwise, and a permanent classification parks them all.
//   - Watermill's Publish takes no context: an adapter that ignores the message
//     context can hold Publish past ctx.
//   - The transport knows no broker limits: [Config.MaxMessageSize] is the only size
//     check before sending, and the metadata the transport adds count against the
//     broker's limits too.
package watermilltransport

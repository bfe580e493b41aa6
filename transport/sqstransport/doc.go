// Package sqstransport is a [driver.Transport] for Amazon SQS, standard and FIFO
// queues, on aws-sdk-go-v2. It lives in the transport/sqstransport directory; its name keeps
// it apart from the SDK's sqs package, which programs import beside it.
//
// [New] takes an SQS client the caller built (region, credentials, endpoint, retry
// policy) and never dials. A [Resolver] maps each message's topic to a queue URL:
// [Queues] is a static map, [NameResolver] (the default) treats the topic as a queue
// name and caches GetQueueUrl answers. [Decode] turns a received message back into the
// message ID, key, headers and payload the outbox published; a [Source] handed to an
// inbox.Consumer (github.com/outboxkit/outbox/inbox) applies each message's effects
// once and deletes it after the unit of work committed.
//
// Give the writers' capture the same transport, so that it refuses at Send what SQS
// could never carry:
//
//	transport, err := sqstransport.New(sqs.NewFromConfig(awsCfg), sqstransport.Config{})
//	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport})
//
// # Semantics
//
//   - Publish sends a batch with SendMessageBatch requests of at most ten entries whose
//     sizes add up to at most [Config.QueueLimit], the same limit each message must meet.
//     Sizes are counted as SQS counts them: the body plus every message attribute's
//     name, type and value.
//   - A message counts as sent only when SQS listed it among a request's successful
//     entries. Every other message is reported in an [*driver.PublishError]:
//     permanent (marked with [driver.Permanent]) when retrying cannot help — too large,
//     invalid attribute or body, queue does not exist, access or KMS key denied —
//     transient otherwise (network errors, throttling, server errors, unknown codes).
//   - Every message carries the envelope ID in the String attribute
//     "x-outbox-message-id" ([AttrMessageID]), which is also the
//     [outbox.HeaderMessageID] header. A message whose application set no
//     [outbox.HeaderIdempotencyKey] header gets one equal to the envelope ID, unless
//     [Config.OmitIdempotencyKey] is set; capture never adds it, so that setting is
//     the one switch. A non-empty key travels in "x-outbox-key" ([AttrKey]): a String
//     attribute when it is valid SQS text, Binary otherwise.
//   - Sizes are checked in two places. [Config.MaxMessageSize], which
//     [Transport.MaxMessageSize] ([driver.SizeLimiter]) reports, is a limit on
//     [outbox.Message.Size] of the message as captured. It defaults to, and may not
//     exceed, the most that [Config.QueueLimit] always carries: any message within it
//     with at most 32 headers fits after base64 and the transport's attributes
//     (194,698 bytes for the default 256 KiB). Capture enforces it at Send, before
//     anything is written, when the transport is wired in through
//     outbox.SenderConfig.Transport. Publish always enforces it, and also measures
//     each message as SQS counts it against QueueLimit; a message over either fails
//     permanently with [outbox.ErrTooLarge] without being sent, and the relay parks it.
//   - Headers travel as message attributes of their own, named after the header: a
//     String attribute when the value is valid SQS text, Binary otherwise. SQS allows
//     ten attributes per message; headers that do not fit, or that cannot be
//     attributes (empty values, names SQS refuses or the transport reserves, a name
//     repeated), are packed in order into the Binary attribute "x-outbox-headers"
//     ([AttrHeaders]), in the versioned encoding of [driver.EncodeHeaders].
//   - The String attribute "x-outbox-layout" ([AttrLayout]) is added only when it has
//     something to say: ";"-separated fields "body=base64", "body=nil", "body=empty",
//     "key=empty", and "headers=" followed by the header order as ","-separated
//     attribute names, with "*" for the next packed header. Without a headers field
//     the order is: attributes sorted by name, then the packed headers, then
//     "x-outbox-message-id" — the transport writes the field whenever that would not
//     restore the original order.
//   - The body is the payload when it is valid SQS text (UTF-8 of #x9, #xA, #xD,
//     #x20-#xD7FF, #xE000-#xFFFD, #x10000-#x10FFFF); any other payload is sent as
//     standard base64 with "body=base64" in the layout. SQS refuses an empty body, so
//     a nil payload (a tombstone) and an empty one are both sent as the body "-" with
//     "body=nil" or "body=empty".
//   - FIFO queues (URL ending in ".fifo"): MessageDeduplicationId is the envelope ID,
//     so a retry within SQS's five-minute window is not delivered twice.
//     MessageGroupId is the key, encoded when it is not a valid group id, or
//     "bucket:N" for a keyless message; see [GroupID]. Requests to one FIFO queue go
//     one after another, and a request never carries two messages of one key: once a
//     message failed transiently, the later messages of its key in the batch are held
//     back (reported failed, transient) so they cannot overtake it. So, on FIFO queues,
//     the transport keeps the promise of [driver.KeyOrderKeeper]; it does not declare
//     it, because standard queues give no such promise. Keyless messages of one
//     bucket share a group, several to a request.
//   - Requests to standard queues, and to different queues, run concurrently, up to
//     [Config.Concurrency]. Publish waits for all of them and starts no goroutine that
//     outlives it.
//
// # Limitations
//
//   - At least once: a request that timed out may still have been taken by SQS, and
//     its messages are reported failed and sent again. Standard queues may also
//     deliver twice and out of order; deduplicate on "x-outbox-message-id".
//   - On standard queues SQS keeps no order at all, whatever the relay does.
//   - Headers that share a name are kept (packed) but only the first can be a native
//     attribute; SQS subscription filters and consumers that do not use [Decode] see
//     packed headers only as the opaque "x-outbox-headers" attribute.
//   - The size limit assumes the worst: a binary payload grows by a third through
//     base64, so a text message between [Config.MaxMessageSize] and
//     [Config.QueueLimit] is refused although SQS would take it; raise QueueLimit (up
//     to 1 MiB, with the queues' MaximumMessageSize) to send larger ones. A message
//     within the limit with more than 32 headers can still exceed QueueLimit; publish
//     then refuses it, permanently.
//   - The transport cannot see a queue's MaximumMessageSize: keep [Config.QueueLimit] at
//     or under it, or SQS refuses larger messages (permanently). Emulators may count
//     attribute sizes differently (some count Binary values by their base64 length).
//   - The transport does not retry on its own beyond the client's retry policy; the
//     relay decides when to try again.
package sqstransport

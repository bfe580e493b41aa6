// Package kafkatransport is the outbox transport for Apache Kafka, built on franz-go's kgo
// client.
//
// The caller builds the *kgo.Client (seed brokers, TLS, SASL, ...) and passes it to
// [New]; the transport never dials and never closes it (see "Shutting down"). kgo's
// defaults are what the transport needs: acks from all in-sync replicas and an
// idempotent producer. [New] refuses a client with weaker acks, with idempotent
// writes disabled (unless [Config.AllowNonIdempotent]) or with a transactional id. To
// honour messages that name a partition, build the client with
// kgo.RecordPartitioner([Partitioner](nil)).
//
// A consumer turns records back into messages with [Decode], or hands a [Source] to an
// inbox.Consumer (github.com/outboxkit/outbox/inbox), which applies each record's
// effects once and commits its offset after the unit of work committed.
//
// Give the writers' capture the same transport, so that it refuses at Send what the
// transport could never publish:
//
//	transport, err := kafkatransport.New(client, kafkatransport.Config{})
//	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport})
//
// # Shutting down
//
// A Publish cut short (its context ended, as on the relay's Stop) can leave records
// with the client, in a produce call the transport started. [Transport.Close] waits
// for every such call to end and makes later calls to Publish fail with
// [outbox.ErrClosed]; it leaves the client open, since the client is the caller's.
// Stop the relay first, then close the transport, then the client:
//
//	err := r.Stop(ctx)
//	err = transport.Close(ctx) // bounded by ctx; the client is still open
//	client.Close()             // fails whatever the client still holds
//
// If the brokers do not answer, Close returns ctx's error; closing the client then
// fails the records it holds, which ends the produce calls.
//
// # Semantics
//
//   - Topic → topic. Key, payload and headers are passed through byte for byte; a nil
//     payload is produced as a null value (a tombstone), a nil key as a null key.
//   - Every record carries the [outbox.HeaderMessageID] header (the envelope's id: the
//     [outbox.Message.ID] the application set, or the one capture drew) after the
//     application's headers, and an [outbox.HeaderIdempotencyKey] header equal to
//     the message id when the application set none, unless
//     [Config.OmitIdempotencyKey] is set; capture never adds it, so that setting is the
//     one switch.
//   - Sizes are checked in two places. [Config.MaxMessageSize] (reported by
//     [Transport.MaxMessageSize], an [driver.SizeLimiter]) is a limit on
//     [outbox.Message.Size] of the message as captured; its default leaves room in the
//     client's batches for the record's framing, the two headers the transport adds
//     and the framing of 28 application headers. Capture enforces it at Send, before
//     anything is written, when the transport is wired in through
//     outbox.SenderConfig.Transport. Publish always enforces it, and also bounds the
//     record's wire size against kgo.ProducerBatchMaxBytes; a message over either
//     fails permanently with [outbox.ErrTooLarge] without being sent, and the
//     relay parks it.
//   - Partitioning is the client's: with kgo's default partitioner, keyed records land
//     where Kafka's Java client puts them (murmur2), which is also how the outbox
//     buckets keys, so a topic with as many partitions as the outbox has buckets is fed
//     by one bucket per partition. A message with an explicit partition goes to that
//     partition when the client uses [Partitioner].
//   - [Transport.Publish] hands the whole batch to the client at once and waits once
//     (but for the two cases below), and returns within [Config.AckTimeout], which it
//     reports as its [driver.PublishTimeouter] timeout: relay.New refuses a lease
//     that such a publish cannot finish inside. It returns nil only when every record
//     was acknowledged by all in-sync replicas. Otherwise it returns a
//     [*driver.PublishError] naming each envelope that was not acknowledged; the
//     others were. Failures that retrying cannot fix are marked [driver.Permanent]:
//     a message over [Config.MaxMessageSize], or that a broker refuses as too large
//     on its own (also wrapping [outbox.ErrTooLarge]), an invalid topic name, an
//     authorization failure, a record the broker's validation or policy rejects, a
//     partition the topic does not have, a message naming a partition on a client
//     without [Partitioner], and an unknown topic when [Config.UnknownTopicPermanent]
//     is set. Everything else (leader changes, timeouts, an unreachable cluster, an
//     unknown topic by default) is transient.
//   - A topic the cluster does not have. Before producing, Publish looks up the
//     topics the client's metadata does not have yet (one metadata request, with the
//     client's kgo.AllowAutoTopicCreation, bounded by a quarter of AckTimeout). Their
//     messages fail at once with an error that names the topic and says it does not
//     exist (wrapping kerr.UnknownTopicOrPartition), transient unless
//     [Config.UnknownTopicPermanent]: the relay retries them with backoff, since a
//     deployment may create the topic, and parks them after its MaxAttempts. The
//     batch's other messages are produced as if they were alone.
//   - A topic whose limit is below the client's batches. The client builds record
//     batches of up to kgo.ProducerBatchMaxBytes per partition; a broker refuses a
//     batch over the topic's max.message.bytes as a whole. When it does, the
//     transport paces the topic: it asks for the topic's max.message.bytes
//     (DescribeConfigs, which needs the DESCRIBE_CONFIGS permission on the topic) and
//     from then on hands the client the topic's records, from every Publish call, only
//     while their total stays within it, in several rounds of one Publish if need be.
//     The refused records are produced again that way, in order. A record that cannot
//     share a batch, or is refused again, goes alone, with nothing else of the topic
//     in flight; only a record refused alone fails as too large, permanently. Without
//     the permission the limit is unknown and a paced topic's records go one at a
//     time. The limit is asked for again every minute, so a raised limit is picked up
//     (at or above the client's batch limit, the topic is no longer paced).
//   - A message the transport refuses before sending holds back the later messages of
//     its key in the batch: they are reported failed, transient, so a key's
//     deliveries never skip a message. This, and the client failing a partition's
//     later buffered records when a produce request fails, is the promise of
//     [driver.KeyOrderKeeper], so the relay sends a key's messages together.
//   - The transport produces again only records that failed for others' sake (a
//     batch too large for its topic, another call's cut); everything else the client
//     retries as configured (kgo.RecordRetries, kgo.RecordDeliveryTimeout) before a
//     record fails, and the relay retries.
//
// # Limitations
//
//   - Delivery is at least once. A batch whose acknowledgement was lost, or that was
//     abandoned because ctx ended, is published again by the relay; consumers
//     deduplicate on the message id.
//   - Order is per partition. Within a batch, records of one key keep their order
//     (one partition, one idempotent producer). With kgo.DisableIdempotentWrite and
//     retries, Kafka itself may reorder.
//   - A cut publish. An idempotent producer never withdraws a record it has sent, so
//     during a broker outage the client can hold a batch indefinitely. Halfway
//     through [Config.AckTimeout], Publish asks the client to withdraw the records it
//     has not sent yet (the client fails a partition's buffered records from its head,
//     when it next tries to send to that broker and the head was never sent) and
//     waits, until AckTimeout, for every record to be resolved: a message reported
//     failed with "the client no longer holds the message" cannot be delivered later
//     from this client. Records on the wire, and records buffered behind a request
//     that is on the wire (franz-go then does not get to withdraw them: with a silent
//     broker its in-flight requests block the connection), are not resolved; at
//     AckTimeout they are reported failed with the warning that the client may still
//     deliver them, and it does once the broker answers (a duplicate of the retry,
//     never a loss). A
//     relay whose broker is that unreachable finds out through [Transport.Ping]
//     and parks nothing meanwhile, so a message parked after MaxAttempts was refused
//     by the broker or withdrawn from the client.
//     Records of other Publish calls that such a cut fails are produced again, in
//     order, at no cost in attempts. If ctx ends first (the relay ends it before
//     the bucket's lease runs out, and on Stop or Kill), Publish withdraws what was not
//     sent and returns ctx's error at once: records already on the wire can still
//     reach the broker afterwards, while the client retries them — also after the
//     bucket has moved to another relay. Such late records are duplicates of what the
//     new owner publishes, never a first delivery out of key order, since the new owner
//     publishes the same pending messages in the same order. A goroutine of the
//     transport per such publish waits for the client to resolve them and ends when
//     they are acknowledged, failed by the client's retry limits, or the client is
//     closed; [Transport.Close] waits for it.
//   - [Transport.Ping] ([driver.Pinger]) asks for the cluster's metadata: a relay whose
//     publishes keep failing and whose ping fails too hands its buckets to peers.
//   - The record timestamp is the produce time. The capture time is not used, so that
//     time-based retention never deletes a record that waited in the outbox.
//   - [Config.MaxMessageSize] compares [outbox.Message.Size] (topic, key, payload and
//     header bytes); the wire adds a few bytes per header, so a message within the
//     limit with more than 28 headers can still be refused at publish, permanently.
//   - Capture cannot see the topic's max.message.bytes: a message over a smaller
//     broker limit is stored, and parked once a broker refuses it alone. Set
//     [Config.MaxMessageSize] 512 bytes under it so that capture refuses such
//     messages. A paced topic's throughput is its limit per round trip, for all
//     Publish calls of the transport together; records that other code produces to
//     the topic through the same client are not counted.
package kafkatransport

// Package redistransport is the outbox transport for Redis Streams, built on
// go-redis (github.com/redis/go-redis/v9).
//
// The caller builds the client (redis.NewClient, redis.NewFailoverClient or
// redis.NewClusterClient) and passes it to [New]; the transport never dials and never
// closes it. Each topic is a stream; XADD creates it on the first append. A consumer
// turns entries back into what was sent with [Decode], or hands a [Source] to an
// inbox.Consumer (github.com/outboxkit/outbox/inbox), which applies each entry's
// effects once and acknowledges it (XACK) after the unit of work committed.
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	transport, err := redistransport.New(client, redistransport.Config{})
//	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport})
//
// # Semantics
//
//   - Topic → stream key ([Config.Stream] maps it; by default the key is the topic).
//     Each message is one entry, with an id Redis assigns ("*"), and these fields:
//     [FieldMessageID] (the envelope id, always), [FieldKey] (the key, byte for byte;
//     absent for a nil key, empty for an empty key), [FieldPayload] (absent for a
//     tombstone), [FieldHeaders] (the application's headers, in order, in the
//     binary encoding every store uses, [driver.EncodeHeaders]: duplicates, empty
//     and nil values kept; absent when there are none), [FieldIdempotencyKey] (the
//     message id, unless the application set an idempotency-key header or
//     [Config.OmitIdempotencyKey] is set) and [FieldTopic] (only when the stream key
//     differs from the topic).
//   - [Transport.Publish] sends the whole batch as one pipeline — one XADD per
//     message, with MAXLEN ~ [Config.MaxLen] when set, and a final WAIT when
//     [Config.WaitReplicas] is set — in one round trip, and reports per message what
//     Redis acknowledged. Permanent failures ([driver.Permanent]): a key holding
//     another type than a stream (WRONGTYPE), an ACL that denies the append (NOPERM),
//     a topic that maps to an empty key, a message over [Config.MaxMessageSize] (also
//     wrapping [outbox.ErrTooLarge]). Everything else — a dropped connection, a
//     timeout, OOM under maxmemory, READONLY during a failover, LOADING, CLUSTERDOWN,
//     too few replicas within WaitTimeout — is transient.
//   - Per-key order: Redis executes one connection's pipeline in order, so within a
//     batch a key's entries land in publish order, and what executed before a
//     dropped connection is a prefix of the batch. After a key's first failure the
//     transport reports the key's later entries failed too ([driver.KeyOrderKeeper]),
//     so the relay retries them after the failed one. A key's first deliveries
//     therefore keep their commit order, as long as one stream holds the topic (a
//     cluster client sends each stream's entries to the stream's node).
//   - [Transport.Ping] ([driver.Pinger]) sends PING.
//
// # Limitations
//
//   - Durability is Redis's. An acknowledged XADD is in the primary's memory only: with
//     no persistence (save "" and appendonly no, as on this project's test machines)
//     a restart loses every stream; with appendonly yes and appendfsync everysec (the
//     default when AOF is on) a crash loses up to about a second of acknowledged
//     entries; only appendfsync always writes each entry to disk before the reply.
//     Replication is asynchronous: a failover can lose entries the primary
//     acknowledged. [Config.WaitReplicas] waits for replicas to acknowledge each batch,
//     which makes that loss unlikely, not impossible (a replica that acknowledged may
//     not be the one promoted, and WAIT does not make Redis strongly consistent).
//   - Delivery is at least once, and Redis has no duplicate window: a batch whose
//     replies were lost (a dropped connection, a timeout, too few replicas) is
//     appended again by the relay's retry. Consumers deduplicate on the message
//     id.
//   - [Config.MaxLen] trims the oldest entries whether or not consumers have read
//     them.
//   - Order can break in one case: Redis refuses a key's entry (OOM under maxmemory
//     with noeviction) and then accepts the key's next entry of the same batch,
//     because memory was freed in between; the retried entry lands after it.
//   - Application headers travel packed in one field, so consumers that do not use
//     [Decode] must unpack them with [driver.DecodeHeaders].
package redistransport

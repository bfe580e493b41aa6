package redistransport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// DefaultReadCount is the default of [SourceConfig.ReadCount].
const DefaultReadCount = 16

// SourceConfig configures a [Source].
type SourceConfig struct {
	// Stream is the stream's key. Required.
	Stream string
	// Group is the consumer group, which must exist (XGROUP CREATE stream group $
	// MKSTREAM). Required.
	Group string
	// Name is this consumer's name in the group: entries read but not acknowledged
	// stay pending under it, and a source run again under the same name processes
	// them first. Required.
	Name string
	// ReadCount is how many entries one XREADGROUP asks for. Entries are processed
	// one at a time whatever it is; a larger count only saves round trips. Defaults
	// to DefaultReadCount (16).
	ReadCount int
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c SourceConfig) Validate() error {
	return cmp.Or(
		transportkit.Required("redistransport", "SourceConfig.Stream", c.Stream, ""),
		transportkit.Required("redistransport", "SourceConfig.Group", c.Group, ""),
		transportkit.Required("redistransport", "SourceConfig.Name", c.Name, "a stable name per consumer process"),
		transportkit.Positive("redistransport", "SourceConfig.ReadCount", c.ReadCount, "the default"),
	)
}

// Source is the Redis Streams side of an [inbox.Consumer], which processes one entry
// at a time in stream order, retries a failed one in place and acknowledges (XACK)
// each after its unit of work committed. What is Redis's own:
//
//   - It reads the stream as one named consumer of a group. Each run first hands out
//     the entries pending under the name (read by an earlier run that stopped or
//     crashed before acknowledging them; Redelivered is set), then new ones. Entries
//     read but not processed when the consumer stops stay pending under the name; a
//     crash or a lost XACK leaves the entry pending, and the next run finds it a
//     duplicate. So are the copies Redis stores when the relay retries.
//   - An entry that cannot be decoded or has no inbox key is acknowledged without
//     being processed (Redis has no dead-letter); a pending entry trimmed since it was
//     read is acknowledged and skipped.
//   - A failed read (Redis unreachable) fails the receive. A missing group fails it
//     with an error wrapping [outbox.ErrMisconfigured], which ends the consumer's Run.
//   - A [inbox.Delivery]'s Raw is the redis.XMessage; its Topic is the stream.
//
// Entries pending under a name no source runs under any more are not claimed
// (XAUTOCLAIM): keep names stable per process, or claim them yourself. For
// parallelism run several consumers on several streams (for order) or under several
// names in one group (giving up order).
type Source struct {
	client redis.UniversalClient
	cfg    SourceConfig

	// The read position of the current run: "" (not started), "0" (this name's
	// pending entries) until they are done, then ">"; the entries of the last read
	// not handed out yet, and whether they were pending.
	from       string
	ahead      []redis.XMessage
	aheadFrom0 bool
}

// NewSource returns a source reading through client (the caller's; never dialled or
// closed here). It fails with an error wrapping [outbox.ErrMisconfigured] when client
// is missing or cfg is invalid.
func NewSource(client redis.UniversalClient, cfg SourceConfig) (*Source, error) {
	if err := transportkit.CheckArgs(client == nil, "redistransport: NewSource needs a client (redis.NewClient)", cfg); err != nil {
		return nil, err
	}
	cfg.ReadCount = cmp.Or(cfg.ReadCount, DefaultReadCount)
	return &Source{client: client, cfg: cfg}, nil
}

// Receive returns the next entry, reading when none is left from the last read; it
// returns nothing when a read found nothing.
func (s *Source) Receive(ctx context.Context) ([][]*inbox.Delivery, error) {
	if len(s.ahead) == 0 {
		if err := s.read(ctx); err != nil {
			return nil, err
		}
	}
	for len(s.ahead) > 0 {
		entry := s.ahead[0]
		s.ahead = s.ahead[1:]
		if len(entry.Values) == 0 {
			// A pending entry that was deleted (trimmed) since it was read: nothing to
			// process.
			if err := s.xack(ctx, entry.ID); err != nil {
				return nil, err
			}
			continue
		}
		dec, err := Decode(s.cfg.Stream, entry)
		return [][]*inbox.Delivery{{transportkit.Delivery(entry, dec.ID, dec.Message, s.aheadFrom0, err)}}, nil
	}
	return nil, nil
}

// read runs one XREADGROUP from the run's position.
func (s *Source) read(ctx context.Context) error {
	if s.from == "" {
		s.from = "0"
	}
	args := &redis.XReadGroupArgs{
		Group: s.cfg.Group, Consumer: s.cfg.Name,
		Streams: []string{s.cfg.Stream, s.from}, Count: int64(s.cfg.ReadCount),
	}
	if s.from == ">" {
		args.Block = time.Second // so that a stop is noticed
	}
	streams, err := s.client.XReadGroup(ctx, args).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return nil
	case err != nil && strings.HasPrefix(err.Error(), "NOGROUP"):
		return fmt.Errorf("%w: redistransport: source: stream %q has no group %q: create it (XGROUP CREATE %s %s $ MKSTREAM): %w", outbox.ErrMisconfigured, s.cfg.Stream, s.cfg.Group, s.cfg.Stream, s.cfg.Group, err)
	case err != nil:
		return fmt.Errorf("redistransport: source: read %q: %w", s.cfg.Stream, err)
	}
	for _, st := range streams {
		s.ahead = append(s.ahead, st.Messages...)
	}
	s.aheadFrom0 = s.from == "0"
	if s.from == "0" && len(s.ahead) == 0 {
		s.from = ">" // the pending entries are done
	}
	return nil
}

// Ack acknowledges the entries (XACK).
func (s *Source) Ack(ctx context.Context, ds []*inbox.Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.Raw.(redis.XMessage).ID
	}
	return s.xack(ctx, ids...)
}

// Reject acknowledges the entry unprocessed: Redis has no dead-letter. If the XACK
// fails, the entry stays pending and is rejected again by a later run.
func (s *Source) Reject(ctx context.Context, d *inbox.Delivery, _ error) error {
	return s.xack(ctx, d.Raw.(redis.XMessage).ID)
}

func (s *Source) xack(ctx context.Context, ids ...string) error {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.client.XAck(actx, s.cfg.Stream, s.cfg.Group, ids...).Err(); err != nil {
		return fmt.Errorf("redistransport: source: XACK on %q: %w", s.cfg.Stream, err)
	}
	return nil
}

// Stop forgets the entries read ahead (they stay pending under the name), so that
// the next run starts with the pending entries again.
func (s *Source) Stop() {
	s.from, s.ahead = "", nil
}

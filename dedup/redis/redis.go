// Package redis is the Redis (and Valkey) dedup backend: a record hash per flight, a Redis Stream of frames per generation that followers read live with blocking XREAD, and leader leases from lock/redis.
//
// # Layout
//
// A flight K lives in keys sharing the hash tag {K}, so each script touches
// one Cluster slot (prefix default "llmgate:dedup:"):
//
//	<prefix>{K}        hash: g generation (its leader's fencing token),
//	                   s 'r' running | 'f' finished, f fingerprint
//	<prefix>{K}:<g>    stream: the frames of generation g, one entry each
//	                   ("d" <frame>), then "e" (finished) or a lone "a"
//	                   (aborted or taken over)
//	<prefix>lock:{K}   the leader's lock, managed by lock/redis
//
// While a generation runs, its record and stream expire keep after the last
// claim, frame or refresh (the leader refreshes them on a timer); after
// Finish both expire retain later. Abort deletes the record and trims the
// stream to a lone abort entry that lingers a little, so readers blocked on
// it wake at once. A new generation writes a new stream, so a reader never
// mixes frames of two generations.
//
// All changes are Lua scripts (claim, append, refresh, finish, abort) that
// check the generation first, so a leader that lost its lease cannot write
// any more. Followers block in XREAD on their generation's stream; when a
// block times out, check.lua reports the record's state along with anything
// appended meanwhile.
package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/lock"
	lockredis "github.com/llmgate/llmgate/lock/redis"
)

var (
	//go:embed claim.lua
	claimSrc string
	//go:embed append.lua
	appendSrc string
	//go:embed refresh.lua
	refreshSrc string
	//go:embed finish.lua
	finishSrc string
	//go:embed abort.lua
	abortSrc string
	//go:embed check.lua
	checkSrc string
	//go:embed tidy.lua
	tidySrc string

	claimScript   = rueidis.NewLuaScript(claimSrc)
	appendScript  = rueidis.NewLuaScript(appendSrc)
	refreshScript = rueidis.NewLuaScript(refreshSrc)
	finishScript  = rueidis.NewLuaScript(finishSrc)
	abortScript   = rueidis.NewLuaScript(abortSrc)
	checkScript   = rueidis.NewLuaScript(checkSrc)
	tidyScript    = rueidis.NewLuaScript(tidySrc)
)

// DefaultPrefix starts every key this backend writes.
const DefaultPrefix = "llmgate:dedup:"

// lockKeep is how long a free flight lock stays in Redis (see tidy.lua).
const lockKeep = time.Minute

// Config configures a Backend.
type Config struct {
	// Prefix starts every key (it must not contain '{' or '}'). Default
	// DefaultPrefix. Leader locks live under Prefix + "lock:".
	Prefix string
}

// Backend is a dedup.Backend on Redis or Valkey 6.2+, standalone or Cluster.
type Backend struct {
	c      rueidis.Client
	prefix string
	locks  *locks
}

var _ dedup.Backend = (*Backend)(nil)

// New returns a backend that stores flights through c. The caller keeps
// ownership of c, and calls Close on the backend before closing c.
func New(c rueidis.Client, cfg Config) *Backend {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	b := &Backend{c: c, prefix: cfg.Prefix}
	b.locks = &locks{Backend: lockredis.New(c, lockredis.Config{Prefix: cfg.Prefix + "lock:"}), c: c}
	return b
}

// Close ends the leader locks' wake-up subscription (see lock/redis's
// Backend.Close). Call it before closing the client.
func (b *Backend) Close() { b.locks.Close() }

// Key returns the Redis key of the record of flight key.
func (b *Backend) Key(key string) string { return b.prefix + "{" + key + "}" }

// StreamKey returns the Redis key of the frames of generation gen of key.
func (b *Backend) StreamKey(key string, gen uint64) string {
	return b.Key(key) + ":" + strconv.FormatUint(gen, 10)
}

// LockKey returns the Redis key of the leader lock of key.
func (b *Backend) LockKey(key string) string { return b.locks.Key(key) }

// Locks returns the lock store of this backend's leaders: lock/redis on the
// same client, under Prefix + "lock:".
func (b *Backend) Locks() lock.Backend { return b.locks }

// locks is lock/redis, plus a release that lets a free flight lock expire
// soon (see tidy.lua).
type locks struct {
	*lockredis.Backend
	c rueidis.Client
}

// Release frees the lock and shortens the life of its key.
func (l *locks) Release(ctx context.Context, key, token string) error {
	if err := l.Backend.Release(ctx, key, token); err != nil {
		return err
	}
	// Best effort: a fence counter that is not shortened lives out lock/redis's week.
	_ = tidyScript.Exec(ctx, l.c, []string{l.Key(key)}, []string{ms(lockKeep)}).Error()
	return nil
}

func ms(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }

func genString(gen uint64) string { return strconv.FormatUint(gen, 10) }

// Lookup returns the record of key.
func (b *Backend) Lookup(ctx context.Context, key string) (dedup.Flight, error) {
	vals, err := b.c.Do(ctx, b.c.B().Hmget().Key(b.Key(key)).Field("g", "s", "f").Build()).ToArray()
	if err != nil {
		return dedup.Flight{}, fmt.Errorf("dedup: redis lookup %q: %w", key, err)
	}
	fields, err := optionalStrings(vals)
	if err != nil {
		return dedup.Flight{}, fmt.Errorf("dedup: redis lookup %q: %w", key, err)
	}
	fl, err := decodeRecord(fields)
	if err != nil {
		return dedup.Flight{}, fmt.Errorf("dedup: redis lookup %q: %w", key, err)
	}
	return fl, nil
}

// optionalStrings converts an array reply of strings and nils.
func optionalStrings(vals []rueidis.RedisMessage) ([]*string, error) {
	out := make([]*string, len(vals))
	for i := range vals {
		if vals[i].IsNil() {
			continue
		}
		s, err := vals[i].ToString()
		if err != nil {
			return nil, err
		}
		out[i] = &s
	}
	return out, nil
}

// Claim starts generation gen of key unless a result is retained or a newer
// generation runs.
func (b *Backend) Claim(ctx context.Context, key, fingerprint string, gen uint64, keep time.Duration) (dedup.Flight, error) {
	vals, err := claimScript.Exec(ctx, b.c, []string{b.Key(key)}, []string{genString(gen), fingerprint, ms(keep)}).ToArray()
	if err != nil {
		return dedup.Flight{}, fmt.Errorf("dedup: redis claim %q: %w", key, err)
	}
	if len(vals) != 4 {
		return dedup.Flight{}, fmt.Errorf("dedup: redis claim %q: unexpected reply of %d values", key, len(vals))
	}
	fields, err := optionalStrings(vals[1:])
	if err != nil {
		return dedup.Flight{}, fmt.Errorf("dedup: redis claim %q: %w", key, err)
	}
	fl, err := decodeRecord(fields)
	if err != nil {
		return dedup.Flight{}, fmt.Errorf("dedup: redis claim %q: %w", key, err)
	}
	return fl, nil
}

// generationOp runs one of the scripts that act on a running generation
// (KEYS record and stream, ARGV gen and more) and maps 0 to ErrLost.
func (b *Backend) generationOp(ctx context.Context, op string, s *rueidis.Lua, key string, gen uint64, args ...string) error {
	n, err := s.Exec(ctx, b.c, []string{b.Key(key), b.StreamKey(key, gen)}, append([]string{genString(gen)}, args...)).AsInt64()
	if err != nil {
		return fmt.Errorf("dedup: redis %s %q: %w", op, key, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %q generation %d is not running", dedup.ErrLost, key, gen)
	}
	return nil
}

// Append adds frame to running generation gen.
func (b *Backend) Append(ctx context.Context, key string, gen uint64, frame []byte, keep time.Duration) error {
	return b.generationOp(ctx, "append", appendScript, key, gen, rueidis.BinaryString(frame), ms(keep))
}

// Refresh keeps running generation gen for keep more.
func (b *Backend) Refresh(ctx context.Context, key string, gen uint64, keep time.Duration) error {
	return b.generationOp(ctx, "refresh", refreshScript, key, gen, ms(keep))
}

// Finish completes running generation gen and retains it for retain.
func (b *Backend) Finish(ctx context.Context, key string, gen uint64, retain time.Duration) error {
	return b.generationOp(ctx, "finish", finishScript, key, gen, ms(retain))
}

// Abort ends running generation gen without a result.
func (b *Backend) Abort(ctx context.Context, key string, gen uint64, linger time.Duration) error {
	err := b.generationOp(ctx, "abort", abortScript, key, gen, ms(linger))
	if errors.Is(err, dedup.ErrLost) {
		return nil // not running: nothing to end
	}
	return err
}

// Read returns up to limit frames of generation gen after cursor (a stream
// entry ID), blocking in XREAD up to wait for one.
func (b *Backend) Read(ctx context.Context, key string, gen uint64, cursor string, limit int, wait time.Duration) (dedup.Batch, error) {
	if cursor == "" {
		cursor = "0-0"
	} else if !validID(cursor) {
		return dedup.Batch{}, fmt.Errorf("dedup: redis read %q: malformed cursor %q", key, cursor)
	}
	limit = min(max(limit, 1), 1<<16)
	stream := b.StreamKey(key, gen)
	if wait > 0 {
		cmd := b.c.B().Xread().Count(int64(limit)).Block(max(wait.Milliseconds(), 1)).Streams().Key(stream).Id(cursor).Build()
		res, err := b.c.Do(ctx, cmd).AsXRead()
		if err != nil && !rueidis.IsRedisNil(err) {
			return dedup.Batch{}, fmt.Errorf("dedup: redis read %q: %w", key, err)
		}
		if entries := res[stream]; len(entries) > 0 {
			batch, err := decodeEntries(entries, cursor, limit, stateUnknown)
			if err != nil {
				return dedup.Batch{}, fmt.Errorf("dedup: redis read %q: %w", key, err)
			}
			return batch, nil
		}
	}
	vals, err := checkScript.Exec(ctx, b.c, []string{b.Key(key), stream}, []string{genString(gen), cursor, strconv.Itoa(limit)}).ToArray()
	if err != nil {
		return dedup.Batch{}, fmt.Errorf("dedup: redis read %q: %w", key, err)
	}
	if len(vals) != 2 {
		return dedup.Batch{}, fmt.Errorf("dedup: redis read %q: unexpected reply of %d values", key, len(vals))
	}
	st, err := vals[0].AsInt64()
	if err != nil {
		return dedup.Batch{}, fmt.Errorf("dedup: redis read %q: %w", key, err)
	}
	entries, err := vals[1].AsXRange()
	if err != nil {
		return dedup.Batch{}, fmt.Errorf("dedup: redis read %q: %w", key, err)
	}
	batch, err := decodeEntries(entries, cursor, limit, recordState(st))
	if err != nil {
		return dedup.Batch{}, fmt.Errorf("dedup: redis read %q: %w", key, err)
	}
	return batch, nil
}

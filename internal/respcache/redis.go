package respcache

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/rueidis"
)

const (
	// DefaultRedisPrefix starts every key the Redis store writes.
	DefaultRedisPrefix = "llmgate:cache:"
	// DefaultMaxEntryBytes bounds the encoded size of one entry in the
	// Redis store.
	DefaultMaxEntryBytes = 8 << 20
)

// Redis is a Store on Redis standalone, Sentinel or Cluster: one string key
// per entry (prefix + cache key) holding its versioned, checksummed binary
// form, with the TTL set by SET ... PX, so expiry is the server's job. A
// value that does not decode (corrupt, foreign, or from a future version)
// is logged and reported as a miss; the next Put overwrites it.
type Redis struct {
	c        rueidis.Client
	prefix   string
	maxEntry int
	log      *slog.Logger
}

// RedisOption configures a Redis store.
type RedisOption func(*Redis)

// WithLogger sets where values that cannot be decoded are reported. The
// default discards them.
func WithLogger(l *slog.Logger) RedisOption {
	return func(r *Redis) {
		if l != nil {
			r.log = l
		}
	}
}

// WithMaxEntryBytes sets the largest encoded entry Put stores (default
// DefaultMaxEntryBytes); n ≤ 0 keeps the default.
func WithMaxEntryBytes(n int) RedisOption {
	return func(r *Redis) {
		if n > 0 {
			r.maxEntry = n
		}
	}
}

// NewRedis returns a store that keeps entries in Redis through c under
// prefix (DefaultRedisPrefix when empty). The caller keeps ownership of c.
func NewRedis(c rueidis.Client, prefix string, opts ...RedisOption) *Redis {
	if prefix == "" {
		prefix = DefaultRedisPrefix
	}
	r := &Redis{c: c, prefix: prefix, maxEntry: DefaultMaxEntryBytes, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(r)
	}
	return r
}

// RedisKey returns the Redis key an entry under key is stored at.
func (r *Redis) RedisKey(key string) string { return r.prefix + key }

// Get reads the entry under key with one GET.
func (r *Redis) Get(ctx context.Context, key string) (*Entry, bool, error) {
	b, err := r.c.Do(ctx, r.c.B().Get().Key(r.RedisKey(key)).Build()).AsBytes()
	if rueidis.IsRedisNil(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("respcache: redis get: %w", err)
	}
	e, err := decodeEntry(b)
	if err != nil {
		// The key is a hash of the request, safe to log; the value is not
		// logged (it is an answer, possibly with personal data).
		r.log.ErrorContext(ctx, "respcache: unreadable cache value, treated as a miss",
			"key", r.RedisKey(key), "bytes", len(b), "err", err)
		return nil, false, nil
	}
	return e, true, nil
}

// Put writes e under key with one SET ... PX ttl (rounded up to a
// millisecond). An entry whose encoded form is over the size bound returns
// ErrTooLarge and leaves any previous entry under key in place.
func (r *Redis) Put(ctx context.Context, key string, e *Entry, ttl time.Duration) error {
	if err := check(e, ttl); err != nil {
		return err
	}
	if encodedLen(e) > r.maxEntry {
		return ErrTooLarge // checked before encoding: a huge answer costs no copy
	}
	ms := ttl.Milliseconds()
	if time.Duration(ms)*time.Millisecond < ttl {
		ms++
	}
	cmd := r.c.B().Set().Key(r.RedisKey(key)).Value(rueidis.BinaryString(encodeEntry(e))).PxMilliseconds(ms).Build()
	if err := r.c.Do(ctx, cmd).Error(); err != nil {
		return fmt.Errorf("respcache: redis put: %w", err)
	}
	return nil
}

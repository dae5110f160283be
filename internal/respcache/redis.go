package respcache

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"strconv"
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

//go:embed put.lua
var putSrc string

var putScript = rueidis.NewLuaScript(putSrc)

// Redis is a Store on Redis standalone, Sentinel or Cluster. A tenant's
// keys share a hash tag, so that put.lua can bound the tenant's bytes
// atomically on a Cluster too:
//
//	<prefix>{<tag>}:e:<key>  string with the entry's TTL: its versioned, checksummed binary form
//	<prefix>{<tag>}:i        zset: key -> expiry (µs, server time)
//	<prefix>{<tag>}:s        hash: "k"<key> -> bytes counted, "n" -> the tenant's total
//
// where <tag> is TenantTag(tenant). Get is one GET. A value that does not
// decode (corrupt, foreign, or from a future version) is logged and
// reported as a miss; the next Put overwrites it.
type Redis struct {
	c           rueidis.Client
	prefix      string
	maxEntry    int
	tenantBytes int64
	log         *slog.Logger
}

// NewRedis returns a store that keeps entries in Redis through c under
// prefix (DefaultRedisPrefix when empty). The caller keeps ownership of c.
func NewRedis(c rueidis.Client, prefix string, opts ...Option) *Redis {
	if prefix == "" {
		prefix = DefaultRedisPrefix
	}
	o := newOptions(opts)
	return &Redis{c: c, prefix: prefix, maxEntry: o.maxEntry, tenantBytes: o.tenantBytes, log: o.log}
}

// tenantKey returns the start of every key of tenant's.
func (r *Redis) tenantKey(tenant string) string { return r.prefix + "{" + TenantTag(tenant) + "}:" }

// RedisKey returns the Redis key tenant's entry under key is stored at.
func (r *Redis) RedisKey(tenant, key string) string { return r.tenantKey(tenant) + "e:" + key }

// IndexKey returns the Redis key of tenant's index (a zset of its keys by
// expiry); SizesKey that of its sizes (a hash with the total under "n").
func (r *Redis) IndexKey(tenant string) string { return r.tenantKey(tenant) + "i" }

// SizesKey: see IndexKey.
func (r *Redis) SizesKey(tenant string) string { return r.tenantKey(tenant) + "s" }

// Get reads tenant's entry under key with one GET.
func (r *Redis) Get(ctx context.Context, tenant, key string) (*Entry, bool, error) {
	k := r.RedisKey(tenant, key)
	b, err := r.c.Do(ctx, r.c.B().Get().Key(k).Build()).AsBytes()
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
			"key", k, "bytes", len(b), "err", err)
		return nil, false, nil
	}
	return e, true, nil
}

// Put writes e under tenant and key for ttl (rounded up to a millisecond)
// with put.lua, one round trip, which drops tenant's entries closest to
// their expiry while the tenant would be over its bound. An entry whose
// encoded form is over the entry bound, or over an eighth of the tenant
// bound with its key, returns ErrTooLarge and leaves any previous entry
// under key in place.
func (r *Redis) Put(ctx context.Context, tenant, key string, e *Entry, ttl time.Duration) error {
	if err := check(e, ttl); err != nil {
		return err
	}
	n := encodedLen(e)
	size := int64(n) + int64(len(key))
	if n > r.maxEntry || size > r.tenantBytes/8 {
		return ErrTooLarge // checked before encoding: a huge answer costs no copy
	}
	ms := ttl.Milliseconds()
	if time.Duration(ms)*time.Millisecond < ttl {
		ms++
	}
	t := r.tenantKey(tenant)
	keys := []string{t + "e:" + key, t + "i", t + "s"}
	args := []string{
		rueidis.BinaryString(encodeEntry(e)), strconv.FormatInt(ms, 10), key,
		strconv.FormatInt(size, 10), strconv.FormatInt(r.tenantBytes, 10), t + "e:",
	}
	if err := putScript.Exec(ctx, r.c, keys, args).Error(); err != nil {
		return fmt.Errorf("respcache: redis put: %w", err)
	}
	return nil
}

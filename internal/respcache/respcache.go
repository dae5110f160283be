// Package respcache stores completed LLM answers for exact-match replay.
package respcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"time"
)

var (
	// ErrTooLarge is returned by Put for an entry over the store's size bound;
	// nothing is stored. The answer is still good: serve it, just don't cache it.
	ErrTooLarge = errors.New("respcache: entry too large")
	// ErrInvalidEntry is returned by Put for a nil entry, a status outside
	// 100-999, or an entry that is both a JSON answer and a stream.
	ErrInvalidEntry = errors.New("respcache: invalid entry")
	// ErrInvalidTTL is returned by Put for a TTL that is not positive: an
	// entry that may not live must not be stored.
	ErrInvalidTTL = errors.New("respcache: ttl must be positive")
	// ErrInvalidJSON is returned by Canonical and Key for a body that is not
	// one strict JSON value (RFC 8259, UTF-8 without unpaired surrogates,
	// nested at most MaxDepth deep). Such a body is not cacheable; forward it
	// uncached and let the provider judge it.
	ErrInvalidJSON = errors.New("respcache: invalid JSON")
	// ErrUnavailable is returned by a Breaker while its store is off after
	// a failure: a miss for Get, "not cached" for Put.
	ErrUnavailable = errors.New("respcache: store unavailable")
)

// Entry is one stored answer.
type Entry struct {
	Status int
	// Header holds only the headers worth replaying (content-type,
	// openai-* ...); the gateway picks them.
	Header http.Header
	// Body is the JSON answer; nil for a stream.
	Body []byte
	// Events is a stream: each SSE event's raw bytes exactly as sent to the
	// client, framing included ("data: {...}\n\n").
	Events [][]byte
	// Created is when the answer was produced; the caller sets it (it is
	// stored as given, to the nanosecond, without a monotonic reading or
	// time zone: read it back in UTC).
	Created time.Time
}

// Store is a response cache backend. Entries belong to a tenant: each
// tenant's entries are bounded in bytes on their own, so that one tenant
// cannot push the others' answers out, and a key is looked up within its
// tenant only.
//
// Get returns an Entry the caller owns: changing it changes nothing in the
// store. Put copies what it needs: the caller may reuse e's buffers after
// it returns.
type Store interface {
	// Get returns tenant's live entry under key; a missing or expired
	// entry is (nil, false, nil).
	Get(ctx context.Context, tenant, key string) (*Entry, bool, error)
	// Put stores e under tenant and key for ttl, replacing any previous
	// entry, and drops other entries of tenant's if it goes over its
	// bound. An entry over the store's entry bound is refused with
	// ErrTooLarge.
	Put(ctx context.Context, tenant, key string, e *Entry, ttl time.Duration) error
}

var (
	_ Store = (*Memory)(nil)
	_ Store = (*Redis)(nil)
	_ Store = (*Breaker)(nil)
)

// DefaultTenantBytes is the default bound on one tenant's entries
// (WithTenantBytes).
const DefaultTenantBytes = 64 << 20

// Option configures a store.
type Option func(*options)

type options struct {
	log         *slog.Logger
	maxEntry    int
	tenantBytes int64
}

func newOptions(opts []Option) options {
	o := options{log: slog.New(slog.DiscardHandler), maxEntry: DefaultMaxEntryBytes, tenantBytes: DefaultTenantBytes}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// WithLogger sets where the Redis store reports values it cannot decode.
// The default discards them.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// WithMaxEntryBytes sets the largest encoded entry the Redis store's Put
// stores (default DefaultMaxEntryBytes); n ≤ 0 keeps the default. The
// memory store's entry bound is its maxBytes/8.
func WithMaxEntryBytes(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.maxEntry = n
		}
	}
}

// WithTenantBytes bounds the bytes one tenant's entries hold (default
// DefaultTenantBytes; n ≤ 0 keeps the default). An entry over n/8 is
// refused with ErrTooLarge, so that one answer cannot flush most of its
// tenant's cache.
func WithTenantBytes(n int64) Option {
	return func(o *options) {
		if n > 0 {
			o.tenantBytes = n
		}
	}
}

// TenantTag is what stands for tenant in the Redis store's keys, inside a
// Cluster hash tag: the name itself when it is 1 to 64 letters, digits,
// '.', '_', '@' or '-' (every name the configuration and the admin API
// accept), else "#" and the hex SHA-256 of the name. So no tag holds a
// brace, which would end the hash tag early, and two tenants never share
// one: '#' is in no name kept as it is.
func TenantTag(tenant string) string {
	if len(tenant) >= 1 && len(tenant) <= 64 && plainName(tenant) {
		return tenant
	}
	sum := sha256.Sum256([]byte(tenant))
	return "#" + hex.EncodeToString(sum[:])
}

func plainName(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '@', c == '-':
		default:
			return false
		}
	}
	return true
}

// check validates the arguments of a Put.
func check(e *Entry, ttl time.Duration) error {
	if e == nil || e.Status < 100 || e.Status > 999 || (e.Body != nil && e.Events != nil) {
		return ErrInvalidEntry
	}
	if ttl <= 0 {
		return ErrInvalidTTL
	}
	return nil
}

// Size is what an entry under key costs the memory store's byte bounds: the
// key, every header name and value, the body and every event. Go's
// per-object overhead is not counted. (The Redis store counts the key and
// the encoded entry, a few bytes more.)
func Size(key string, e *Entry) int64 {
	n := int64(len(key)) + int64(len(e.Body))
	for name, vs := range e.Header {
		n += int64(len(name))
		for _, v := range vs {
			n += int64(len(v))
		}
	}
	for _, ev := range e.Events {
		n += int64(len(ev))
	}
	return n
}

// clone returns a deep copy of e whose body and events share one buffer.
func clone(e *Entry) *Entry {
	c := &Entry{Status: e.Status, Header: e.Header.Clone(), Created: e.Created.UTC()}
	n := len(e.Body)
	for _, ev := range e.Events {
		n += len(ev)
	}
	buf := make([]byte, 0, n)
	if e.Body != nil {
		buf = append(buf, e.Body...)
		c.Body = buf[:len(buf):len(buf)]
	}
	if e.Events != nil {
		c.Events = make([][]byte, len(e.Events))
		for i, ev := range e.Events {
			start := len(buf)
			buf = append(buf, ev...)
			c.Events[i] = buf[start:len(buf):len(buf)]
		}
	}
	return c
}

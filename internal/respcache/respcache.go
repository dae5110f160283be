// Package respcache stores completed LLM answers for exact-match replay.
package respcache

import (
	"context"
	"errors"
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

// Store is a response cache backend.
//
// Get returns an Entry the caller owns: changing it changes nothing in the
// store. Put copies what it needs: the caller may reuse e's buffers after
// it returns.
type Store interface {
	// Get returns the live entry under key; a missing or expired entry is
	// (nil, false, nil).
	Get(ctx context.Context, key string) (*Entry, bool, error)
	// Put stores e under key for ttl, replacing any previous entry. An entry
	// over the store's bound is refused with ErrTooLarge.
	Put(ctx context.Context, key string, e *Entry, ttl time.Duration) error
}

var (
	_ Store = (*Memory)(nil)
	_ Store = (*Redis)(nil)
)

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

// Size is what an entry under key costs the memory store's byte bound: the
// key, every header name and value, the body and every event. Go's
// per-object overhead is not counted.
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

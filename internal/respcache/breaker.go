package respcache

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/clock"
)

// Breaker is a Store that turns the cache off while the store it wraps is
// failing, instead of making every request wait for it: after a failed
// call, calls return ErrUnavailable at once for the cool-off; then one
// call at a time tries the store again, until one succeeds. Refusals that
// are not the store's fault (ErrTooLarge, ErrInvalidEntry, ErrInvalidTTL,
// the caller's own cancellation) do not count as failures.
type Breaker struct {
	s       Store
	coolOff time.Duration
	clk     clock.Clock

	failures atomic.Int64 // store calls that failed

	mu      sync.Mutex // protects off, until, probing
	off     bool       // the last call failed
	until   time.Time  // while off, no call before this
	probing bool       // while off, a call is trying the store
}

// DefaultCoolOff is how long a Breaker keeps the cache off after a failure.
const DefaultCoolOff = 5 * time.Second

// NewBreaker wraps s; coolOff ≤ 0 is DefaultCoolOff, and clk nil the real
// clock.
func NewBreaker(s Store, coolOff time.Duration, clk clock.Clock) *Breaker {
	if coolOff <= 0 {
		coolOff = DefaultCoolOff
	}
	if clk == nil {
		clk = clock.Real{}
	}
	return &Breaker{s: s, coolOff: coolOff, clk: clk}
}

// Get is s's Get, or ErrUnavailable while the store is off.
func (b *Breaker) Get(ctx context.Context, tenant, key string) (*Entry, bool, error) {
	probe, ok := b.allow()
	if !ok {
		return nil, false, ErrUnavailable
	}
	e, ok, err := b.s.Get(ctx, tenant, key)
	b.done(ctx, probe, err)
	return e, ok, err
}

// Put is s's Put, or ErrUnavailable while the store is off.
func (b *Breaker) Put(ctx context.Context, tenant, key string, e *Entry, ttl time.Duration) error {
	probe, ok := b.allow()
	if !ok {
		return ErrUnavailable
	}
	err := b.s.Put(ctx, tenant, key, e, ttl)
	b.done(ctx, probe, err)
	return err
}

// Failures returns how many calls the store failed.
func (b *Breaker) Failures() int64 { return b.failures.Load() }

// Off reports whether the cache is off now, after a failure.
func (b *Breaker) Off() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.off
}

// allow reports whether a call may go to the store: always while it is
// on; while off, one call at a time (the probe) once the cool-off has
// passed.
func (b *Breaker) allow() (probe, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.off {
		return false, true
	}
	if b.probing || b.clk.Now().Before(b.until) {
		return false, false
	}
	b.probing = true
	return true, true
}

// done records how a call that went to the store ended.
func (b *Breaker) done(ctx context.Context, probe bool, err error) {
	failed := err != nil && !refusal(err) && !(errors.Is(err, context.Canceled) && ctx.Err() != nil)
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch {
	case failed:
		b.failures.Add(1)
		b.off, b.until = true, b.clk.Now().Add(b.coolOff)
	case err == nil:
		b.off = false
	}
	// Otherwise the call says nothing about the store: nothing changes.
}

// refusal reports whether err is a Put refused for what it was given.
func refusal(err error) bool {
	return errors.Is(err, ErrTooLarge) || errors.Is(err, ErrInvalidEntry) || errors.Is(err, ErrInvalidTTL)
}

// Package lock is a distributed lock with owner tokens, monotonic fencing tokens, watchdog renewal and FIFO hand-off between waiters.
//
// A lock is a lease, not a mutex: a holder that pauses longer than its TTL
// loses it without noticing until it next talks to the store. Every
// acquisition therefore carries a fencing token that strictly increases per
// key; storage that must not accept stale writes should reject any token
// lower than the highest it has seen.
//
// The store side is a Backend: lock/memory for one process, lock/redis for
// many, lock/redlock over independent Redis instances. They pass the
// conformance suite in lock/locktest.
package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/clock"
)

// Errors returned by this package and its backends.
var (
	// ErrNotObtained means the lock is held by someone else (TryAcquire) or
	// was not obtained before the context ended (Acquire, joined with ctx.Err()).
	ErrNotObtained = errors.New("lock: not obtained")
	// ErrNotHeld means a Release or Extend named a lease that is no longer
	// the owner: it expired and may belong to someone else now. The store was
	// not changed.
	ErrNotHeld = errors.New("lock: not held")
	// ErrLost is the cause of a lease's end when the lock was lost while held:
	// taken over after expiry, deleted from outside, or not confirmed by the
	// store before its validity ran out.
	ErrLost = errors.New("lock: lost")
	// ErrReleased is the cause of a lease's end after Release.
	ErrReleased = errors.New("lock: released")
	// ErrInvalidOptions is wrapped by errors about a bad key or bad Options.
	ErrInvalidOptions = errors.New("lock: invalid options")
)

// Defaults used when an Options field is zero.
const (
	// DefaultTTL is how long a lease lives without renewal.
	DefaultTTL = 10 * time.Second
	// DefaultWaiterLease is how long a queued waiter stays in the queue
	// without renewing its place; a waiter that dies is evicted after at most
	// this long, and a lock handed to a waiter that died is free again after
	// at most this long.
	DefaultWaiterLease = 2 * time.Second
	// MinTTL is the smallest TTL accepted.
	MinTTL = 10 * time.Millisecond
	// releaseTimeout bounds a Release whose caller's context was cancelled.
	releaseTimeout = 5 * time.Second
	// releaseAttempts bounds how often Release tries a store that errs.
	releaseAttempts = 3
)

// Options tune one acquisition. The zero value is valid: TTL 10s, not fair.
type Options struct {
	// TTL is the lease duration; the lock frees itself this long after the
	// last acquisition or renewal. Default DefaultTTL, minimum MinTTL.
	TTL time.Duration
	// Fair makes every waiter, in every process, queue in the store in
	// arrival order. When false (the default), waiters in one process queue
	// locally behind a single store-level waiter, and a release passes the
	// lock directly to the next goroutine of the same process while the
	// store's first waiter has waited less than a few milliseconds: faster,
	// and nobody starves, but the order is not strict arrival order.
	Fair bool
	// WaiterLease is how long a queued waiter's place survives without
	// renewal (waiters renew it every WaiterLease/3 while they wait). A lock
	// handed to a waiter is first granted for min(TTL, WaiterLease) and
	// topped up to TTL by the new holder, so a waiter that died in the queue
	// pins the lock for at most this long. Default DefaultWaiterLease.
	WaiterLease time.Duration
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.WaiterLease == 0 {
		o.WaiterLease = DefaultWaiterLease
	}
	return o
}

// Validate reports options a store cannot honour.
func (o Options) Validate() error {
	if o.TTL < MinTTL {
		return fmt.Errorf("%w: TTL %v is below the minimum %v", ErrInvalidOptions, o.TTL, MinTTL)
	}
	if o.WaiterLease < MinTTL {
		return fmt.Errorf("%w: WaiterLease %v is below the minimum %v", ErrInvalidOptions, o.WaiterLease, MinTTL)
	}
	return nil
}

// Grant is a backend's answer to a successful acquisition.
type Grant struct {
	// Fence is the fencing token of this acquisition.
	Fence uint64
	// ValidUntil is a local (monotonic) time before which the lock is
	// certainly still ours.
	ValidUntil time.Time
	// TTL is the lease the store set. It is less than asked after a
	// hand-off (see Options.WaiterLease) and the Locker tops it up; zero
	// means the TTL asked.
	TTL time.Duration
	// HandedOff is set when the lock was handed to this waiter by the
	// holder's release (or expiry) rather than found free (Stats).
	HandedOff bool
}

// Backend is the store side of a lock. Implementations are safe for
// concurrent use. token is unique per acquisition; opts have defaults filled
// in and are valid.
type Backend interface {
	// TryAcquire makes one attempt; ErrNotObtained if the lock is held or
	// other waiters are queued for it.
	TryAcquire(ctx context.Context, key, token string, opts Options) (Grant, error)
	// Acquire waits until the lock is granted or ctx ends; on ctx end it
	// returns an error that wraps ErrNotObtained and ctx.Err() and leaves
	// nothing behind in the store.
	Acquire(ctx context.Context, key, token string, opts Options) (Grant, error)
	// Release frees the lock (or hands it to the next waiter) if token owns
	// it; ErrNotHeld otherwise.
	Release(ctx context.Context, key, token string) error
	// Extend resets the lease to ttl from now if token owns it and returns
	// the new local validity; ErrNotHeld otherwise.
	Extend(ctx context.Context, key, token string, ttl time.Duration) (time.Time, error)
}

// Inspector is implemented by backends that can report queue lengths; tests
// and the admin API use it.
type Inspector interface {
	// Waiters returns how many waiters are queued in the store for key.
	Waiters(ctx context.Context, key string) (int, error)
}

// Locker hands out leases from a Backend.
type Locker struct {
	b     Backend
	clk   clock.Clock
	stats lockStats
}

// Option configures a Locker.
type Option func(*Locker)

// WithClock sets the clock leases keep time on: when the watchdog renews,
// when validity runs out, when a hand-off is topped up (default: the real
// clock). It must be the clock the backend's Grant.ValidUntil and Extend
// are given on: a fake one for a backend on a fake clock (lock/memory in
// tests), the real one for a networked store.
func WithClock(c clock.Clock) Option { return func(l *Locker) { l.clk = c } }

// Stats counts what a Locker's leases went through.
type Stats struct {
	// Acquired counts leases obtained; HandedOff those of them handed over
	// by a releasing holder to this waiter (FIFO hand-off).
	Acquired, HandedOff int64
	// Lost counts leases that ended lost (not released): expired, taken
	// over, or unconfirmable past their validity.
	Lost int64
}

type lockStats struct {
	acquired, handedOff, lost atomic.Int64
}

// Stats returns the counts so far.
func (l *Locker) Stats() Stats {
	return Stats{Acquired: l.stats.acquired.Load(), HandedOff: l.stats.handedOff.Load(), Lost: l.stats.lost.Load()}
}

// New returns a Locker over b.
func New(b Backend, opts ...Option) *Locker {
	l := &Locker{b: b, clk: clock.Real{}}
	for _, o := range opts {
		o(l)
	}
	if l.clk == nil {
		l.clk = clock.Real{}
	}
	return l
}

// Backend returns the store side of l.
func (l *Locker) Backend() Backend { return l.b }

// TryAcquire makes one attempt to take key. It returns ErrNotObtained when
// the lock is held, or when waiters are queued for it (a TryAcquire never
// jumps the queue).
func (l *Locker) TryAcquire(ctx context.Context, key string, opts Options) (*Lease, error) {
	return l.acquire(ctx, key, opts, false)
}

// Acquire blocks until key is held or ctx ends. The wait is independent of
// the TTL: bound it with a context deadline. Waiting is not polling: the
// releaser hands the lock to the next waiter in the store and wakes only it.
func (l *Locker) Acquire(ctx context.Context, key string, opts Options) (*Lease, error) {
	return l.acquire(ctx, key, opts, true)
}

func (l *Locker) acquire(ctx context.Context, key string, opts Options, wait bool) (*Lease, error) {
	if key == "" {
		return nil, fmt.Errorf("%w: empty key", ErrInvalidOptions)
	}
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	token := NewToken()
	var g Grant
	var err error
	if wait {
		g, err = l.b.Acquire(ctx, key, token, opts)
	} else {
		g, err = l.b.TryAcquire(ctx, key, token, opts)
	}
	if err != nil {
		return nil, err
	}
	granted := g.TTL
	if granted <= 0 || granted > opts.TTL {
		granted = opts.TTL
	}
	lease := newLease(l.b, l.clk, key, token, g.Fence, opts.TTL, g.ValidUntil, granted)
	lease.lost = &l.stats.lost
	l.stats.acquired.Add(1)
	if g.HandedOff {
		l.stats.handedOff.Add(1)
	}
	if granted < opts.TTL {
		// A hand-off granted for WaiterLease only: top it up to the full
		// TTL halfway through, unless the lease has ended by then (short
		// critical sections never pay for it).
		lease.scheduleTopUp()
	}
	return lease, nil
}

// Do acquires key, keeps the lease alive while fn runs, and releases it
// afterwards, even if ctx was cancelled meanwhile. fn's context is cancelled
// the moment the lock is lost; Do then returns an error wrapping ErrLost
// (joined with fn's own error, if any).
func (l *Locker) Do(ctx context.Context, key string, opts Options, fn func(ctx context.Context, lease *Lease) error) error {
	lease, err := l.Acquire(ctx, key, opts)
	if err != nil {
		return err
	}
	lease.Keepalive()
	lctx, cancel := lease.Context(ctx)
	fnErr := fn(lctx, lease)
	cancel()
	relErr := lease.Release(ctx)
	if cause := lease.Err(); cause != nil && errors.Is(cause, ErrLost) {
		return errors.Join(fnErr, cause)
	}
	return errors.Join(fnErr, relErr)
}

// NewToken returns a random 128-bit owner token in hex.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it crashes the program instead)
	return hex.EncodeToString(b[:])
}

// SafeValidity returns the local time until which a lease of ttl, set by the
// store no earlier than start, is certainly still valid. It allows for clock
// rate drift between this machine and the store (1% of ttl plus 2ms, as
// Redlock does).
func SafeValidity(start time.Time, ttl time.Duration) time.Time {
	return start.Add(ttl - ttl/100 - 2*time.Millisecond)
}

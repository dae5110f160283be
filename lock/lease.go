package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/clock"
)

// Lease is one acquisition of a lock. Its methods are safe for concurrent use.
type Lease struct {
	// Key is the lock's name.
	Key string
	// Token is the random 128-bit owner token (hex) of this acquisition.
	Token string
	// Fence is the fencing token: it strictly increases per key across all
	// holders and all time, and never falls below the store's clock in
	// microseconds, so it does not repeat even if the store loses its data.
	Fence uint64
	// TTL is the lease duration asked for.
	TTL time.Duration

	b   Backend
	clk clock.Clock // validity, renewals and top-ups keep time on it
	// granted is the lease length the store set at acquisition: TTL, or
	// less after a hand-off.
	granted time.Duration

	mu         sync.Mutex // protects validUntil, err, watching, releasing, topUpTimer
	topUpTimer clock.Timer
	validUntil time.Time
	err        error // why the lease ended; nil while held
	watching   bool
	// releasing is set while Release runs, so that a renewal racing with it
	// (and finding the lock gone) is not mistaken for a loss.
	releasing bool
	done      chan struct{} // closed when err is set
	// lost counts, for the Locker's Stats, leases that end lost.
	lost *atomic.Int64
}

func newLease(b Backend, clk clock.Clock, key, token string, fence uint64, ttl time.Duration, validUntil time.Time, granted time.Duration) *Lease {
	return &Lease{Key: key, Token: token, Fence: fence, TTL: ttl, b: b, clk: clk, granted: granted, validUntil: validUntil, done: make(chan struct{})}
}

// ValidUntil is the local time until which the lock is known to be ours,
// computed from the monotonic clock (the Locker's clock) and the round trip
// that confirmed it. It moves forward with every successful renewal.
func (l *Lease) ValidUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// Done is closed when the lease ends: released, or lost.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err is nil while the lease is held. After it ends it is ErrReleased, or an
// error wrapping ErrLost that says why the lock was lost.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Context returns a copy of parent that is cancelled, with Err as its cause,
// when the lease ends. Call the returned cancel func when done with it.
func (l *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	go func() {
		select {
		case <-l.done:
			cancel(l.Err())
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// end records why the lease ended; the first cause wins (it reports
// whether cause was the first).
func (l *Lease) end(cause error, lost bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false
	}
	l.err = cause
	// Counted before the holder hears of it, so that Stats already shows
	// the loss to a holder that reads it on Done.
	if lost && l.lost != nil {
		l.lost.Add(1)
	}
	close(l.done)
	if l.topUpTimer != nil {
		l.topUpTimer.Stop()
	}
	return true
}

func (l *Lease) lose(reason error) {
	l.mu.Lock()
	releasing := l.releasing
	l.mu.Unlock()
	if releasing {
		return
	}
	l.end(fmt.Errorf("%w: %q: %w", ErrLost, l.Key, reason), true)
}

func (l *Lease) setReleasing(v bool) {
	l.mu.Lock()
	l.releasing = v
	l.mu.Unlock()
}

// Release frees the lock, or hands it to the next waiter. It runs even if
// ctx is already cancelled (it is bounded by its own timeout instead), so a
// deferred Release always reaches the store. ErrNotHeld means the lock had
// already been lost; nothing else was touched. Any other error still ends
// the lease (renewal stops), so the lock frees itself within its TTL.
func (l *Lease) Release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	l.setReleasing(true)
	err := l.b.Release(ctx, l.Key, l.Token)
	for attempt := 1; attempt < releaseAttempts && err != nil && !errors.Is(err, ErrNotHeld) && ctx.Err() == nil; attempt++ {
		// A connection error (a store restart, say) is worth another try.
		// If the failed attempt did reach the store the retry reports
		// ErrNotHeld: we cannot tell that from a lock lost earlier, so we
		// report the safe answer, lost.
		t := time.NewTimer(time.Duration(attempt) * 50 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		err = l.b.Release(ctx, l.Key, l.Token)
	}
	switch {
	case err == nil:
		l.end(ErrReleased, false)
	case errors.Is(err, ErrNotHeld):
		l.setReleasing(false)
		l.lose(ErrNotHeld)
	default:
		// We meant to let go: stop renewing so the lock frees itself
		// within its TTL even though the store did not confirm.
		l.end(fmt.Errorf("%w without confirmation (%w); the lock expires within its TTL", ErrReleased, err), false)
	}
	return err
}

// Extend resets the lease to ttl from now (0 means the lease's TTL).
// ErrNotHeld means the lock was lost; the lease then ends.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl == 0 {
		ttl = l.TTL
	}
	if ttl < MinTTL {
		return fmt.Errorf("%w: TTL %v is below the minimum %v", ErrInvalidOptions, ttl, MinTTL)
	}
	until, err := l.b.Extend(ctx, l.Key, l.Token, ttl)
	if err != nil {
		if errors.Is(err, ErrNotHeld) {
			l.lose(ErrNotHeld)
		}
		return err
	}
	l.mu.Lock()
	l.validUntil = until
	l.mu.Unlock()
	return nil
}

func (l *Lease) scheduleTopUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.topUpTimer = l.clk.AfterFunc(l.validUntil.Sub(l.clk.Now())/2, l.topUp)
}

// topUp extends a hand-off grant to the full TTL.
func (l *Lease) topUp() {
	if l.Err() != nil {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), l.realTime(l.ValidUntil()))
	defer cancel()
	if err := l.Extend(ctx, l.TTL); err != nil && !errors.Is(err, ErrNotHeld) {
		// The watchdog (if any) retries; without one the lease simply keeps
		// its shorter validity, which ValidUntil reports.
		return
	}
}

// Keepalive starts a watchdog that renews the lease every TTL/3, on a
// schedule fixed from the acquisition (late renewals do not push later ones
// back), until the lease is released or lost. A failed renewal is retried
// with backoff while the lease is still valid; when the store says the lock
// is no longer ours, or validity runs out unconfirmed, the lease ends with
// ErrLost at once: Done is closed and Context is cancelled. Calling
// Keepalive again is a no-op.
func (l *Lease) Keepalive() {
	l.mu.Lock()
	if l.watching || l.err != nil {
		l.mu.Unlock()
		return
	}
	l.watching = true
	first := l.validUntil
	l.mu.Unlock()
	go l.watch(first)
}

func (l *Lease) watch(validUntil time.Time) {
	// The grant was made about l.granted before validUntil; renew a third
	// of it later, then every TTL/3 on a fixed schedule.
	next := validUntil.Add(-l.granted + l.granted/3)
	period := l.TTL / 3
	for {
		if !l.sleepUntil(next) {
			return
		}
		if !l.renew() {
			return
		}
		next = next.Add(period)
		if now := l.clk.Now(); next.Before(now) {
			next = now
		}
	}
}

// renew extends the lease, retrying transient failures until it is confirmed
// or its validity runs out. It reports whether the lease is still held.
func (l *Lease) renew() bool {
	backoff := 10 * time.Millisecond
	var lastErr error
	for {
		deadline := l.ValidUntil()
		if !l.clk.Now().Before(deadline) {
			if lastErr == nil {
				lastErr = errors.New("validity ran out before renewal")
			}
			l.lose(fmt.Errorf("not confirmed before its validity ran out: %w", lastErr))
			return false
		}
		ctx, cancel := context.WithDeadline(context.Background(), l.realTime(deadline))
		err := l.Extend(ctx, l.TTL)
		cancel()
		if err == nil {
			return true
		}
		if errors.Is(err, ErrNotHeld) || l.Err() != nil {
			return false // Extend already ended the lease
		}
		lastErr = err
		wake := l.clk.Now().Add(backoff)
		if wake.After(deadline) {
			wake = deadline
		}
		if !l.sleepUntil(wake) {
			return false
		}
		backoff = min(backoff*2, max(l.TTL/10, 10*time.Millisecond))
	}
}

// sleepUntil waits, on the Locker's clock, until t or until the lease
// ends; it reports whether t came.
func (l *Lease) sleepUntil(t time.Time) bool {
	d := t.Sub(l.clk.Now())
	if d <= 0 {
		select {
		case <-l.done:
			return false
		default:
			return true
		}
	}
	due := make(chan struct{})
	timer := l.clk.AfterFunc(d, func() { close(due) })
	select {
	case <-due:
		return true
	case <-l.done:
		timer.Stop()
		return false
	}
}

// realTime is the real time at which the Locker's clock shows t: a
// context deadline, which runs on real time, for a call that must end by
// t. With the real clock it is t.
func (l *Lease) realTime(t time.Time) time.Time {
	if _, isReal := l.clk.(clock.Real); isReal {
		return t
	}
	return time.Now().Add(t.Sub(l.clk.Now()))
}

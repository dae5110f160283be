// Package memory is the in-process lock backend: the same semantics as the Redis backend (FIFO hand-off, TTL expiry, fencing) for a single process.
package memory

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/lock"
)

// Backend keeps locks in process memory. Waiters are served in arrival
// order; a release hands the lock straight to the first waiter and wakes
// only it.
type Backend struct {
	clk clock.Clock

	mu    sync.Mutex // protects locks, fence
	locks map[string]*state
	// fence is the last fencing token issued for any key. One counter for
	// all keys keeps every key's fences increasing even after its state is
	// dropped, and even if the wall clock steps back.
	fence uint64
}

var (
	_ lock.Backend   = (*Backend)(nil)
	_ lock.Inspector = (*Backend)(nil)
)

// state is one key's lock.
type state struct {
	owner   string // token of the holder; "" when free
	expires time.Time
	waiters list.List   // of *waiter, in arrival order
	timer   clock.Timer // fires at expires while waiters are queued
}

type waiter struct {
	token string
	ttl   time.Duration
	grant chan lock.Grant // buffered(1): receives the hand-off
}

// New returns an empty in-memory backend on clk (nil means the real clock).
// Leases expire, and Grant.ValidUntil is given, on clk: give the Locker the
// same clock (lock.WithClock), so that its watchdog renews on it.
func New(clk clock.Clock) *Backend {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Backend{clk: clk, locks: make(map[string]*state)}
}

// expireLocked frees the lock if its lease has run out; b.mu must be held.
func (b *Backend) expireLocked(s *state, now time.Time) {
	if s.owner != "" && !now.Before(s.expires) {
		s.owner = ""
	}
}

// grantLocked makes token the owner with a fresh fence; b.mu must be held.
func (b *Backend) grantLocked(key string, s *state, token string, ttl time.Duration, now time.Time) lock.Grant {
	b.fence = max(b.fence+1, uint64(now.UnixMicro()))
	s.owner = token
	s.expires = now.Add(ttl)
	b.armLocked(key, s, now)
	return lock.Grant{Fence: b.fence, ValidUntil: s.expires}
}

// armLocked schedules the hand-off to the first waiter at the holder's
// expiry, so a holder that never releases is taken over right on time.
func (b *Backend) armLocked(key string, s *state, now time.Time) {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if s.owner == "" || s.waiters.Len() == 0 {
		return
	}
	s.timer = b.clk.AfterFunc(s.expires.Sub(now), func() { b.onExpiry(key) })
}

func (b *Backend) onExpiry(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.locks[key]
	if s == nil {
		return
	}
	now := b.clk.Now()
	b.expireLocked(s, now)
	if s.owner == "" {
		b.handOffLocked(key, s, now)
	} else {
		b.armLocked(key, s, now) // extended meanwhile
	}
}

// handOffLocked gives a free lock to the first waiter, or forgets the key
// when nobody waits; b.mu must be held.
func (b *Backend) handOffLocked(key string, s *state, now time.Time) {
	front := s.waiters.Front()
	if front == nil {
		if s.timer != nil {
			s.timer.Stop()
			s.timer = nil
		}
		s.owner = ""
		delete(b.locks, key)
		return
	}
	w := s.waiters.Remove(front).(*waiter)
	w.grant <- b.grantLocked(key, s, w.token, w.ttl, now)
}

func (b *Backend) stateLocked(key string) *state {
	s := b.locks[key]
	if s == nil {
		s = &state{}
		b.locks[key] = s
	}
	return s
}

// TryAcquire takes key if it is free and nobody is queued for it.
func (b *Backend) TryAcquire(_ context.Context, key, token string, opts lock.Options) (lock.Grant, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.stateLocked(key)
	now := b.clk.Now()
	b.expireLocked(s, now)
	if s.owner != "" || s.waiters.Len() > 0 {
		return lock.Grant{}, lock.ErrNotObtained
	}
	return b.grantLocked(key, s, token, opts.TTL, now), nil
}

// Acquire takes key, or queues for it until it is handed over or ctx ends.
func (b *Backend) Acquire(ctx context.Context, key, token string, opts lock.Options) (lock.Grant, error) {
	if err := ctx.Err(); err != nil {
		return lock.Grant{}, errors.Join(lock.ErrNotObtained, err)
	}
	b.mu.Lock()
	s := b.stateLocked(key)
	now := b.clk.Now()
	b.expireLocked(s, now)
	if s.owner == "" && s.waiters.Len() == 0 {
		g := b.grantLocked(key, s, token, opts.TTL, now)
		b.mu.Unlock()
		return g, nil
	}
	w := &waiter{token: token, ttl: opts.TTL, grant: make(chan lock.Grant, 1)}
	elem := s.waiters.PushBack(w)
	if s.owner == "" {
		// Free but others are queued: they are being handed the lock now.
		b.handOffLocked(key, s, now)
	} else if s.waiters.Len() == 1 {
		b.armLocked(key, s, now)
	}
	b.mu.Unlock()

	select {
	case g := <-w.grant:
		g.HandedOff = true
		return g, nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.grant:
		// Handed over just as we gave up: pass it on.
		if s.owner == token {
			s.owner = ""
			b.handOffLocked(key, s, b.clk.Now())
		}
	default:
		s.waiters.Remove(elem)
		b.armLocked(key, s, b.clk.Now())
	}
	return lock.Grant{}, errors.Join(lock.ErrNotObtained, ctx.Err())
}

// Release frees key, handing it to the first waiter, if token holds it.
func (b *Backend) Release(_ context.Context, key, token string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.locks[key]
	if s == nil {
		return lock.ErrNotHeld
	}
	now := b.clk.Now()
	b.expireLocked(s, now)
	if s.owner != token {
		return lock.ErrNotHeld
	}
	s.owner = ""
	b.handOffLocked(key, s, now)
	return nil
}

// Extend resets token's lease on key to ttl from now.
func (b *Backend) Extend(_ context.Context, key, token string, ttl time.Duration) (time.Time, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.locks[key]
	if s == nil {
		return time.Time{}, lock.ErrNotHeld
	}
	now := b.clk.Now()
	b.expireLocked(s, now)
	if s.owner != token {
		if s.owner == "" {
			b.handOffLocked(key, s, now)
		}
		return time.Time{}, lock.ErrNotHeld
	}
	s.expires = now.Add(ttl)
	b.armLocked(key, s, now)
	return s.expires, nil
}

// Waiters returns the number of goroutines queued for key.
func (b *Backend) Waiters(_ context.Context, key string) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.locks[key]; s != nil {
		return s.waiters.Len(), nil
	}
	return 0, nil
}

package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/memory"
)

// notHeldExtender is a Backend whose renewals find the lock taken.
type notHeldExtender struct{ lock.Backend }

func (notHeldExtender) Extend(context.Context, string, string, time.Duration) (time.Time, error) {
	return time.Time{}, lock.ErrNotHeld
}

// TestStats: acquisitions, hand-offs to a waiter and lost leases are
// counted.
func TestStats(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	store := memory.New(nil)
	a, b := lock.New(store), lock.New(store)
	held, err := a.Acquire(ctx, "k", lock.Options{TTL: 10 * time.Second, Fair: true})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx, "k", lock.Options{TTL: 10 * time.Second, Fair: true})
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for n := 0; n == 0; <-tick.C { // until b queues
		if n, err = store.Waiters(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if s := a.Stats(); s != (lock.Stats{Acquired: 1}) {
		t.Errorf("a's stats %+v, want 1 acquired", s)
	}
	if s := b.Stats(); s.Acquired != 1 || s.HandedOff != 1 || s.Lost != 0 {
		t.Errorf("b's stats %+v, want 1 acquired by hand-off", s)
	}

	c := lock.New(notHeldExtender{store})
	err = c.Do(ctx, "lost", lock.Options{TTL: 100 * time.Millisecond}, func(ctx context.Context, _ *lock.Lease) error {
		<-ctx.Done()
		return nil
	})
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Do = %v, want ErrLost", err)
	}
	if s := c.Stats(); s.Acquired != 1 || s.Lost != 1 {
		t.Errorf("c's stats %+v, want 1 acquired, 1 lost", s)
	}
}

// TestStatsCountLossBeforeDone: a lease the watchdog finds lost is counted
// before Done closes, so whoever sees the loss (Do's caller) sees it in
// Stats too.
func TestStatsCountLossBeforeDone(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l := lock.New(notHeldExtender{memory.New(nil)})
	for i := range 100 {
		lease, err := l.TryAcquire(ctx, fmt.Sprintf("k%d", i), lock.Options{TTL: lock.MinTTL})
		if err != nil {
			t.Fatal(err)
		}
		lease.Keepalive()
		<-lease.Done()
		if got := l.Stats().Lost; got != int64(i+1) {
			t.Fatalf("after %d leases lost, Stats().Lost = %d", i+1, got)
		}
	}
}

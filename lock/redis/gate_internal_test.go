package redis

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// TestUnclaimAfterStoreTurnLeft replays, step by step, an interleaving
// that TestBusyProcessCannotStarveOthers hit on a loaded machine: a
// releaser claims the first local waiter W, the store does not let it pass
// the lock to W (a waiter of another process has waited too long), and
// meanwhile the goroutine with the store turn gets the lock and leaves,
// finding no local waiter. When the releaser puts W back, W must get the
// store turn; before the fix it waited for a turn nobody would give.
func TestUnclaimAfterStoreTurnLeft(t *testing.T) {
	b := &Backend{gates: make(map[string]*gate)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	const key, ttl = "k", time.Second

	leaveS, passed, err := b.enterGate(ctx, key, "s", ttl)
	if err != nil || passed != nil || leaveS == nil {
		t.Fatalf("first enterGate = %v, %v, %v; want the store turn", leaveS != nil, passed, err)
	}
	type entered struct {
		leave  func()
		passed bool
		err    error
	}
	got := make(chan entered, 1)
	go func() {
		leave, passed, err := b.enterGate(ctx, key, "w", ttl)
		got <- entered{leave, passed != nil, err}
	}()
	// Wait (bounded) for W to queue behind the store turn.
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		n := len(b.gates[key].waiters)
		b.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("local waiter not queued within 10s")
		}
		runtime.Gosched()
	}

	w := b.claimLocalWaiter(key) // a releaser is about to pass W the lock
	if w == nil {
		t.Fatal("no local waiter to claim")
	}
	leaveS()          // the store-turn goroutine got the lock from Redis and left
	b.unclaim(key, w) // the store refused the pass: W waits on

	select {
	case e := <-got:
		if e.err != nil || e.passed || e.leave == nil {
			t.Fatalf("W's enterGate = leave %v, passed %v, %v; want the store turn", e.leave != nil, e.passed, e.err)
		}
		e.leave()
	case <-time.After(10 * time.Second):
		t.Fatal("W was put back behind a store turn nobody holds: it never gets the turn")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.gates) != 0 {
		t.Fatalf("gates left behind: %d", len(b.gates))
	}
}

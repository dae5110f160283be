package gateway

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
)

func newBareGateway(t *testing.T) *Gateway {
	t.Helper()
	up, err := provider.New(provider.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bm := memoryBudgets(t)
	g, err := New(Options{
		Route:    func(string) ([]string, bool) { return nil, false },
		Limiter:  ratelimit.New(rlmemory.New(clock.Real{})),
		Budgets:  bm,
		Upstream: up,
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestBackgroundRunsEverything: more work than the workers and their queue
// hold at once all runs, Close waits for it, and work handed over after
// Close still runs. A job's deadline counts from when it was handed over,
// even when it waited behind busy workers.
func TestBackgroundRunsEverything(t *testing.T) {
	g := newBareGateway(t)
	release := make(chan struct{})
	var ran atomic.Int64
	var late sync.Once
	lateDeadline := make(chan time.Duration, 1)
	const jobs = backgroundWorkers + backgroundQueue + 100
	for i := range jobs {
		handed := time.Now()
		g.workers.run(time.Hour, func(ctx context.Context) {
			if i < backgroundWorkers {
				<-release // the workers stay busy while the rest is handed over
			}
			if i == jobs-1 {
				dl, _ := ctx.Deadline()
				late.Do(func() { lateDeadline <- dl.Sub(handed) })
			}
			ran.Add(1)
		})
	}
	time.Sleep(100 * time.Millisecond) // the subject: the last job waits this long in the queue
	close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := g.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != jobs {
		t.Fatalf("%d of %d jobs ran before Close returned", n, jobs)
	}
	// Counted from when it ran, the deadline would be 100 ms later.
	if d := <-lateDeadline; d < time.Hour || d > time.Hour+50*time.Millisecond {
		t.Errorf("a queued job's deadline was %v after it was handed over, want its timeout (1h)", d)
	}
	done := make(chan struct{})
	g.workers.run(time.Second, func(context.Context) { close(done) })
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("work handed over after Close did not run")
	}
	if err := g.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

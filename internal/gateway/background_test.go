package gateway

import (
	"context"
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
	busy := make(chan struct{}, backgroundWorkers)
	queuedDeadline := make(chan time.Time, 1)
	var ran atomic.Int64
	var handedFrom, handedBy time.Time // around the queued job's hand-over
	const jobs = backgroundWorkers + backgroundQueue + 100
	const queued = backgroundWorkers // the first job behind the busy workers
	for i := range jobs {
		if i == queued {
			for range backgroundWorkers {
				<-busy
			}
			handedFrom = time.Now()
		}
		g.workers.run(time.Hour, func(ctx context.Context) {
			if i < backgroundWorkers {
				busy <- struct{}{}
				<-release // the workers stay busy while the rest is handed over
			}
			if i == queued {
				dl, _ := ctx.Deadline()
				queuedDeadline <- dl
			}
			ran.Add(1)
		})
		if i == queued {
			handedBy = time.Now()
		}
	}
	time.Sleep(100 * time.Millisecond) // the subject: the queued job waits this long
	close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := g.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != jobs {
		t.Fatalf("%d of %d jobs ran before Close returned", n, jobs)
	}
	// Counted from when it ran, the deadline would be at least 100ms
	// past handedBy's hour.
	if dl := <-queuedDeadline; dl.Before(handedFrom.Add(time.Hour)) || dl.After(handedBy.Add(time.Hour)) {
		t.Errorf("a queued job's deadline was %v after it was handed over, want its timeout (1h)", dl.Sub(handedFrom))
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

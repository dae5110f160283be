package gateway

import (
	"context"
	"sync"
	"time"
)

// Background work (the settle of every request) runs on a few workers that
// keep their stacks: a goroutine per request allocates and grows a new one
// every time. Work that finds the queue full, or the gateway closed, runs
// on a goroutine of its own.
const (
	backgroundWorkers = 8
	backgroundQueue   = 1024
)

// backgroundJob is a call of f with a context that ends at deadline: the
// job's timeout counts from when it was handed over, so that work queued
// behind a stalled store (an outage) fails when it would have on a
// goroutine of its own, not later.
type backgroundJob struct {
	deadline time.Time
	f        func(ctx context.Context)
}

// background runs f with a context bounded by timeout, tracked by Close,
// never in the caller's goroutine.
func (g *Gateway) background(timeout time.Duration, f func(ctx context.Context)) {
	g.pending.Add(1)
	j := backgroundJob{time.Now().Add(timeout), f}
	g.bgMu.Lock()
	defer g.bgMu.Unlock()
	if !g.bgStopped {
		if g.jobs == nil {
			g.jobs = make(chan backgroundJob, backgroundQueue)
			g.stopJobs = make(chan struct{})
			for range backgroundWorkers {
				go g.backgroundWorker(g.jobs, g.stopJobs)
			}
		}
		select {
		case g.jobs <- j:
			return
		default:
		}
	}
	go g.runJob(j)
}

// stopBackground ends the workers once they have run what is queued.
func (g *Gateway) stopBackground() {
	g.bgMu.Lock()
	defer g.bgMu.Unlock()
	if !g.bgStopped && g.stopJobs != nil {
		close(g.stopJobs)
	}
	g.bgStopped = true
}

func (g *Gateway) backgroundWorker(jobs <-chan backgroundJob, stop <-chan struct{}) {
	for {
		select {
		case j := <-jobs:
			g.runJob(j)
		case <-stop:
			for { // nothing is queued after stop: drain and end
				select {
				case j := <-jobs:
					g.runJob(j)
				default:
					return
				}
			}
		}
	}
}

func (g *Gateway) runJob(j backgroundJob) {
	defer g.pending.Done()
	ctx, cancel := context.WithDeadline(context.Background(), j.deadline)
	defer cancel()
	j.f(ctx)
}

// pendingWork counts background work. Unlike sync.WaitGroup, work may be
// added while someone waits (a handler finishing as Close is called): the
// waiter returns once the count is zero at some moment.
type pendingWork struct {
	mu      sync.Mutex // protects n, zero and waiting
	n       int
	zero    chan struct{} // closed when n drops to 0; nil while n is 0
	waiting int           // callers in wait (tests watch it)
}

func (p *pendingWork) Add(d int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 && p.zero == nil {
		p.zero = make(chan struct{})
	}
	p.n += d
	if p.n == 0 {
		close(p.zero)
		p.zero = nil
	}
}

func (p *pendingWork) Done() { p.Add(-1) }

func (p *pendingWork) wait(ctx context.Context) error {
	p.mu.Lock()
	zero := p.zero
	if zero != nil {
		p.waiting++
	}
	p.mu.Unlock()
	if zero == nil {
		return nil
	}
	defer func() {
		p.mu.Lock()
		p.waiting--
		p.mu.Unlock()
	}()
	select {
	case <-zero:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

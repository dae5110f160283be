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

// workers runs background work: the settle of every request, shared
// provider feedback, cache fills. Each job is counted in pending until it
// has run, so that Close can wait for it.
type workers struct {
	pending *pendingWork
	mu      sync.Mutex         // protects jobs, stop and stopped
	jobs    chan backgroundJob // made on first use
	stop    chan struct{}
	stopped bool
}

// backgroundJob is a call of f with a context that ends at deadline: the
// job's timeout counts from when it was handed over, so that work queued
// behind a stalled store (an outage) fails when it would have on a
// goroutine of its own, not later.
type backgroundJob struct {
	deadline time.Time
	f        func(ctx context.Context)
}

// run runs f with a context bounded by timeout, never in the caller's
// goroutine.
func (w *workers) run(timeout time.Duration, f func(ctx context.Context)) {
	w.pending.Add(1)
	j := backgroundJob{time.Now().Add(timeout), f}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		if w.jobs == nil {
			w.jobs = make(chan backgroundJob, backgroundQueue)
			w.stop = make(chan struct{})
			for range backgroundWorkers {
				go w.loop(w.jobs, w.stop)
			}
		}
		select {
		case w.jobs <- j:
			return
		default:
		}
	}
	go w.runJob(j)
}

// close ends the workers once they have run what is queued; work handed
// over later runs on goroutines of its own.
func (w *workers) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped && w.stop != nil {
		close(w.stop)
	}
	w.stopped = true
}

func (w *workers) loop(jobs <-chan backgroundJob, stop <-chan struct{}) {
	for {
		select {
		case j := <-jobs:
			w.runJob(j)
		case <-stop:
			for { // nothing is queued after stop: drain and end
				select {
				case j := <-jobs:
					w.runJob(j)
				default:
					return
				}
			}
		}
	}
}

func (w *workers) runJob(j backgroundJob) {
	defer w.pending.Done()
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

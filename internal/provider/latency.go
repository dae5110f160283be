package provider

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// latencyWindow is how many recent samples the p95 is taken over.
	latencyWindow = 256
	// minSamples is how many samples a target needs before its timeout
	// leaves the ceiling: fewer say too little about its tail.
	minSamples = 20
	// recomputeEvery spaces the p95 recomputations, so that a sample costs
	// a slot write and the sort (about 10 µs here) is amortised over many
	// calls: a quarter of the window.
	recomputeEvery = 64
)

// timeouts are the bounds and factor of the adaptive timeout.
type timeouts struct {
	floor, ceiling time.Duration
	multiplier     float64
}

// latency tracks the recent times to headers of one target and the
// timeout derived from them. Readers of the timeout take no lock.
type latency struct {
	timeout atomic.Int64 // current time-to-headers timeout, in nanoseconds

	mu   sync.Mutex // protects ring, n
	ring [latencyWindow]time.Duration
	n    uint64 // samples ever recorded; the next goes to ring[n%latencyWindow]
}

func (l *latency) init(p timeouts) { l.timeout.Store(int64(p.ceiling)) }

// current returns the timeout for the next attempt.
func (l *latency) current() time.Duration { return time.Duration(l.timeout.Load()) }

// observe records the time to headers of a successful attempt.
func (l *latency) observe(d time.Duration, p timeouts) {
	l.mu.Lock()
	l.ring[l.n%latencyWindow] = max(d, 0)
	l.n++
	n := l.n
	l.mu.Unlock()
	if n == minSamples || (n > minSamples && n%recomputeEvery == 0) {
		l.recompute(p)
	}
}

// recompute sets the timeout from the p95 of the window. The sort runs on
// a copy, outside the lock.
func (l *latency) recompute(p timeouts) {
	var snap [latencyWindow]time.Duration
	l.mu.Lock()
	m := int(min(l.n, latencyWindow))
	copy(snap[:], l.ring[:m])
	l.mu.Unlock()
	if m < minSamples {
		return
	}
	s := snap[:m]
	slices.Sort(s)
	p95 := s[(m*95+99)/100-1] // nearest rank: the ⌈0.95·m⌉-th smallest
	t := clampDuration(p.multiplier*float64(p95), p.ceiling)
	l.timeout.Store(int64(max(t, p.floor)))
}

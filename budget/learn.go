package budget

import (
	"slices"
	"sync"
)

// A request that sets no bound on its completion (no max_tokens) reserves
// a guess. A fixed guess held most of a small budget in reservations that
// settled far lower; so the store learns, per window and model, how long
// recent answers were, and every replica reserves with what the store
// learned from all of them.
const (
	// LearnWindow is how many recent answers an estimate is taken over.
	LearnWindow = 64
	// LearnMinSamples is how many answers are known before an estimate
	// is given.
	LearnMinSamples = 8
	// LearnPercentile is the share of recent answers (in percent) the
	// estimate bounds.
	LearnPercentile = 98
)

// LearnedEstimate is the completion estimate learned from recent answer
// sizes: their LearnPercentile-th percentile (nearest rank), an upper bound
// of all of them but the longest one in fifty, so that one very long answer
// does not inflate every reservation. It is 0 with fewer than
// LearnMinSamples samples. Only the last LearnWindow samples count.
//
// An answer longer than the estimate is charged what it used: the budget
// can be overshot by the excess of the answers in flight, as with any
// estimate that is not an upper bound (see docs/budget.md).
func LearnedEstimate(samples []int64) int64 {
	if len(samples) > LearnWindow {
		samples = samples[len(samples)-LearnWindow:]
	}
	n := len(samples)
	if n < LearnMinSamples {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := (LearnPercentile*n + 99) / 100 // ceil(p·n/100), 1-based
	return max(s[rank-1], 1)
}

// maxLearned bounds the estimates a Manager remembers: its keys are the
// tenants and models callers pass.
const maxLearned = 10_000

// learnedKey names one learned estimate.
type learnedKey struct{ tenant, model string }

// learnedCache is what the store said last about each tenant and model's
// learned estimate, so that the next request reserves with it.
type learnedCache struct {
	mu sync.Mutex // protects m
	m  map[learnedKey]int64
}

func (c *learnedCache) get(tenant, model string) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[learnedKey{tenant, model}]
	return v, ok
}

// set records v (0 = nothing learned) and reports whether it changed.
func (c *learnedCache) set(tenant, model string, v int64) bool {
	k := learnedKey{tenant, model}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.m[k]
	switch {
	case v <= 0:
		delete(c.m, k)
		return ok
	case ok && old == v:
		return false
	}
	if c.m == nil {
		c.m = make(map[learnedKey]int64)
	}
	if !ok && len(c.m) >= maxLearned {
		clear(c.m) // rare: relearned from the next replies
	}
	c.m[k] = v
	return true
}

// Learned returns the completion estimate the store last reported for
// requests of tenant that reserve with model (see LearnedEstimate), and
// whether it knows one. Pass it as the completion of an estimate for a
// request without a bound on its completion; ReserveWaitFunc reads it
// again before each attempt.
func (m *Manager) Learned(tenant, model string) (int64, bool) {
	return m.learned.get(tenant, model)
}

package gateway

import "sync"

// A request without max_tokens may use up to the model's whole output, so
// its reservation needs a guess. A fixed guess (Options.CompletionEstimate,
// 256) held most of a small budget in reservations that settled far lower:
// requests were refused while the budget had room. completionEstimates
// guesses from what recent requests of the same tenant and model really
// used instead.
const (
	// estimateWindow is how many recent completions each estimate is
	// taken over.
	estimateWindow = 64
	// estimateMinSamples is how many completions are seen before the
	// learned estimate replaces the configured one.
	estimateMinSamples = 8
)

// completionEstimates holds, per tenant and model, the completion tokens
// of the last estimateWindow requests that did not set max_tokens. The
// estimate is the largest of them: an upper bound on every one of them, so
// a budget is overshot only by a request longer than any recent one. Its
// keys are configured tenants and routed models, so it stays small.
type completionEstimates struct {
	mu sync.Mutex // protects m
	m  map[estimateKey]*completionWindow
}

type estimateKey struct{ tenant, model string }

// completionWindow is a ring of recent completion sizes.
type completionWindow struct {
	n       int // samples seen, up to estimateWindow
	next    int // where the next sample goes
	samples [estimateWindow]int64
}

// get returns the completion tokens to reserve for one choice of a request
// of tenant on model: the learned estimate, or def until enough requests
// were seen.
func (e *completionEstimates) get(tenant, model string, def int64) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	w := e.m[estimateKey{tenant, model}]
	if w == nil || w.n < estimateMinSamples {
		return def
	}
	top := int64(1)
	for _, s := range w.samples[:w.n] {
		top = max(top, s)
	}
	return top
}

// observe records the completion tokens one choice of a request used.
func (e *completionEstimates) observe(tenant, model string, tokens int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = make(map[estimateKey]*completionWindow)
	}
	k := estimateKey{tenant, model}
	w := e.m[k]
	if w == nil {
		w = &completionWindow{}
		e.m[k] = w
	}
	w.samples[w.next] = tokens
	w.next = (w.next + 1) % estimateWindow
	w.n = min(w.n+1, estimateWindow)
}

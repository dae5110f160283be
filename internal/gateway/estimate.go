package gateway

import (
	"slices"
	"sync"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/jsonscan"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/tokens"
)

// A request without max_tokens may use up to the model's whole output, so
// its reservation needs a guess. A fixed guess (Options.CompletionEstimate,
// 256) held most of a small budget in reservations that settled far lower:
// requests were refused while the budget had room. So the guess is learned
// from what recent requests of the same tenant and model really used: for
// a tenant with a budget, from the answers of every replica, through the
// budget store (budget.Manager.Learned: the store learns from each settle
// and tells each reserve); for the others, and until the store knows, from
// this replica's own answers (completionEstimates). Both take the same
// percentile (budget.LearnedEstimate) over the same number of answers.

// completionEstimates holds, per tenant and model, the completion tokens
// of the last budget.LearnWindow requests that did not set max_tokens, and
// the budget.LearnPercentile-th percentile of them: a bound of all but the
// longest answer in fifty, so that one very long answer does not inflate
// every reservation. Its keys are configured tenants and routed models, so
// it stays small.
type completionEstimates struct {
	mu sync.Mutex // protects m
	m  map[estimateKey]*completionWindow
}

type estimateKey struct{ tenant, model string }

// completionWindow is a ring of recent completion sizes, and the same
// sizes sorted, kept up to date one sample at a time.
type completionWindow struct {
	n       int // samples seen, up to budget.LearnWindow
	next    int // where the next sample goes
	samples [budget.LearnWindow]int64
	sorted  [budget.LearnWindow]int64 // samples[:n], ascending
}

// get returns the completion tokens to reserve for one choice of a request
// of tenant on model: the learned estimate, or def until enough requests
// were seen.
func (e *completionEstimates) get(tenant, model string, def int64) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	w := e.m[estimateKey{tenant, model}]
	if w == nil || w.n < budget.LearnMinSamples {
		return def
	}
	rank := (budget.LearnPercentile*w.n + 99) / 100 // as budget.LearnedEstimate
	return max(w.sorted[rank-1], 1)
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
	sorted := w.sorted[:w.n]
	if w.n == budget.LearnWindow {
		// The oldest sample leaves.
		i, _ := slices.BinarySearch(sorted, w.samples[w.next])
		sorted = slices.Delete(sorted, i, i+1)
	}
	i, _ := slices.BinarySearch(sorted, tokens)
	sorted = slices.Insert(sorted, i, tokens)
	w.n = len(sorted)
	w.samples[w.next] = tokens
	w.next = (w.next + 1) % budget.LearnWindow
}

// completionGuess is the completion tokens reserved for one choice of c,
// a request that sets no max_tokens: what the budget store learned for c's
// tenant and model, else what this replica learned, else the configured
// guess.
func (g *Gateway) completionGuess(c *call) int64 {
	if c.tenant.capped() {
		if n, ok := g.opt.Budgets.Learned(c.tenant.Name, c.priceModel()); ok {
			return n
		}
	}
	return g.estimates.get(c.tenant.Name, c.req.Model, g.opt.Admission.CompletionEstimate)
}

// estimate sets the tokens reserved before the call: the prompt as the
// provider will count it, plus the most the completion may use.
func (g *Gateway) estimate(c *call) {
	req := c.req
	switch req.Endpoint {
	case openai.ChatCompletions:
		c.promptEstimate = int64(tokens.Chat(req.Model, req.Messages, req.Tools))
	case openai.Responses:
		c.promptEstimate = responsesPrompt(req)
	case openai.Messages:
		c.promptEstimate = messagesPrompt(req)
	default:
		c.promptEstimate = int64(tokens.Input(req.Model, req.Input))
	}
	g.estimateCompletion(c)
}

// estimateCompletion sets the most c's completion may use: max_tokens, or
// for a chat completion without it the largest recent one of its tenant
// and model. Called again while c waits for budget, as recent answers
// teach more.
func (g *Gateway) estimateCompletion(c *call) {
	req := c.req
	if req.Endpoint == openai.Embeddings {
		return
	}
	per := req.MaxTokens
	switch {
	case per > 0:
	case req.Endpoint == openai.Completions:
		per = 16 // the legacy API's default max_tokens
	default:
		per = g.completionGuess(c)
	}
	c.completionEstimate = per * req.N
}

// learnCompletion records what a chat completion without max_tokens really
// used, for the estimates of the next ones, and returns it per choice (0
// when it teaches nothing), for the budget store to learn from. Only whole
// answers count: a cut stream says nothing about how long answers are.
func (g *Gateway) learnCompletion(c *call, usage *openai.Usage) int64 {
	req := c.req
	if usage == nil || req.MaxTokens > 0 || (req.Endpoint != openai.ChatCompletions && req.Endpoint != openai.Responses) || c.outcome != "ok" {
		return 0
	}
	per := (usage.CompletionTokens + req.N - 1) / req.N
	g.estimates.observe(c.tenant.Name, req.Model, per)
	return per
}

// responsesPrompt estimates a Responses request's input: its instructions
// and its input, a string or items in the chat format (message items count
// as chat messages). A continuation's earlier turns, which the provider
// reads again, are not known here: the settle corrects them.
func responsesPrompt(req *openai.Request) int64 {
	n := 0
	if s, ok := jsonscan.String(req.Instructions); ok {
		n += tokens.Text(req.Model, s) + 4 // a system message's wrapping
	}
	in := jsonscan.TrimSpace(req.Input)
	switch {
	case len(in) > 0 && in[0] == '[':
		n += tokens.Chat(req.Model, in, req.Tools)
	case len(in) > 0:
		n += tokens.Input(req.Model, in) + 7 // one user message and the reply's priming
	}
	return int64(n)
}

// messagesPrompt estimates a Messages request's input: its messages and
// tools counted as chat messages with OpenAI's encodings, and its system
// prompt. Anthropic's tokenizer is not public: this is an approximation
// (see docs/gateway.md for its measured error).
func messagesPrompt(req *openai.Request) int64 {
	n := tokens.Chat(req.Model, req.Messages, req.Tools)
	if sys := jsonscan.TrimSpace(req.Instructions); len(sys) > 0 {
		if s, ok := jsonscan.String(sys); ok {
			n += tokens.Text(req.Model, s) + 4
		} else {
			n += tokens.Input(req.Model, sys) + 4 // text blocks
		}
	}
	return int64(n)
}

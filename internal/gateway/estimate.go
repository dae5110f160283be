package gateway

import (
	"sync"

	"github.com/llmgate/llmgate/internal/jsonscan"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/tokens"
)

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
		per = g.estimates.get(c.tenant.Name, req.Model, g.opt.Admission.CompletionEstimate)
	}
	c.completionEstimate = per * req.N
}

// learnCompletion records what a chat completion without max_tokens really used,
// for the estimates of the next ones. Only whole answers count: a cut
// stream says nothing about how long answers are.
func (g *Gateway) learnCompletion(c *call, usage *openai.Usage) {
	req := c.req
	if usage == nil || req.MaxTokens > 0 || (req.Endpoint != openai.ChatCompletions && req.Endpoint != openai.Responses) || c.outcome != "ok" {
		return
	}
	g.estimates.observe(c.tenant.Name, req.Model, (usage.CompletionTokens+req.N-1)/req.N)
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

// Package sim is a simulated OpenAI-compatible provider for demos, tests and benchmarks: deterministic answers, configurable latency, and rate limits enforced the way the real one does.
//
// A Server answers POST /v1/chat/completions, POST /v1/completions and
// POST /v1/responses (JSON and SSE streaming; stored responses answer GET
// and DELETE /v1/responses/{id}), POST /v1/embeddings, GET /v1/models, GET
// /v1/models/{model} and GET /stats. Answers depend only on the model and
// the prompt; prompt tokens are counted as OpenAI bills them (package
// internal/tokens). Each (API key, model) pair has its own RPM and TPM
// buckets and each API key its own concurrency limit; requests over a
// limit get OpenAI's 429 with retry-after and x-ratelimit-* headers.
// Faults (500/503 answers, streams cut halfway) are injected at configured
// rates. See docs/mock.md.
package sim

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors returned by New.
var (
	// ErrInvalidConfig wraps every problem Config.Validate finds.
	ErrInvalidConfig = errors.New("sim: invalid config")
)

// modelCreated is the "created" time reported for every model.
const modelCreated = 1686935002

// KeyStats counts what the server did for one API key (or all of them).
type KeyStats struct {
	// Calls are requests answered 200 (a stream counts when it starts).
	Calls int64 `json:"calls"`
	// RateLimited are 429 answers (RPM, TPM or concurrency).
	RateLimited int64 `json:"rate_limited"`
	// ErrorsInjected are the 500 and 503 answers injected by ErrorRate.
	ErrorsInjected int64 `json:"errors_injected"`
	// StreamsDropped are streams cut halfway by DropRate.
	StreamsDropped int64 `json:"streams_dropped"`
	// PromptTokens and CompletionTokens are the tokens of answered calls
	// (completion tokens as they were sent).
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

func (k *KeyStats) add(o KeyStats) {
	k.Calls += o.Calls
	k.RateLimited += o.RateLimited
	k.ErrorsInjected += o.ErrorsInjected
	k.StreamsDropped += o.StreamsDropped
	k.PromptTokens += o.PromptTokens
	k.CompletionTokens += o.CompletionTokens
}

// Stats is what GET /stats answers. Keys are labelled "anonymous" (no
// Authorization header) or "key-" and the first 8 hex digits of the
// key's SHA-256, so that keys never appear in the output.
type Stats struct {
	Total KeyStats            `json:"total"`
	Keys  map[string]KeyStats `json:"keys"`
}

type scopeKey struct{ key, model string }

// Server is a simulated provider. Create it with New; it is safe for
// concurrent use.
type Server struct {
	cfg   Config
	chat  map[string]bool
	embed map[string]bool
	mux   *http.ServeMux
	seq   atomic.Uint64

	rmu sync.Mutex // protects rng
	rng *rand.Rand

	responses      responseStore
	files, batches objects

	mu       sync.Mutex // protects scopes, aScopes, inflight, stats
	scopes   map[scopeKey]*scopeLimits
	aScopes  map[scopeKey]*anthropicLimits
	inflight map[string]int64
	stats    map[string]*KeyStats
}

// New checks cfg, fills in its defaults and returns a Server.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	cfg = cfg.withDefaults()
	seed := cfg.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	s := &Server{
		cfg:      cfg,
		chat:     map[string]bool{},
		embed:    map[string]bool{},
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		scopes:   map[scopeKey]*scopeLimits{},
		aScopes:  map[scopeKey]*anthropicLimits{},
		inflight: map[string]int64{},
		stats:    map[string]*KeyStats{},
	}
	for _, m := range cfg.Models {
		s.chat[m] = true
	}
	for _, m := range cfg.EmbeddingModels {
		s.embed[m] = true
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	s.mux.HandleFunc("POST /v1/completions", s.handleCompletion)
	s.mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	s.mux.HandleFunc("POST /v1/responses", s.handleResponses)
	s.mux.HandleFunc("GET /v1/responses/{id}", s.handleGetResponse)
	s.mux.HandleFunc("DELETE /v1/responses/{id}", s.handleDeleteResponse)
	s.mux.HandleFunc("GET /v1/models", s.handleModels)
	s.mux.HandleFunc("GET /v1/models/{model}", s.handleModel)
	s.mux.HandleFunc("POST /v1/messages", s.handleMessages)
	s.mux.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
	s.mux.HandleFunc("/openai/deployments/{deployment}/{rest...}", s.handleAzure)
	s.otherRoutes()
	s.mux.HandleFunc("GET /stats", s.handleStats)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "",
			fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path))
	})
	return s, nil
}

// Handler returns the HTTP handler of the simulated API.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-request-id", fmt.Sprintf("req_sim%016x", s.seq.Add(1)))
		s.mux.ServeHTTP(w, r)
	})
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Keys: make(map[string]KeyStats, len(s.stats))}
	for k, v := range s.stats {
		st.Keys[k] = *v
		st.Total.add(*v)
	}
	return st
}

// count applies f to the counters of key.
func (s *Server) count(key string, f func(*KeyStats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.statsLocked(key))
}

func (s *Server) statsLocked(key string) *KeyStats {
	st := s.stats[key]
	if st == nil {
		st = &KeyStats{}
		s.stats[key] = st
	}
	return st
}

func (s *Server) float() float64 {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return s.rng.Float64()
}

// jittered scales d by a uniform random factor in [1-Jitter, 1+Jitter].
func (s *Server) jittered(d time.Duration) time.Duration {
	if d <= 0 || s.cfg.Jitter == 0 {
		return d
	}
	return time.Duration(float64(d) * (1 + s.cfg.Jitter*(2*s.float()-1)))
}

// sleep waits d (jittered) or until ctx ends; it reports whether ctx is
// still alive.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	if d = s.jittered(d); d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// authenticate checks the bearer token and returns the key's stats label.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (string, bool) {
	auth := r.Header.Get("Authorization")
	token, hasBearer := strings.CutPrefix(auth, "Bearer ")
	token = strings.TrimSpace(token)
	if !hasBearer {
		// Anthropic's (its OpenAI-compatible routes too) and Azure's
		// key headers.
		for _, h := range [...]string{"X-Api-Key", "Api-Key"} {
			if v := strings.TrimSpace(r.Header.Get(h)); v != "" {
				token, hasBearer = v, true
				break
			}
		}
	}
	if len(s.cfg.APIKeys) > 0 {
		if !hasBearer || token == "" {
			writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "",
				"You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
			return "", false
		}
		ok := 0
		for _, k := range s.cfg.APIKeys {
			ok |= subtle.ConstantTimeCompare([]byte(k), []byte(token))
		}
		if ok == 0 {
			writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "",
				"Incorrect API key provided. The simulator accepts only the keys it was configured with.")
			return "", false
		}
	}
	if token == "" {
		return "anonymous", true
	}
	sum := sha256.Sum256([]byte(token))
	return "key-" + hex.EncodeToString(sum[:4]), true
}

// readBody reads the request body, answering 413 over the size limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	tooLarge := func() ([]byte, bool) {
		writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
			fmt.Sprintf("The request body is larger than the simulator's limit of %d bytes.", s.cfg.MaxBodyBytes))
		return nil, false
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return tooLarge()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return tooLarge()
	case err != nil:
		invalidRequest(w, "", "The request body could not be read.")
		return nil, false
	}
	return body, true
}

// admit applies the concurrency, RPM and TPM limits of (key, model) to a
// request of cost tokens. It writes the x-ratelimit-* headers, and the 429
// when the request is refused. On success the caller must call release.
func (s *Server) admit(w http.ResponseWriter, key, model string, cost int64) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock.Now()
	sk := scopeKey{key, model}
	sl := s.scopes[sk]
	if sl == nil {
		sl = &scopeLimits{}
		if s.cfg.RPM > 0 {
			sl.req = newBucket(s.cfg.RPM, now)
		}
		if s.cfg.TPM > 0 {
			sl.tok = newBucket(s.cfg.TPM, now)
		}
		s.scopes[sk] = sl
	}
	var d *denial
	if c := s.cfg.Concurrency; c > 0 && s.inflight[key] >= c {
		d = &denial{kind: "requests", retryAfter: time.Second, message: fmt.Sprintf(
			"Rate limit reached for %s in organization org-sim on concurrent requests: Limit %d, In flight %d, Requested 1. Please try again once a request completes.",
			model, c, s.inflight[key])}
		for _, b := range []*bucket{sl.req, sl.tok} {
			if b != nil {
				b.refill(now)
			}
		}
	} else {
		d = admitLocked(sl, model, cost, now)
	}
	setRateHeadersLocked(w.Header(), sl)
	if d != nil {
		s.statsLocked(key).RateLimited++
		if d.retryAfter > 0 {
			setRetryAfter(w.Header(), d.retryAfter)
		}
		writeError(w, http.StatusTooManyRequests, d.kind, "rate_limit_exceeded", "", d.message)
		return nil, false
	}
	s.inflight[key]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.inflight[key]--
	}, true
}

// injectFault answers an injected 500 or 503 at the configured rate.
func (s *Server) injectFault(w http.ResponseWriter, key string) bool {
	if s.cfg.ErrorRate <= 0 || s.float() >= s.cfg.ErrorRate {
		return false
	}
	s.count(key, func(k *KeyStats) { k.ErrorsInjected++ })
	if s.float() < 0.5 {
		writeError(w, http.StatusInternalServerError, "server_error", "", "",
			"The server had an error while processing your request. Sorry about that! (injected by the simulator)")
	} else {
		writeError(w, http.StatusServiceUnavailable, "server_error", "", "",
			"The engine is currently overloaded, please try again later. (injected by the simulator)")
	}
	return true
}

type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

type chatMessage struct {
	Role    string  `json:"role"`
	Content string  `json:"content"`
	Refusal *string `json:"refusal"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      chatMessage     `json:"message"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	Usage             usage        `json:"usage"`
	SystemFingerprint string       `json:"system_fingerprint"`
}

type chunkDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chunkChoice struct {
	Index        int             `json:"index"`
	Delta        chunkDelta      `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type chatChunk struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	SystemFingerprint string          `json:"system_fingerprint"`
	Choices           []chunkChoice   `json:"choices"`
	Usage             json.RawMessage `json:"usage,omitempty"`
}

var jsonNull = json.RawMessage("null")

// acceptChatModel authenticates r, reads and parses its body, and checks
// that it asks for a chat model. It returns the caller's key and the
// request; false means the error was answered.
func acceptChatModel[T any](s *Server, w http.ResponseWriter, r *http.Request, parse func([]byte) (*T, *reqError), model func(*T) string) (string, *T, bool) {
	key, ok := s.authenticate(w, r)
	if !ok {
		return "", nil, false
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return "", nil, false
	}
	req, rerr := parse(body)
	if rerr != nil {
		rerr.write(w)
		return "", nil, false
	}
	if m := model(req); !s.chat[m] {
		modelNotFound(w, m)
		return "", nil, false
	}
	return key, req, true
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	key, req, ok := acceptChatModel(s, w, r, parseChatRequest, func(r *chatRequest) string { return r.Model })
	if !ok {
		return
	}
	prompt := chatPromptTokens(req)
	words := answerWords(answerSeed(req.Model, req.Messages))
	finish := "stop"
	limit := req.maxTokens()
	if limit > 0 && limit < int64(len(words)) {
		words, finish = words[:limit], "length"
	}
	// TPM cost, as OpenAI counts it: the prompt estimate plus max_tokens;
	// without max_tokens, the answer's own length.
	cost := prompt + int64(len(words))
	if limit > 0 {
		cost = prompt + min(limit, math.MaxInt64-prompt) // saturate: max_tokens may be huge
	}
	release, ok := s.admit(w, key, req.Model, cost)
	if !ok {
		return
	}
	defer release()
	if s.injectFault(w, key) {
		return
	}
	id := fmt.Sprintf("chatcmpl-sim%016x", s.seq.Add(1))
	created := time.Now().Unix()
	ctx := r.Context()
	if !req.Stream {
		// The same total as a stream: the first token after TTFT, each
		// later one TokenDelay after the one before.
		if !s.sleep(ctx, s.cfg.TTFT+time.Duration(len(words)-1)*s.cfg.TokenDelay) {
			return
		}
		n := int64(len(words))
		s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += prompt; k.CompletionTokens += n })
		writeJSON(w, http.StatusOK, chatCompletion{
			ID: id, Object: "chat.completion", Created: created, Model: req.Model,
			Choices:           []chatChoice{{Message: chatMessage{Role: "assistant", Content: joinWords(words)}, Logprobs: jsonNull, FinishReason: finish}},
			Usage:             usage{PromptTokens: prompt, CompletionTokens: n, TotalTokens: prompt + n},
			SystemFingerprint: "fp_sim",
		})
		return
	}
	s.stream(ctx, w, key, id, created, req, words, finish, prompt)
}

// sse writes server-sent events, each flushed as it is written.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startSSE sends the 200 and the event-stream headers.
func startSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	e := &sse{w: w, rc: http.NewResponseController(w)}
	_ = e.rc.Flush()
	return e
}

// send writes v as one "data:" event; false means the client is gone.
func (e *sse) send(v any) bool {
	b, _ := json.Marshal(v)
	if _, err := fmt.Fprintf(e.w, "data: %s\n\n", b); err != nil {
		return false
	}
	if err := e.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	return true
}

func (e *sse) done() {
	_, _ = io.WriteString(e.w, "data: [DONE]\n\n")
	_ = e.rc.Flush()
}

// dropAt is the index of the token before which a stream of n tokens is cut
// (DropRate), or -1.
func (s *Server) dropAt(n int) int {
	if s.cfg.DropRate > 0 && s.float() < s.cfg.DropRate {
		return n / 2
	}
	return -1
}

// drop cuts the connection: the documented way from a handler, which
// net/http recovers without logging.
func (s *Server) drop(key string) {
	s.count(key, func(k *KeyStats) { k.StreamsDropped++ })
	panic(http.ErrAbortHandler)
}

// stream sends the answer as OpenAI's server-sent events, one flushed event
// per token.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, key, id string, created int64, req *chatRequest, words []string, finish string, prompt int64) {
	drop := s.dropAt(len(words))
	ev := startSSE(w)
	s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += prompt })

	var u json.RawMessage
	if req.includeUsage() {
		u = jsonNull
	}
	send := func(choices []chunkChoice, usage json.RawMessage) bool {
		return ev.send(chatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: req.Model,
			SystemFingerprint: "fp_sim", Choices: choices, Usage: usage})
	}
	if !s.sleep(ctx, s.cfg.TTFT) {
		return
	}
	empty := ""
	if !send([]chunkChoice{{Delta: chunkDelta{Role: "assistant", Content: &empty}, Logprobs: jsonNull}}, u) {
		return
	}
	for i, word := range words {
		if i == drop {
			s.drop(key)
		}
		if i > 0 {
			if !s.sleep(ctx, s.cfg.TokenDelay) {
				return
			}
			word = " " + word
		}
		// Counted before it is written, so that a client that has read a
		// token always finds it in /stats.
		s.count(key, func(k *KeyStats) { k.CompletionTokens++ })
		if !send([]chunkChoice{{Delta: chunkDelta{Content: &word}, Logprobs: jsonNull}}, u) {
			return
		}
	}
	if !send([]chunkChoice{{Delta: chunkDelta{}, Logprobs: jsonNull, FinishReason: &finish}}, u) {
		return
	}
	if req.includeUsage() {
		n := int64(len(words))
		b, _ := json.Marshal(usage{PromptTokens: prompt, CompletionTokens: n, TotalTokens: prompt + n})
		if !send([]chunkChoice{}, b) {
			return
		}
	}
	ev.done()
}

type textChoice struct {
	Text         string          `json:"text"`
	Index        int             `json:"index"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

// textCompletion is a legacy completion, or one chunk of its stream.
type textCompletion struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	SystemFingerprint string          `json:"system_fingerprint"`
	Choices           []textChoice    `json:"choices"`
	Usage             json.RawMessage `json:"usage,omitempty"`
}

// completionAnswer is the simulated continuation of one prompt.
type completionAnswer struct {
	words  []string
	finish string
}

// handleCompletion serves legacy completions: one choice per prompt, each
// a deterministic continuation of its prompt, under the same limits and
// faults as chat. The chat models serve this endpoint too.
func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	key, req, ok := acceptChatModel(s, w, r, parseCompletionRequest, func(r *completionRequest) string { return r.Model })
	if !ok {
		return
	}
	limit := req.maxTokens()
	answers := make([]completionAnswer, len(req.prompts))
	for i, p := range req.prompts {
		a := completionAnswer{words: answerWords(completionSeed(req.Model, p)), finish: "stop"}
		if limit < int64(len(a.words)) {
			a.words, a.finish = a.words[:limit], "length"
		}
		answers[i] = a
	}
	// TPM cost, as OpenAI counts it: the prompts plus max_tokens for each.
	prompt := req.tokens
	cost := prompt + min(limit, (math.MaxInt64-prompt)/int64(len(answers)))*int64(len(answers))
	release, ok := s.admit(w, key, req.Model, cost)
	if !ok {
		return
	}
	defer release()
	if s.injectFault(w, key) {
		return
	}
	id := fmt.Sprintf("cmpl-sim%016x", s.seq.Add(1))
	created := time.Now().Unix()
	ctx := r.Context()
	var n int64
	longest := 0
	for _, a := range answers {
		n += int64(len(a.words))
		longest = max(longest, len(a.words))
	}
	if !req.Stream {
		// The choices are generated side by side: the longest sets the time.
		if !s.sleep(ctx, s.cfg.TTFT+time.Duration(longest-1)*s.cfg.TokenDelay) {
			return
		}
		resp := textCompletion{ID: id, Object: "text_completion", Created: created, Model: req.Model, SystemFingerprint: "fp_sim"}
		for i, a := range answers {
			resp.Choices = append(resp.Choices, textChoice{Text: " " + joinWords(a.words), Index: i, Logprobs: jsonNull, FinishReason: &a.finish})
		}
		resp.Usage, _ = json.Marshal(usage{PromptTokens: prompt, CompletionTokens: n, TotalTokens: prompt + n})
		s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += prompt; k.CompletionTokens += n })
		writeJSON(w, http.StatusOK, resp)
		return
	}
	s.streamCompletion(ctx, w, key, id, created, req, answers, prompt)
}

// streamCompletion sends legacy completion chunks: each choice's tokens in
// turn, each with a leading space, then its finish_reason; with
// include_usage, a final chunk with no choices and the usage.
func (s *Server) streamCompletion(ctx context.Context, w http.ResponseWriter, key, id string, created int64, req *completionRequest, answers []completionAnswer, prompt int64) {
	total := 0
	for _, a := range answers {
		total += len(a.words)
	}
	drop := s.dropAt(total)
	ev := startSSE(w)
	s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += prompt })

	var u json.RawMessage
	if req.includeUsage() {
		u = jsonNull
	}
	send := func(c textChoice) bool {
		return ev.send(textCompletion{ID: id, Object: "text_completion", Created: created, Model: req.Model,
			SystemFingerprint: "fp_sim", Choices: []textChoice{c}, Usage: u})
	}
	if !s.sleep(ctx, s.cfg.TTFT) {
		return
	}
	sent := 0
	for i, a := range answers {
		for _, word := range a.words {
			if sent == drop {
				s.drop(key)
			}
			if sent > 0 && !s.sleep(ctx, s.cfg.TokenDelay) {
				return
			}
			sent++
			s.count(key, func(k *KeyStats) { k.CompletionTokens++ })
			if !send(textChoice{Text: " " + word, Index: i, Logprobs: jsonNull}) {
				return
			}
		}
		if !send(textChoice{Text: "", Index: i, Logprobs: jsonNull, FinishReason: &a.finish}) {
			return
		}
	}
	if req.includeUsage() {
		n := int64(total)
		b, _ := json.Marshal(usage{PromptTokens: prompt, CompletionTokens: n, TotalTokens: prompt + n})
		if !ev.send(textCompletion{ID: id, Object: "text_completion", Created: created, Model: req.Model,
			SystemFingerprint: "fp_sim", Choices: []textChoice{}, Usage: b}) {
			return
		}
	}
	ev.done()
}

func modelNotFound(w http.ResponseWriter, model string) {
	writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "",
		fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model))
}

type embeddingData struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"`
}

type embeddingResponse struct {
	Object string          `json:"object"`
	Data   []embeddingData `json:"data"`
	Model  string          `json:"model"`
	Usage  struct {
		PromptTokens int64 `json:"prompt_tokens"`
		TotalTokens  int64 `json:"total_tokens"`
	} `json:"usage"`
}

func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	key, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, rerr := parseEmbeddingRequest(body)
	if rerr != nil {
		rerr.write(w)
		return
	}
	if !s.embed[req.Model] {
		modelNotFound(w, req.Model)
		return
	}
	release, ok := s.admit(w, key, req.Model, req.tokens)
	if !ok {
		return
	}
	defer release()
	if s.injectFault(w, key) {
		return
	}
	if !s.sleep(r.Context(), s.cfg.TTFT) {
		return
	}
	dims := s.cfg.EmbeddingDimensions
	if req.Dimensions != nil {
		dims = *req.Dimensions
	}
	resp := embeddingResponse{Object: "list", Model: req.Model, Data: make([]embeddingData, len(req.inputs))}
	for i, in := range req.inputs {
		v := embedding(req.Model, in, dims)
		var e any = v
		if req.EncodingFormat == "base64" {
			b := make([]byte, 4*len(v))
			for j, x := range v {
				binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(x))
			}
			e = base64.StdEncoding.EncodeToString(b)
		}
		resp.Data[i] = embeddingData{Object: "embedding", Index: i, Embedding: e}
	}
	resp.Usage.PromptTokens, resp.Usage.TotalTokens = req.tokens, req.tokens
	s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += req.tokens })
	writeJSON(w, http.StatusOK, resp)
}

type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authenticate(w, r); !ok {
		return
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, id := range append(append([]string(nil), s.cfg.Models...), s.cfg.EmbeddingModels...) {
		list.Data = append(list.Data, model{ID: id, Object: "model", Created: modelCreated, OwnedBy: "system"})
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authenticate(w, r); !ok {
		return
	}
	id := r.PathValue("model")
	if !s.chat[id] && !s.embed[id] {
		modelNotFound(w, id)
		return
	}
	writeJSON(w, http.StatusOK, model{ID: id, Object: "model", Created: modelCreated, OwnedBy: "system"})
}

func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Stats())
}

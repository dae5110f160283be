package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmgate/llmgate/internal/tokens"
)

// Anthropic's Messages API, as the simulator plays it: x-api-key and
// anthropic-version, its JSON and event stream, its rate limits (requests,
// input and output tokens per minute) with anthropic-ratelimit-* headers,
// 429 rate_limit_error with retry-after, and 529 overloaded_error among the
// injected faults.

// writeAnthropicError answers status with Anthropic's error shape.
func writeAnthropicError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}

// messagesRequest is the part of a Messages request the simulator reads.
type messagesRequest struct {
	Model     string          `json:"model"`
	Messages  []message       `json:"messages"`
	System    json.RawMessage `json:"system"`
	MaxTokens *int64          `json:"max_tokens"`
	Stream    bool            `json:"stream"`
	// The raw values that cost input tokens.
	rawMessages, rawTools json.RawMessage
	system                string
}

// parseMessagesRequest decodes and checks a Messages body; errors are in
// Anthropic's words.
func parseMessagesRequest(body []byte, countOnly bool) (*messagesRequest, string) {
	var r messagesRequest
	if e := decodeJSON(body, &r); e != nil {
		return nil, e.msg
	}
	if r.Model == "" {
		return nil, "model: Field required"
	}
	if len(r.Messages) == 0 {
		return nil, "messages: at least one message is required"
	}
	for i := range r.Messages {
		m := &r.Messages[i]
		if m.Role != "user" && m.Role != "assistant" {
			return nil, fmt.Sprintf("messages.%d.role: Input should be 'user' or 'assistant'", i)
		}
		text, ok := contentText(m.Content)
		if !ok {
			return nil, fmt.Sprintf("messages.%d.content: Input should be a valid string or list", i)
		}
		m.text = text
	}
	if !countOnly {
		if r.MaxTokens == nil {
			return nil, "max_tokens: Field required"
		}
		if *r.MaxTokens < 1 {
			return nil, "max_tokens: Input should be greater than or equal to 1"
		}
	}
	if sys := bytes.TrimSpace(r.System); len(sys) > 0 && !bytes.Equal(sys, []byte("null")) {
		text, ok := contentText(sys)
		if !ok {
			return nil, "system: Input should be a valid string or list"
		}
		r.system = text
	}
	var pc promptCost
	_ = json.Unmarshal(body, &pc)
	r.rawMessages, r.rawTools = pc.Messages, pc.Tools
	return &r, ""
}

// inputTokens is what the request's input costs: its messages and tools as
// chat messages, and its system prompt.
func (r *messagesRequest) inputTokens() int64 {
	n := int64(tokens.Chat(r.Model, r.rawMessages, r.rawTools))
	if r.system != "" {
		n += int64(tokens.Text(r.Model, r.system)) + 4
	}
	return n
}

// anthropicLimits are the buckets of one (key, model) pair on
// /v1/messages; nil = unlimited.
type anthropicLimits struct {
	req, in, out *bucket
}

// acceptMessages authenticates r (x-api-key) and checks its
// anthropic-version; false means the error was answered.
func (s *Server) acceptMessages(w http.ResponseWriter, r *http.Request) (string, bool) {
	if r.Header.Get("X-Api-Key") == "" && len(s.cfg.APIKeys) > 0 {
		writeAnthropicError(w, http.StatusUnauthorized, "authentication_error", "x-api-key header is required")
		return "", false
	}
	if r.Header.Get("Anthropic-Version") == "" {
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", "anthropic-version: header is required")
		return "", false
	}
	rec := &statusRecorder{ResponseWriter: w}
	key, ok := s.authenticate(rec, r)
	if !ok {
		writeAnthropicError(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key")
		return "", false
	}
	return key, true
}

// statusRecorder swallows what authenticate writes, so that the caller
// can answer in Anthropic's shape instead.
type statusRecorder struct {
	http.ResponseWriter
	h http.Header
}

func (s *statusRecorder) Header() http.Header {
	if s.h == nil {
		s.h = http.Header{}
	}
	return s.h
}
func (s *statusRecorder) WriteHeader(int)             {}
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }

// admitMessages applies RPM, ITPM and OTPM of (key, model) to a request
// of input tokens and max output tokens, writes the
// anthropic-ratelimit-* headers, and the 429 when refused. On success the
// caller must call done with the output tokens really generated.
func (s *Server) admitMessages(w http.ResponseWriter, key, model string, input, maxOut int64) (done func(out int64), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock.Now()
	sk := scopeKey{key, model}
	al := s.aScopes[sk]
	if al == nil {
		al = &anthropicLimits{}
		if s.cfg.RPM > 0 {
			al.req = newBucket(s.cfg.RPM, now)
		}
		if s.cfg.ITPM > 0 {
			al.in = newBucket(s.cfg.ITPM, now)
		}
		if s.cfg.OTPM > 0 {
			al.out = newBucket(s.cfg.OTPM, now)
		}
		s.aScopes[sk] = al
	}
	for _, b := range []*bucket{al.req, al.in, al.out} {
		if b != nil {
			b.refill(now)
		}
	}
	var why string
	var wait time.Duration
	for _, c := range []struct {
		b    *bucket
		cost int64
		what string
	}{{al.req, 1, "requests"}, {al.in, input, "input tokens"}, {al.out, maxOut, "output tokens"}} {
		if c.b == nil {
			continue
		}
		if float64(c.cost) > c.b.limit {
			why = fmt.Sprintf("This request would exceed your organization's rate limit of %d %s per minute for %s, whatever the wait: reduce the prompt or max_tokens.", int64(c.b.limit), c.what, model)
			break
		}
		if d := c.b.wait(float64(c.cost)); d > 0 {
			why, wait = fmt.Sprintf("This request would exceed your organization's rate limit of %d %s per minute for %s. Please try again later.", int64(c.b.limit), c.what, model), d
			break
		}
	}
	if why == "" && s.cfg.Concurrency > 0 && s.inflight[key] >= s.cfg.Concurrency {
		why, wait = "Number of concurrent connections has exceeded your rate limit.", time.Second
	}
	if why == "" {
		if al.req != nil {
			al.req.level--
		}
		if al.in != nil {
			al.in.level -= float64(input)
		}
		if al.out != nil {
			al.out.level -= float64(maxOut)
		}
	}
	setAnthropicHeadersLocked(w.Header(), al, now)
	if why != "" {
		s.statsLocked(key).RateLimited++
		if wait > 0 {
			w.Header().Set("retry-after", strconv.FormatInt(int64(max((wait+time.Second-1)/time.Second, 1)), 10))
		}
		writeAnthropicError(w, http.StatusTooManyRequests, "rate_limit_error", why)
		return nil, false
	}
	s.inflight[key]++
	return func(out int64) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.inflight[key]--
		if al.out != nil && out < maxOut {
			// Output limits are estimated from max_tokens, then corrected.
			al.out.refill(s.cfg.Clock.Now())
			al.out.level = math.Min(al.out.limit, al.out.level+float64(maxOut-out))
		}
	}, true
}

// setAnthropicHeadersLocked writes the anthropic-ratelimit-* headers of
// the limits that exist; -tokens-* is the most restrictive tokens limit.
func setAnthropicHeadersLocked(h http.Header, al *anthropicLimits, now time.Time) {
	set := func(kind string, b *bucket) {
		h.Set("anthropic-ratelimit-"+kind+"-limit", strconv.FormatInt(int64(b.limit), 10))
		h.Set("anthropic-ratelimit-"+kind+"-remaining", strconv.FormatInt(b.remaining(), 10))
		h.Set("anthropic-ratelimit-"+kind+"-reset", now.Add(b.reset()).UTC().Format(time.RFC3339))
	}
	if al.req != nil {
		set("requests", al.req)
	}
	var tightest *bucket
	for kind, b := range map[string]*bucket{"input-tokens": al.in, "output-tokens": al.out} {
		if b == nil {
			continue
		}
		set(kind, b)
		if tightest == nil || b.remaining() < tightest.remaining() {
			tightest = b
		}
	}
	if tightest != nil {
		set("tokens", tightest)
	}
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type messagesUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
}

type messageObject struct {
	ID           string        `json:"id"`
	Type         string        `json:"type"`
	Role         string        `json:"role"`
	Model        string        `json:"model"`
	Content      []textBlock   `json:"content"`
	StopReason   *string       `json:"stop_reason"`
	StopSequence *string       `json:"stop_sequence"`
	Usage        messagesUsage `json:"usage"`
}

// handleMessages serves POST /v1/messages.
func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	key, ok := s.acceptMessages(w, r)
	if !ok {
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, msg := parseMessagesRequest(body, false)
	if msg != "" {
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", msg)
		return
	}
	if !s.chat[req.Model] {
		writeAnthropicError(w, http.StatusNotFound, "not_found_error", "model: "+req.Model)
		return
	}
	input := req.inputTokens()
	seed := req.system
	for _, m := range req.Messages {
		seed += "\x00" + m.Role + "\x00" + m.text
	}
	words := answerWords(answerSeed(req.Model, []message{{Role: "user", text: seed}}))
	stop := "end_turn"
	if int64(len(words)) > *req.MaxTokens {
		words, stop = words[:*req.MaxTokens], "max_tokens"
	}
	done, ok := s.admitMessages(w, key, req.Model, input, *req.MaxTokens)
	if !ok {
		return
	}
	out := int64(0)
	defer func() { done(out) }()
	if s.cfg.ErrorRate > 0 && s.float() < s.cfg.ErrorRate {
		s.count(key, func(k *KeyStats) { k.ErrorsInjected++ })
		if s.float() < 0.5 {
			writeAnthropicError(w, http.StatusInternalServerError, "api_error", "Internal server error (injected by the simulator)")
		} else {
			w.Header().Set("retry-after", "1")
			writeAnthropicError(w, 529, "overloaded_error", "Overloaded (injected by the simulator)")
		}
		return
	}
	msgObj := &messageObject{ID: fmt.Sprintf("msg_sim%016x", s.seq.Add(1)), Type: "message", Role: "assistant", Model: req.Model,
		Content: []textBlock{}, Usage: messagesUsage{InputTokens: input}}
	ctx := r.Context()
	if !req.Stream {
		if !s.sleep(ctx, s.cfg.TTFT+time.Duration(len(words)-1)*s.cfg.TokenDelay) {
			return
		}
		out = int64(len(words))
		s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += input; k.CompletionTokens += out })
		msgObj.Content = []textBlock{{Type: "text", Text: joinWords(words)}}
		msgObj.StopReason, msgObj.Usage.OutputTokens = &stop, out
		writeJSON(w, http.StatusOK, msgObj)
		return
	}
	out = s.streamMessage(ctx, w, key, msgObj, words, stop)
}

// streamMessage sends a message as Anthropic's event stream and returns
// the output tokens sent.
func (s *Server) streamMessage(ctx context.Context, w http.ResponseWriter, key string, msg *messageObject, words []string, stop string) int64 {
	drop := s.dropAt(len(words))
	ev := startSSE(w)
	s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += msg.Usage.InputTokens })
	send := func(typ string, v map[string]any) bool {
		v["type"] = typ
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(ev.w, "event: %s\ndata: %s\n\n", typ, b); err != nil {
			return false
		}
		return ev.rc.Flush() == nil
	}
	start := *msg
	start.Usage.OutputTokens = 1
	if !send("message_start", map[string]any{"message": start}) {
		return 0
	}
	if !s.sleep(ctx, s.cfg.TTFT) {
		return 0
	}
	if !send("content_block_start", map[string]any{"index": 0, "content_block": textBlock{Type: "text"}}) || !send("ping", map[string]any{}) {
		return 0
	}
	n := int64(0)
	for i, word := range words {
		if i == drop {
			s.drop(key)
		}
		if i > 0 {
			if !s.sleep(ctx, s.cfg.TokenDelay) {
				return n
			}
			word = " " + word
		}
		s.count(key, func(k *KeyStats) { k.CompletionTokens++ })
		n++
		if !send("content_block_delta", map[string]any{"index": 0, "delta": map[string]string{"type": "text_delta", "text": word}}) {
			return n
		}
	}
	if !send("content_block_stop", map[string]any{"index": 0}) ||
		!send("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]int64{"output_tokens": n}}) {
		return n
	}
	send("message_stop", map[string]any{})
	return n
}

// handleCountTokens serves POST /v1/messages/count_tokens.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.acceptMessages(w, r); !ok {
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, msg := parseMessagesRequest(body, true)
	if msg != "" {
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", msg)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"input_tokens": req.inputTokens()})
}

// handleAzure serves Azure OpenAI's deployment routes
// (/openai/deployments/{name}/chat/completions?api-version=..., and
// completions, embeddings, responses): the deployment's model answers,
// whatever model the body names, as at Azure.
func (s *Server) handleAzure(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("api-version") == "" {
		writeError(w, http.StatusNotFound, "invalid_request_error", "404", "", "Resource not found (no api-version)")
		return
	}
	dep := r.PathValue("deployment")
	model := dep
	if m := s.cfg.AzureDeployments[dep]; m != "" {
		model = m
	}
	switch rest := r.PathValue("rest"); rest {
	case "chat/completions", "completions", "embeddings", "responses":
		if r.Method != http.MethodPost {
			break
		}
		if !s.chat[model] && !s.embed[model] {
			writeError(w, http.StatusNotFound, "invalid_request_error", "DeploymentNotFound", "",
				fmt.Sprintf("The API deployment for this resource does not exist (%s).", dep))
			return
		}
		body, ok := s.readBody(w, r)
		if !ok {
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil || m == nil {
			invalidRequest(w, "", "The request body must be a JSON object.")
			return
		}
		m["model"], _ = json.Marshal(model)
		body, _ = json.Marshal(m)
		r2 := r.Clone(r.Context())
		r2.URL.Path, r2.URL.RawPath = "/v1/"+rest, ""
		r2.Body = http.NoBody
		r2.ContentLength = int64(len(body))
		r2.Body = nopCloser{bytes.NewReader(body)}
		s.mux.ServeHTTP(w, r2)
		return
	}
	writeError(w, http.StatusNotFound, "invalid_request_error", "404", "", "Resource not found: "+strings.TrimPrefix(r.URL.Path, "/"))
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

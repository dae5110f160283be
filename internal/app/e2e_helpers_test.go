//go:build unix

package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
)

// The replicas, their configuration and the recording provider come from
// internal/e2eutil, shared with the topology tests (internal/e2etopo).
type (
	replica       = e2eutil.Replica
	gatewayConfig = e2eutil.GatewayConfig
	gatedSim      = e2eutil.GatedSim
	upstreamCall  = e2eutil.UpstreamCall
	reply         = e2eutil.Reply
)

// e2eSim is a simulated provider on a loopback HTTP server that records
// when each chat completion request arrived.
type e2eSim struct {
	*sim.Server
	url string // the OpenAI base URL, ending in /v1

	mu       sync.Mutex             // protects arrivals, limited
	arrivals map[string][]time.Time // chat completion requests by model, in arrival order
	limited  map[string][]time.Time // arrival times of the requests it answered 429

	// hideLimits drops the x-ratelimit-* headers of every answer, 429s
	// included, as providers that do not advertise their quota do: the
	// gateway then learns about the quota only from a 429's message.
	hideLimits bool
}

// statusWriter records the status a handler writes.
type statusWriter struct {
	http.ResponseWriter
	status     int
	hideLimits bool
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	if w.hideLimits {
		for k := range w.Header() {
			if strings.HasPrefix(k, "X-Ratelimit-") {
				w.Header().Del(k)
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func newE2ESim(t *testing.T, cfg sim.Config) *e2eSim {
	t.Helper()
	srv, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &e2eSim{Server: srv, arrivals: map[string][]time.Time{}, limited: map[string][]time.Time{}}
	h := srv.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
			h.ServeHTTP(w, r)
			return
		}
		now := time.Now()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(body, &req)
		s.mu.Lock()
		s.arrivals[req.Model] = append(s.arrivals[req.Model], now)
		s.mu.Unlock()
		sw := &statusWriter{ResponseWriter: w, hideLimits: s.hideLimits}
		h.ServeHTTP(sw, r)
		if sw.status == http.StatusTooManyRequests {
			s.mu.Lock()
			s.limited[req.Model] = append(s.limited[req.Model], now)
			s.mu.Unlock()
		}
	}))
	t.Cleanup(hs.Close)
	s.url = hs.URL + "/v1"
	return s
}

// Arrivals returns a copy of the arrival times so far of the chat
// completion requests for model, and those of the ones answered 429.
func (s *e2eSim) Arrivals(model string) (all, limited []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.arrivals[model]...), append([]time.Time(nil), s.limited[model]...)
}

// apiError is the OpenAI error body.
type apiErrorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, b []byte) apiErrorBody {
	t.Helper()
	var e apiErrorBody
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Code == "" {
		t.Fatalf("not an OpenAI error body (%v): %s", err, b)
	}
	return e
}

// sdkError returns the SDK's API error, or nil if err is another kind.
func sdkError(err error) *openai.Error {
	var e *openai.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// chatParams is a short chat completion for gpt-4.1.
func chatParams(prompt string, maxTokens int64) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:    "gpt-4.1",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
	}
	if maxTokens > 0 {
		p.MaxCompletionTokens = openai.Int(maxTokens)
	}
	return p
}

// sseEvents splits an SSE body into its events (without the blank line
// that ends each).
func sseEvents(body []byte) []string {
	var out []string
	for ev := range strings.SplitSeq(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		out = append(out, ev)
	}
	return out
}

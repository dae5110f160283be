package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// headerTap records the traceparent of every request to next.
type headerTap struct {
	next http.Handler
	mu   sync.Mutex // protects seen
	seen []string
}

func (h *headerTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.seen = append(h.seen, r.Header.Get("Traceparent"))
	h.mu.Unlock()
	h.next.ServeHTTP(w, r)
}

func (h *headerTap) last() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.seen) == 0 {
		return ""
	}
	return h.seen[len(h.seen)-1]
}

// tapUpstream points every deployment at a server that records the
// traceparent the provider gets.
func tapUpstream(t *testing.T, o *Options, h *harness) *headerTap {
	tap := &headerTap{next: h.sim.Handler()}
	srv := httptest.NewServer(tap)
	t.Cleanup(srv.Close)
	for i := range o.Deployments {
		o.Deployments[i].Target.BaseURL = srv.URL + "/v1"
	}
	return tap
}

// waitIdle waits until g serves no request: the client has its answer
// before the handler returns (and the request's span ends).
func waitIdle(t *testing.T, g *Gateway) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for g.Running() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests still running", g.Running())
		}
		<-tick.C
	}
}

const clientTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestTracing: a request is a span under the client's traceparent, with a
// span per stage; the upstream call's span is the parent the provider is
// told of.
func TestTracing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	var tap *headerTap
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		o.Tracer = tp.Tracer("llmgate")
		o.AccessLog = true
		tap = tapUpstream(t, o, h)
	}})
	resp := h.post("/v1/chat/completions", tenantKey, `{"model":"gpt-4.1","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
		"Traceparent", clientTraceparent)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d", resp.StatusCode)
	}
	waitIdle(t, h.gw)
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	root := byName["llmgate chat"]
	if root == nil {
		var names []string
		for n := range byName {
			names = append(names, n)
		}
		t.Fatalf("no request span; spans: %v", names)
	}
	if got := root.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("request span in trace %s, want the client's", got)
	}
	if got := root.Parent().SpanID().String(); got != "00f067aa0ba902b7" {
		t.Errorf("request span's parent %s, want the client's span", got)
	}
	for _, name := range []string{"prepare", "admission.wait", "upstream", "relay", "settle"} {
		s := byName[name]
		if s == nil {
			t.Errorf("no %s span", name)
			continue
		}
		if s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("%s span in another trace", name)
		}
	}
	up := byName["upstream"]
	if up != nil {
		want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + up.SpanContext().SpanID().String() + "-01"
		if got := tap.last(); got != want {
			t.Errorf("the provider got traceparent %q, want %q (the upstream span)", got, want)
		}
	}
	if !strings.Contains(h.logs.String(), "trace_id=4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Error("the access line does not name the trace")
	}
}

// TestTraceparentForwardedWhenTracingIsOff: without a tracer, the client's
// traceparent reaches the provider as it came.
func TestTraceparentForwardedWhenTracingIsOff(t *testing.T) {
	var tap *headerTap
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) { tap = tapUpstream(t, o, h) }})
	resp := h.post("/v1/chat/completions", tenantKey, `{"model":"gpt-4.1","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
		"Traceparent", clientTraceparent)
	resp.Body.Close()
	if got := tap.last(); got != clientTraceparent {
		t.Errorf("the provider got traceparent %q, want the client's %q", got, clientTraceparent)
	}
}

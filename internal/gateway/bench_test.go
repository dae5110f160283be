package gateway

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
)

// cannedUpstream answers every request at once with one chat completion,
// as the simulated provider would, without a network: what a benchmark of
// the gateway's own work calls.
type cannedUpstream struct{ body []byte }

func (u cannedUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	return &http.Response{
		StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{
			"Content-Type":         {"application/json"},
			"X-Request-Id":         {"req_upstream"},
			"Openai-Processing-Ms": {"1"},
		},
		ContentLength: int64(len(u.body)),
		Body:          io.NopCloser(bytes.NewReader(u.body)),
		Request:       r,
	}, nil
}

// RoundTripWithin answers at once, so within any bound: the provider then
// takes the path it takes on its default transport, h1's, which keeps the
// bound in the connection's deadline (no timer).
func (u cannedUpstream) RoundTripWithin(r *http.Request, _ time.Duration) (*http.Response, error) {
	return u.RoundTrip(r)
}

const benchAnswer = `{"id":"chatcmpl-1","object":"chat.completion","created":1796167967,"model":"gpt-4.1-mini",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Keeps token was but bright deadline is tenant replay few cache are quota runs fair and","refusal":null},` +
	`"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":30,"completion_tokens":16,"total_tokens":46},"system_fingerprint":"fp_sim"}`

const benchRequest = `{"model":"gpt-4.1-mini","max_tokens":16,"messages":[` +
	`{"role":"system","content":"You are a helpful assistant that answers briefly."},` +
	`{"role":"user","content":"What does a gateway in front of an LLM provider do?"},` +
	`{"role":"assistant","content":"It coordinates the callers."}]}`

// BenchmarkServeChat measures the gateway's own work for one chat
// completion on the memory stores, as llmgate bench gateway configures
// them (authentication, limits that admit everything, usage accounted),
// with an upstream that answers at once and no network on either side.
// Run it with -cpu 1 so that the background settle of each request is in
// its time.
func BenchmarkServeChat(b *testing.B) { benchServeChat(b, nil) }

// BenchmarkServeChatAccessLog is BenchmarkServeChat with the access log
// on, as llmgate serve runs by default (JSON lines, to nowhere).
func BenchmarkServeChatAccessLog(b *testing.B) {
	benchServeChat(b, slog.New(slog.NewJSONHandler(io.Discard, nil)))
}

func benchServeChat(b *testing.B, accessLog *slog.Logger) {
	up, err := provider.New(provider.Config{Transport: cannedUpstream{[]byte(benchAnswer)}})
	if err != nil {
		b.Fatal(err)
	}
	bm := memoryBudgets(b)
	huge := Limits{RPM: 1 << 40, TPM: 1 << 40}
	gw, err := New(Options{
		Route: func(string) ([]string, bool) { return []string{"sim/gpt-4.1-mini"}, true },
		// As llmgate serve wires the memory store.
		Limiter:   ratelimit.New(rlmemory.New(clock.Real{}), ratelimit.WithLocalQuota(ratelimit.LocalQuota{})),
		Budgets:   bm,
		Upstream:  up,
		Tenants:   map[string]*Tenant{sha(tenantKey): {Name: "bench", Limits: huge}},
		Logger:    cmp.Or(accessLog, slog.New(slog.DiscardHandler)),
		AccessLog: accessLog != nil,
		Deployments: []Deployment{{
			Name: "sim/gpt-4.1-mini", Provider: "sim", Model: "gpt-4.1-mini", Limits: huge,
			Target: provider.Target{Name: "sim/gpt-4.1-mini", BaseURL: "http://127.0.0.1:1/v1", APIKey: providerKey},
		}},
		Models: []Model{{ID: "gpt-4.1-mini", OwnedBy: "sim"}},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = gw.Close(ctx)
	}()
	h := gw.Handler()
	body := []byte(benchRequest)
	serve := func() {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+tenantKey)
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	serve()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		serve()
	}
}

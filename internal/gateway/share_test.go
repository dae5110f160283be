package gateway

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/sim"
)

// gatedHarness is a harness whose provider holds every request until the
// gate opens.
func gatedHarness(t *testing.T, edit func(o *Options, h *harness)) (*harness, *gatedUpstream) {
	up := &gatedUpstream{gate: make(chan struct{})}
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		s, _ := sim.New(sim.Config{APIKeys: []string{providerKey}})
		up.next = s.Handler()
		srv := httptest.NewServer(up)
		h.t.Cleanup(srv.Close)
		for i := range o.Deployments {
			o.Deployments[i].Target.BaseURL = srv.URL + "/v1"
		}
		if edit != nil {
			edit(o, h)
		}
	}})
	return h, up
}

func (up *gatedUpstream) calls() int {
	up.mu.Lock()
	defer up.mu.Unlock()
	return len(up.seen)
}

// TestDedupIdentical: identical deterministic requests in flight at once
// make one upstream call, and every caller gets the same answer (streams:
// the same events, in order).
func TestDedupIdentical(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			const n = 50
			h, up := gatedHarness(t, nil)
			// Key order and whitespace differ between callers.
			bodies := []string{
				fmt.Sprintf(`{"model":"gpt-4.1","temperature":0,"stream":%v,"messages":[{"role":"user","content":"same question"}]}`, stream),
				fmt.Sprintf(`{ "messages": [ {"content":"same question", "role":"user"} ], "stream": %v, "temperature": 0, "model": "gpt-4.1" }`, stream),
			}
			type answer struct {
				status   int
				role     string
				body     string
				deployed string
			}
			answers := make(chan answer, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					resp := h.post("/v1/chat/completions", tenantKey, bodies[i%2])
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					answers <- answer{resp.StatusCode, resp.Header.Get("X-Llmgate-Dedup"), string(b), resp.Header.Get("X-Llmgate-Deployment")}
				})
			}
			// Open the provider once every caller is in the flight.
			waitFor(t, func() bool {
				return testutil.ToFloat64(h.gw.metrics.dedup.WithLabelValues("follower")) == n-1 && up.calls() == 1
			})
			close(up.gate)
			wg.Wait()
			close(answers)
			var first *answer
			roles := map[string]int{}
			for a := range answers {
				if a.status != 200 {
					t.Fatalf("status %d: %s", a.status, a.body)
				}
				roles[a.role]++
				if first == nil {
					first = &a
				} else if a.body != first.body {
					t.Fatalf("answers differ:\n%s\n---\n%s", a.body, first.body)
				}
			}
			if up.calls() != 1 {
				t.Fatalf("%d upstream calls, want 1", up.calls())
			}
			if roles["leader"] != 1 || roles["follower"] != n-1 {
				t.Fatalf("roles %v", roles)
			}
			if stream && !strings.HasSuffix(first.body, "data: [DONE]\n\n") {
				t.Fatalf("stream body %q", first.body)
			}
		})
	}
}

// TestIdempotencyKey: a retry after completion gets the stored answer
// without an upstream call; the key with another body is a 409.
func TestIdempotencyKey(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	send := func(body string) (int, string, string) {
		resp := h.post("/v1/chat/completions", tenantKey, body, "Idempotency-Key", "order-42")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b), resp.Header.Get("X-Llmgate-Dedup")
	}
	code, first, role := send(chatBody)
	if code != 200 || role != "leader" {
		t.Fatalf("%d %s %s", code, role, first)
	}
	code, again, role := send(chatBody)
	if code != 200 || again != first || role != "follower" {
		t.Fatalf("retry: %d %s\n%s\nwant\n%s", code, role, again, first)
	}
	if c := h.sim.Stats().Total.Calls; c != 1 {
		t.Fatalf("%d upstream calls, want 1", c)
	}
	// The follower shows in the usage rows, with no tokens.
	if err := h.gw.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	rows, err := h.budgets.Usage(t.Context(), "team-a", time.Now().UTC().Format("2006-01"))
	if err != nil {
		t.Fatal(err)
	}
	var follower bool
	for _, r := range rows {
		if r.Deployment == followerDeployment {
			follower = r.Requests == 1 && r.PromptTokens == 0 && r.CompletionTokens == 0 && r.MicroUSD == 0
		}
	}
	if !follower {
		t.Fatalf("usage rows %+v: want one de-duplicated request with no tokens", rows)
	}
	code, body, _ := send(strings.Replace(chatBody, "quotas", "budgets", 1))
	if code != 409 || !strings.Contains(body, "idempotency_key_reused") {
		t.Fatalf("reuse with another body: %d %s", code, body)
	}
}

// TestCache: a tenant opted into the cache gets byte-identical answers
// (JSON and streams) from it, without upstream calls or quota.
func TestCache(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		h.teamA.Cache = &TenantCache{TTL: 60e9}
		h.teamA.Limits = Limits{RPM: 2} // each form's first call; hits must not count
	}})
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":"gpt-4.1","stream":%v,"messages":[{"role":"user","content":"cache me"}]}`, stream)
		get := func() (string, string) {
			resp := h.post("/v1/chat/completions", tenantKey, body, "X-Llmgate-Max-Wait", "0")
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("stream=%v: status %d %s", stream, resp.StatusCode, b)
			}
			return string(b), resp.Header.Get("X-Llmgate-Cache")
		}
		first, state := get()
		if state != "miss" {
			t.Fatalf("first: %q", state)
		}
		if err := h.gw.Close(t.Context()); err != nil { // the fill is in the background
			t.Fatal(err)
		}
		calls := h.sim.Stats().Total.Calls
		for range 3 {
			again, state := get()
			if state != "hit" || again != first {
				t.Fatalf("stream=%v: %q\n%s\nwant\n%s", stream, state, again, first)
			}
		}
		if h.sim.Stats().Total.Calls != calls {
			t.Fatal("a cache hit reached the provider")
		}
	}
	// skip bypasses the cache.
	resp := h.post("/v1/chat/completions", batchKey, `{"model":"gpt-4.1","messages":[{"role":"user","content":"cache me"}]}`, "X-Llmgate-Cache", "skip")
	resp.Body.Close()
	if resp.Header.Get("X-Llmgate-Cache") != "" {
		t.Fatalf("skip: %q", resp.Header.Get("X-Llmgate-Cache"))
	}
}

// TestCacheSkipsTruncated: an answer cut by max_tokens is not cached.
func TestCacheSkipsTruncated(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		h.teamA.Cache = &TenantCache{TTL: 60e9}
	}})
	body := `{"model":"gpt-4.1","max_tokens":1,"messages":[{"role":"user","content":"long answer please"}]}`
	for i := range 2 {
		resp := h.post("/v1/chat/completions", tenantKey, body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `"finish_reason":"length"`) {
			t.Fatalf("answer not cut: %s", b)
		}
		if resp.Header.Get("X-Llmgate-Cache") != "miss" {
			t.Fatalf("request %d: %q", i, resp.Header.Get("X-Llmgate-Cache"))
		}
		if err := h.gw.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFlightTriggers: which requests share an upstream call.
func TestFlightTriggers(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		o.DedupModels = map[string]bool{"gpt-4.1-mini": true}
		h.batch.Dedup = true
	}})
	cases := []struct {
		name, key, body, idem string
		want                  string // "" = runs alone, else the flight key prefix
	}{
		{"plain", tenantKey, `{"model":"gpt-4.1","messages":[]}`, "", ""},
		{"temperature 0", tenantKey, `{"model":"gpt-4.1","temperature":0,"messages":[]}`, "", "auto:team-a:"},
		{"temperature 0.7", tenantKey, `{"model":"gpt-4.1","temperature":0.7,"messages":[]}`, "", ""},
		{"model opted in", tenantKey, `{"model":"gpt-4.1-mini","temperature":1,"messages":[]}`, "", "auto:team-a:"},
		{"tenant opted in", batchKey, `{"model":"gpt-4.1","temperature":1,"messages":[]}`, "", "auto:batch-jobs:"},
		{"idempotency key", tenantKey, `{"model":"gpt-4.1","messages":[]}`, "k1", "idem:team-a:k1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(tc.body))
			r.Header.Set("Authorization", "Bearer "+tc.key)
			if tc.idem != "" {
				r.Header.Set("Idempotency-Key", tc.idem)
			}
			c := &call{}
			if _, _, aerr := h.gw.prepare(httptest.NewRecorder(), r, openai.ChatCompletions, c); aerr != nil {
				t.Fatal(aerr)
			}
			fl, aerr := h.gw.flightFor(r, c)
			switch {
			case aerr != nil:
				t.Fatal(aerr)
			case tc.want == "" && fl != nil:
				t.Fatalf("shares as %q, want alone", fl.key)
			case tc.want != "" && (fl == nil || !strings.HasPrefix(fl.key, tc.want)):
				t.Fatalf("flight %+v, want key %q...", fl, tc.want)
			}
		})
	}
}

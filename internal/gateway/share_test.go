package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/respcache"
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
			up.open()
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
	other := strings.Replace(chatBody, "quotas", "budgets", 1)
	code, body, _ := send(other)
	if code != 409 || !strings.Contains(body, "idempotency_key_reused") {
		t.Fatalf("reuse with another body: %d %s", code, body)
	}
	var e struct {
		Error struct{ Message, Type, Param, Code string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != "invalid_request_error" || e.Error.Param != "idempotency-key" || !strings.Contains(e.Error.Message, "different request body") {
		t.Fatalf("the 409 is not a clear OpenAI error (%v): %s", err, body)
	}
	// Keys are the tenant's own: another tenant's request with the same key
	// and another body is its own.
	resp := h.post("/v1/chat/completions", batchKey, other, "Idempotency-Key", "order-42")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Llmgate-Dedup") != "leader" {
		t.Fatalf("another tenant's key: %d %q %s", resp.StatusCode, resp.Header.Get("X-Llmgate-Dedup"), b)
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
	// skip bypasses the cache: the answer is in it, yet the request goes
	// upstream (and may use the tenant's quota: a 429 here proves it).
	cached := `{"model":"gpt-4.1","stream":false,"messages":[{"role":"user","content":"cache me"}]}`
	calls := h.sim.Stats().Total.Calls
	resp := h.post("/v1/chat/completions", tenantKey, cached, "X-Llmgate-Cache", "skip", "X-Llmgate-Max-Wait", "0")
	resp.Body.Close()
	if resp.Header.Get("X-Llmgate-Cache") != "" || resp.StatusCode != 429 || h.sim.Stats().Total.Calls != calls {
		t.Fatalf("skip: %d %q; want the request past the cache, refused by the used-up rpm", resp.StatusCode, resp.Header.Get("X-Llmgate-Cache"))
	}
	// Entries are the tenant's own: another tenant asking with
	// x-llmgate-cache-ttl misses.
	resp = h.post("/v1/chat/completions", batchKey, cached, "X-Llmgate-Cache-Ttl", "1m")
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Llmgate-Cache") != "miss" || h.sim.Stats().Total.Calls != calls+1 {
		t.Fatalf("another tenant: %d %q", resp.StatusCode, resp.Header.Get("X-Llmgate-Cache"))
	}
	// The hits show in the tenant's usage rows, with no tokens or cost.
	if err := h.gw.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	rows, err := h.budgets.Usage(t.Context(), "team-a", time.Now().UTC().Format("2006-01"))
	if err != nil {
		t.Fatal(err)
	}
	var hits int64 = -1
	for _, r := range rows {
		if r.Deployment == cacheDeployment && r.PromptTokens == 0 && r.CompletionTokens == 0 && r.MicroUSD == 0 {
			hits = r.Requests
		}
	}
	if hits != 6 {
		t.Fatalf("usage rows %+v: want the 6 cache hits in a row of their own, with no tokens", rows)
	}
}

// TestCacheStoresOnlyComplete: errors, interrupted streams and answers cut
// by max_tokens are never cached; with CacheLength the cut answers are.
func TestCacheStoresOnlyComplete(t *testing.T) {
	for _, tc := range []struct {
		name        string
		sim         sim.Config
		cacheLength bool
		body        string
		want        int // cache entries after the answer
	}{
		{"server error", sim.Config{ErrorRate: 1}, false, `{"model":"gpt-4.1","messages":[{"role":"user","content":"fail"}]}`, 0},
		{"interrupted stream", sim.Config{DropRate: 1}, false, `{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"drop me"}]}`, 0},
		{"length", sim.Config{}, false, `{"model":"gpt-4.1","max_tokens":1,"messages":[{"role":"user","content":"long answer please"}]}`, 0},
		{"length stream", sim.Config{}, false, `{"model":"gpt-4.1","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"long answer please"}]}`, 0},
		{"length with cache_length", sim.Config{}, true, `{"model":"gpt-4.1","max_tokens":1,"messages":[{"role":"user","content":"long answer please"}]}`, 1},
		{"length stream with cache_length", sim.Config{}, true, `{"model":"gpt-4.1","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"long answer please"}]}`, 1},
		{"complete", sim.Config{}, false, `{"model":"gpt-4.1","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"short"}]}`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{sim: tc.sim, edit: func(o *Options, h *harness) {
				h.teamA.Cache = &TenantCache{TTL: time.Minute}
				o.Cache.Length = tc.cacheLength
			}})
			resp := h.post("/v1/chat/completions", tenantKey, tc.body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.Header.Get("X-Llmgate-Cache") != "miss" {
				t.Fatalf("%d %q %s", resp.StatusCode, resp.Header.Get("X-Llmgate-Cache"), b)
			}
			switch {
			case strings.HasPrefix(tc.name, "server error") && resp.StatusCode < 500,
				strings.HasPrefix(tc.name, "interrupted") && !strings.Contains(string(b), "stream_interrupted"),
				strings.HasPrefix(tc.name, "length") && !strings.Contains(string(b), `"finish_reason":"length"`):
				t.Fatalf("the provider did not answer as the case needs: %d %s", resp.StatusCode, b)
			}
			if err := h.gw.Close(t.Context()); err != nil { // the fill is in the background
				t.Fatal(err)
			}
			if n := h.gw.opt.Cache.Store.(*respcache.Memory).Len(); n != tc.want {
				t.Fatalf("%d cache entries, want %d", n, tc.want)
			}
		})
	}
}

// TestCacheStampede: identical requests that miss the cache at once make
// one upstream call, whatever their temperature (the de-duplication of
// in-flight requests), and later ones hit the cache.
func TestCacheStampede(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			const n = 20
			h, up := gatedHarness(t, func(o *Options, h *harness) { h.teamA.Cache = &TenantCache{TTL: time.Minute} })
			t.Cleanup(up.open) // before the servers close: a failed test leaves nothing held
			body := fmt.Sprintf(`{"model":"gpt-4.1","temperature":1,"max_tokens":64,"stream":%v,"messages":[{"role":"user","content":"everyone asks"}]}`, stream)
			type answer struct {
				status      int
				cache, role string
				body        string
			}
			answers := make(chan answer, n)
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					resp := h.post("/v1/chat/completions", tenantKey, body)
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					answers <- answer{resp.StatusCode, resp.Header.Get("X-Llmgate-Cache"), resp.Header.Get("X-Llmgate-Dedup"), string(b)}
				})
			}
			waitFor(t, func() bool {
				return testutil.ToFloat64(h.gw.metrics.dedup.WithLabelValues("follower")) == n-1 && up.calls() == 1
			})
			up.open()
			wg.Wait()
			close(answers)
			var first string
			roles := map[string]int{}
			for a := range answers {
				if a.status != 200 || a.cache != "miss" {
					t.Fatalf("%d cache %q: %s", a.status, a.cache, a.body)
				}
				roles[a.role]++
				if first == "" {
					first = a.body
				} else if a.body != first {
					t.Fatalf("answers differ:\n%s\n---\n%s", a.body, first)
				}
			}
			if roles["leader"] != 1 || roles["follower"] != n-1 || up.calls() != 1 {
				t.Fatalf("roles %v, %d upstream calls; want 1 leader, %d followers, 1 call", roles, up.calls(), n-1)
			}
			if err := h.gw.Close(t.Context()); err != nil {
				t.Fatal(err)
			}
			resp := h.post("/v1/chat/completions", tenantKey, body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.Header.Get("X-Llmgate-Cache") != "hit" || string(b) != first || up.calls() != 1 {
				t.Fatalf("after the stampede: %q, %d calls\n%s", resp.Header.Get("X-Llmgate-Cache"), up.calls(), b)
			}
		})
	}
}

// TestSharingPerEndpoint: a body valid for chat and for legacy completions
// alike (messages and prompt) is cached and shared per endpoint: each gets
// an answer of its own shape, and an Idempotency-Key reused on the other
// endpoint is a conflict.
func TestSharingPerEndpoint(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) { h.teamA.Cache = &TenantCache{TTL: time.Minute} }})
	body := `{"model":"gpt-4.1","max_tokens":64,"messages":[{"role":"user","content":"both"}],"prompt":"both"}`
	post := func(path string, hdr ...string) (*http.Response, string) {
		resp := h.post(path, tenantKey, body, hdr...)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	for _, ep := range []struct{ path, object string }{{"/v1/chat/completions", "chat.completion"}, {"/v1/completions", "text_completion"}} {
		resp, b := post(ep.path)
		if resp.StatusCode != 200 || resp.Header.Get("X-Llmgate-Cache") != "miss" || !strings.Contains(b, `"object":"`+ep.object+`"`) {
			t.Fatalf("%s: %d cache %q %s", ep.path, resp.StatusCode, resp.Header.Get("X-Llmgate-Cache"), b)
		}
		if err := h.gw.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if resp, b = post(ep.path); resp.Header.Get("X-Llmgate-Cache") != "hit" || !strings.Contains(b, `"object":"`+ep.object+`"`) {
			t.Fatalf("%s again: cache %q %s", ep.path, resp.Header.Get("X-Llmgate-Cache"), b)
		}
	}
	if resp, b := post("/v1/chat/completions", "Idempotency-Key", "both-1", "X-Llmgate-Cache", "skip"); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if resp, b := post("/v1/completions", "Idempotency-Key", "both-1", "X-Llmgate-Cache", "skip"); resp.StatusCode != http.StatusConflict || !strings.Contains(b, "idempotency_key_reused") {
		t.Fatalf("the key on another endpoint: %d %s", resp.StatusCode, b)
	}
}

// TestFlightTriggers: which requests share an upstream call.
func TestFlightTriggers(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		o.Dedup.Models = map[string]bool{"gpt-4.1-mini": true}
		h.batch.Dedup = true
	}})
	cases := []struct {
		name, key, body string
		hdr             []string
		want            string // "" = runs alone, else the flight key prefix
	}{
		{"plain", tenantKey, `{"model":"gpt-4.1","messages":[]}`, nil, ""},
		{"temperature 0", tenantKey, `{"model":"gpt-4.1","temperature":0,"messages":[]}`, nil, "auto:team-a:"},
		{"temperature 0.7", tenantKey, `{"model":"gpt-4.1","temperature":0.7,"messages":[]}`, nil, ""},
		{"model opted in", tenantKey, `{"model":"gpt-4.1-mini","temperature":1,"messages":[]}`, nil, "auto:team-a:"},
		{"tenant opted in", batchKey, `{"model":"gpt-4.1","temperature":1,"messages":[]}`, nil, "auto:batch-jobs:"},
		{"idempotency key", tenantKey, `{"model":"gpt-4.1","messages":[]}`, []string{"Idempotency-Key", "k1"}, "idem:team-a:k1"},
		// A cache miss by many callers at once is one upstream call.
		{"cached", tenantKey, `{"model":"gpt-4.1","temperature":1,"messages":[]}`, []string{"X-Llmgate-Cache-Ttl", "1m"}, "auto:team-a:"},
		{"cache skipped", tenantKey, `{"model":"gpt-4.1","temperature":1,"messages":[]}`, []string{"X-Llmgate-Cache", "skip"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(tc.body))
			r.Header.Set("Authorization", "Bearer "+tc.key)
			for i := 0; i+1 < len(tc.hdr); i += 2 {
				r.Header.Set(tc.hdr[i], tc.hdr[i+1])
			}
			c := &call{}
			_, fl, aerr := h.gw.prepare(httptest.NewRecorder(), r, openai.ChatCompletions, c)
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

func TestParseTTL(t *testing.T) {
	const limit = 2 * time.Hour
	for _, tc := range []struct {
		in   string
		want time.Duration // 0: refused
	}{
		{"300", 5 * time.Minute}, {"0.5", 500 * time.Millisecond}, {" 10m ", 10 * time.Minute},
		{"48h", limit}, {"86400", limit}, {"+Inf", limit}, {"2h", limit},
		{"0", 0}, {"-5", 0}, {"-1m", 0}, {"NaN", 0}, {"1e-12", 0}, {"soon", 0}, {"", 0},
	} {
		d, err := parseTTL(tc.in, limit)
		if tc.want == 0 && err == nil || tc.want != 0 && (err != nil || d != tc.want) {
			t.Errorf("parseTTL(%q) = %v, %v; want %v", tc.in, d, err, tc.want)
		}
	}
}

// TestBrokenStreamIsNotReplayed: a stream the provider cut short ends its
// flight like any answer (followers relaying it get it to its end), but a
// retry with the same Idempotency-Key soon after makes a new upstream call
// instead of replaying the broken answer; a complete stream is replayed.
func TestBrokenStreamIsNotReplayed(t *testing.T) {
	old := brokenRetain
	brokenRetain = 20 * time.Millisecond
	t.Cleanup(func() { brokenRetain = old })
	body := `{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"a long story, please"}]}`
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			cfg := sim.Config{}
			if broken {
				cfg.DropRate = 1
			}
			h := newHarness(t, harnessConfig{sim: cfg})
			send := func() (string, string) {
				resp := h.post("/v1/chat/completions", tenantKey, body, "Idempotency-Key", "story-1")
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				return resp.Header.Get("X-Llmgate-Dedup"), string(b)
			}
			role, first := send()
			if role != "leader" || strings.Contains(first, "stream_interrupted") != broken {
				t.Fatalf("first: %s, interrupted=%v: %s", role, strings.Contains(first, "stream_interrupted"), first)
			}
			if !broken {
				for i := range 5 {
					if role, again := send(); role != "follower" || again != first {
						t.Fatalf("retry %d: %s, same answer %v", i, role, again == first)
					}
				}
				if c := h.sim.Stats().Total.Calls; c != 1 {
					t.Fatalf("%d upstream calls, want 1", c)
				}
				return
			}
			// Retries within brokenRetain may still get the broken answer;
			// after it, one makes a new call.
			deadline := time.Now().Add(10 * time.Second)
			for {
				role, _ := send()
				if role == "leader" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("every retry for 10s replayed the broken stream")
				}
			}
			if c := h.sim.Stats().Total.Calls; c != 2 {
				t.Fatalf("%d upstream calls, want 2", c)
			}
		})
	}
}

package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
)

const chatBody = `{"model":"gpt-4.1","max_tokens":20,"messages":[{"role":"user","content":"Tell me about quotas."}]}`

// TestConcurrencyLimitWaits: with the provider's concurrency quota
// configured, a burst larger than it waits in the queue instead of getting
// the provider's 429.
func TestConcurrencyLimitWaits(t *testing.T) {
	h := newHarness(t, harnessConfig{
		sim: sim.Config{Concurrency: 2, TTFT: 20 * time.Millisecond},
		edit: func(o *Options, h *harness) {
			for i := range o.Deployments {
				o.Deployments[i].Limits = Limits{Concurrency: 2}
			}
		},
	})
	var wg sync.WaitGroup
	codes := make(chan int, 12)
	for range 12 {
		wg.Go(func() {
			resp := h.post("/v1/chat/completions", tenantKey, chatBody)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Fatalf("status %d", c)
		}
	}
	if st := h.sim.Stats().Total; st.RateLimited != 0 || st.Calls != 12 {
		t.Fatalf("provider saw %+v; want 12 calls and no 429", st)
	}
}

// TestTenantRateLimit429: a tenant over its RPM with no wait gets OpenAI's
// 429 with retry-after and x-ratelimit headers, and nothing reaches the
// provider.
func TestTenantRateLimit429(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		h.teamA.Limits = Limits{RPM: 2}
	}})
	for i := range 2 {
		resp := h.post("/v1/chat/completions", tenantKey, chatBody)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if i == 1 && resp.Header.Get("X-Ratelimit-Remaining-Requests") != "0" {
			t.Fatalf("remaining %q after the second of 2", resp.Header.Get("X-Ratelimit-Remaining-Requests"))
		}
	}
	resp := h.post("/v1/chat/completions", tenantKey, chatBody, "X-Llmgate-Max-Wait", "0")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || !strings.Contains(string(body), "rate_limit_exceeded") {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	if ra := resp.Header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Fatalf("retry-after %q", ra)
	}
	if resp.Header.Get("X-Ratelimit-Limit-Requests") != "2" {
		t.Fatalf("headers %v", resp.Header)
	}
	if c := h.sim.Stats().Total.Calls; c != 2 {
		t.Fatalf("provider calls %d, want 2", c)
	}
	// A wait shorter than the refill still ends in 429, after waiting.
	start := time.Now()
	resp = h.post("/v1/chat/completions", tenantKey, chatBody, "X-Llmgate-Max-Wait", "150ms")
	resp.Body.Close()
	if resp.StatusCode != 429 || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("status %d after %v", resp.StatusCode, time.Since(start))
	}
}

// TestBudgetStop: a tenant's token budget is never overshot, and
// exhaustion is a 429 the SDKs must not retry.
func TestBudgetStop(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		h.teamA.Budget = &budget.Budget{Tenant: "team-a", Period: budget.Month, Tokens: 400}
	}})
	ok, denied := 0, 0
	for range 40 {
		resp := h.post("/v1/chat/completions", tenantKey, chatBody)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case 200:
			ok++
		case 429:
			denied++
			if !strings.Contains(string(body), "insufficient_quota") || resp.Header.Get("X-Should-Retry") != "false" || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("budget 429 %v %s", resp.Header, body)
			}
		default:
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
		if denied > 0 {
			break
		}
	}
	if ok == 0 || denied == 0 {
		t.Fatalf("ok %d denied %d", ok, denied)
	}
	if err := h.gw.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	st, err := h.budgets.Spend(t.Context(), *h.teamA.Budget, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.Spent.Tokens > 400 || st.Spent.Tokens == 0 {
		t.Fatalf("spent %d tokens of a 400 budget", st.Spent.Tokens)
	}
	sim := h.sim.Stats().Total
	if sim.PromptTokens+sim.CompletionTokens != st.Spent.Tokens {
		t.Fatalf("provider counted %d tokens, budget %d", sim.PromptTokens+sim.CompletionTokens, st.Spent.Tokens)
	}
}

// TestProvider429SlowsEveryone: a provider 429 puts the deployment in
// cooldown, so the next request is held at the gateway, not sent. (The
// provider hides its x-ratelimit-* headers: from them the gateway would
// have learned its limit of 1 and never sent the request that got the 429.)
func TestProvider429SlowsEveryone(t *testing.T) {
	h := newHarness(t, harnessConfig{
		sim:        sim.Config{RPM: 1},
		provider:   provider.Config{MaxAttempts: 1},
		hideLimits: true,
	})
	resp := h.post("/v1/chat/completions", tenantKey, chatBody)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	// The provider's 429 sends the request back to the queue, where the
	// cooldown it set holds it: without time to wait, it is a 429.
	resp = h.post("/v1/chat/completions", tenantKey, chatBody, "X-Llmgate-Max-Wait", "0")
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
	}
	waitFor(t, func() bool {
		r := h.post("/v1/chat/completions", batchKey, chatBody, "X-Llmgate-Max-Wait", "0")
		r.Body.Close()
		return r.StatusCode == 429
	})
	if st := h.sim.Stats().Total; st.RateLimited != 1 {
		t.Fatalf("provider sent %d 429s; after the first the gateway should hold requests back", st.RateLimited)
	}
}

// waitFor polls cond (a state read, not a synchronisation stand-in) for up
// to 10s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// flaky wraps the simulator with a switch that makes it answer 503.
type flaky struct {
	next  http.Handler
	fail  atomic.Bool
	calls atomic.Int64
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	if f.fail.Load() {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(503)
		_, _ = w.Write([]byte(`{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}`))
		return
	}
	f.next.ServeHTTP(w, r)
}

// TestFallbackAndBreaker: when the first target fails the alias falls back
// to the second; after enough failures the breaker stops sending to the
// first, and lets it back once it recovers.
func TestFallbackAndBreaker(t *testing.T) {
	var bad *flaky
	h := newHarness(t, harnessConfig{
		provider: provider.Config{MaxAttempts: 2, BreakerFailures: 2, BreakerOpenFor: 200 * time.Millisecond},
		edit: func(o *Options, h *harness) {
			s, _ := sim.New(sim.Config{APIKeys: []string{providerKey}})
			bad = &flaky{next: s.Handler()}
			bad.fail.Store(true)
			srv := httptest.NewServer(bad)
			h.t.Cleanup(srv.Close)
			o.Deployments = append(o.Deployments, Deployment{
				Name: "bad/gpt-4.1", Provider: "bad", Model: "gpt-4.1",
				Target: provider.Target{Name: "bad/gpt-4.1", BaseURL: srv.URL + "/v1", APIKey: providerKey},
			})
			route := o.Route
			o.Route = func(m string) ([]string, bool) {
				if m == "resilient" {
					return []string{"bad/gpt-4.1", "sim/gpt-4.1"}, true
				}
				return route(m)
			}
		},
	})
	body := strings.Replace(chatBody, "gpt-4.1", "resilient", 1)
	for i := range 3 {
		resp := h.post("/v1/chat/completions", tenantKey, body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Llmgate-Deployment") != "sim/gpt-4.1" {
			t.Fatalf("request %d: %d via %q", i, resp.StatusCode, resp.Header.Get("X-Llmgate-Deployment"))
		}
	}
	if got := h.up.State("bad/gpt-4.1"); got != "open" {
		t.Fatalf("breaker %s after repeated failures", got)
	}
	before := bad.calls.Load()
	resp := h.post("/v1/chat/completions", tenantKey, body)
	resp.Body.Close()
	if bad.calls.Load() != before {
		t.Fatal("an open breaker still sent requests to the failing deployment")
	}
	bad.fail.Store(false)
	waitFor(t, func() bool {
		r := h.post("/v1/chat/completions", tenantKey, body)
		r.Body.Close()
		return r.Header.Get("X-Llmgate-Deployment") == "bad/gpt-4.1"
	})
	if got := h.up.State("bad/gpt-4.1"); got != "closed" {
		t.Fatalf("breaker %s after recovery", got)
	}
}

// cancelWatch wraps the simulator and reports when a request's context
// ends before its handler returns (the gateway cancelled it).
type cancelWatch struct {
	next      http.Handler
	cancelled chan struct{}
	once      sync.Once
}

func (c *cancelWatch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.next.ServeHTTP(w, r)
	if r.Context().Err() != nil {
		c.once.Do(func() { close(c.cancelled) })
	}
}

// TestStreamPassThroughAndCancel: events reach the client one by one while
// the provider is still generating, and a client that leaves cancels the
// upstream request.
func TestStreamPassThroughAndCancel(t *testing.T) {
	watch := &cancelWatch{cancelled: make(chan struct{})}
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		s, _ := sim.New(sim.Config{APIKeys: []string{providerKey}, TokenDelay: 30 * time.Millisecond})
		watch.next = s.Handler()
		srv := httptest.NewServer(watch)
		h.t.Cleanup(srv.Close)
		for i := range o.Deployments {
			o.Deployments[i].Target.BaseURL = srv.URL + "/v1"
		}
	}})
	body := `{"model":"gpt-4.1","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"Write a long story."}]}`
	resp := h.post("/v1/chat/completions", tenantKey, body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %v", resp.StatusCode, resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	events := 0
	for events < 3 { // several events arrive long before the answer ends
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			var chunk map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &chunk); err != nil {
				t.Fatalf("chunk %q: %v", line, err)
			}
			events++
		}
	}
	resp.Body.Close()
	select {
	case <-watch.cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request was not cancelled after the client left")
	}
}

// TestAdminUsage: usage per tenant, model and deployment, behind the
// admin token.
func TestAdminUsage(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	resp := h.post("/v1/chat/completions", tenantKey, chatBody)
	resp.Body.Close()
	if err := h.gw.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	get := func(tok string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", h.url+"/admin/usage?tenant=team-a", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		return r, string(b)
	}
	if r, _ := get(""); r.StatusCode != 401 {
		t.Fatalf("no token: %d", r.StatusCode)
	}
	if r, _ := get(tenantKey); r.StatusCode != 401 {
		t.Fatalf("tenant key on admin: %d", r.StatusCode)
	}
	r, body := get(adminToken)
	if r.StatusCode != 200 {
		t.Fatalf("%d %s", r.StatusCode, body)
	}
	var out []tenantUsage
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	st := h.sim.Stats().Total
	if len(out) != 1 || len(out[0].Rows) != 1 {
		t.Fatalf("%s", body)
	}
	row := out[0].Rows[0]
	if row.Model != "gpt-4.1" || row.Deployment != "sim/gpt-4.1" || row.Requests != 1 ||
		row.PromptTokens != st.PromptTokens || row.CompletionTokens != st.CompletionTokens || row.MicroUSD <= 0 {
		t.Fatalf("row %+v, provider %+v", row, st)
	}
}

// TestKeysBalancedByHeadroom: two keys of one provider share a model's
// traffic by remaining quota, so neither is exhausted while the other idles.
func TestKeysBalancedByHeadroom(t *testing.T) {
	h := newHarness(t, harnessConfig{
		sim: sim.Config{APIKeys: []string{providerKey, providerKey + "-2"}},
		edit: func(o *Options, h *harness) {
			o.Deployments = []Deployment{
				{Name: "sim#1/gpt-4.1", Provider: "sim", Model: "gpt-4.1", Limits: Limits{RPM: 10},
					Target: provider.Target{Name: "sim#1/gpt-4.1", BaseURL: h.simURL, APIKey: providerKey}},
				{Name: "sim#2/gpt-4.1", Provider: "sim", Model: "gpt-4.1", Limits: Limits{RPM: 10},
					Target: provider.Target{Name: "sim#2/gpt-4.1", BaseURL: h.simURL, APIKey: providerKey + "-2"}},
			}
		},
	})
	used := map[string]int{}
	for i := range 20 {
		resp := h.post("/v1/chat/completions", tenantKey, chatBody, "X-Llmgate-Max-Wait", "0")
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d (used %v)", i, resp.StatusCode, used)
		}
		used[resp.Header.Get("X-Llmgate-Deployment")]++
	}
	if used["sim#1/gpt-4.1"] != 10 || used["sim#2/gpt-4.1"] != 10 {
		t.Fatalf("keys used %v; want 10 each (20 requests, 10 RPM per key)", used)
	}
	resp := h.post("/v1/chat/completions", tenantKey, chatBody, "X-Llmgate-Max-Wait", "0")
	resp.Body.Close()
	if resp.StatusCode != 429 {
		t.Fatalf("both keys exhausted, got %d", resp.StatusCode)
	}
	if st := h.sim.Stats().Total; st.RateLimited != 0 {
		t.Fatalf("provider 429s: %d", st.RateLimited)
	}
}

// TestRepeatedRequestIDStillCharged: a client that repeats its
// x-request-id must not have later requests taken for settled ones.
func TestRepeatedRequestIDStillCharged(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		h.teamA.Budget = &budget.Budget{Tenant: "team-a", Period: budget.Month, Tokens: 1_000_000}
	}})
	for range 3 {
		resp := h.post("/v1/chat/completions", tenantKey, chatBody, "X-Request-Id", "same-id")
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatal(resp.StatusCode)
		}
	}
	if err := h.gw.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	st, err := h.budgets.Spend(t.Context(), *h.teamA.Budget, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sim := h.sim.Stats().Total
	if sim.Calls != 3 || st.Spent.Tokens != sim.PromptTokens+sim.CompletionTokens {
		t.Fatalf("provider: %d calls, %d tokens; budget charged %d tokens", sim.Calls, sim.PromptTokens+sim.CompletionTokens, st.Spent.Tokens)
	}
}

// extendTimes reports the store time of each Extend of a rate-limit
// reservation.
type extendTimes struct {
	ratelimit.Backend
	clk     *clock.Fake
	extends chan time.Time
}

func (s *extendTimes) Extend(ctx context.Context, id string, hold time.Duration, used []int64) error {
	at := s.clk.Now()
	err := s.Backend.Extend(ctx, id, hold, used)
	select {
	case s.extends <- at:
	default: // the test reads only the renewals it steps after
	}
	return err
}

// TestLongRequestKeepsPermit: a request that runs longer than the
// reservation hold renews its concurrency permit, so nobody else gets it
// meanwhile. The store keeps time on a fake clock, stepped by less than a
// hold each time the keeper has renewed at the store's current time, so
// however late the keeper is, only its renewals keep the permit.
func TestLongRequestKeepsPermit(t *testing.T) {
	const hold = 200 * time.Millisecond
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	spy := &extendTimes{clk: clk, extends: make(chan time.Time, 1)}
	h, up := gatedHarness(t, func(o *Options, h *harness) {
		o.Admission.ReservationHold = hold
		spy.Backend = rlmemory.New(clk)
		o.Limiter = ratelimit.New(spy)
		for i := range o.Deployments {
			o.Deployments[i].Limits = Limits{Concurrency: 1}
		}
	})
	first := make(chan int, 1)
	go func() {
		resp := h.post("/v1/chat/completions", tenantKey, chatBody)
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	waitFor(t, func() bool { return up.calls() == 1 })
	// Two steps of 3/4 of a hold: past the permit's expiry but for the
	// renewals.
	for range 2 {
		now := clk.Now()
		for renewed := false; !renewed; {
			select {
			case at := <-spy.extends:
				renewed = !at.Before(now)
			case <-time.After(10 * time.Second):
				close(up.gate)
				t.Fatal("the keeper did not renew the long request's permit")
			}
		}
		clk.Advance(3 * hold / 4)
	}
	second := make(chan int, 1)
	go func() {
		resp := h.post("/v1/chat/completions", tenantKey, chatBody, "X-Llmgate-Max-Wait", "0")
		resp.Body.Close()
		second <- resp.StatusCode
	}()
	// An admitted second request would wait at the held provider.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for answered := false; !answered; {
		select {
		case code := <-second:
			if code != 429 {
				close(up.gate)
				t.Fatalf("second request: %d; the first still holds the only permit", code)
			}
			answered = true
		case <-tick.C:
			if up.calls() > 1 {
				close(up.gate)
				t.Fatal("the second request was admitted (it reached the held provider): the first request's permit expired under it")
			}
		}
	}
	close(up.gate)
	if code := <-first; code != 200 {
		t.Fatal(code)
	}
}

func TestDropNullUsage(t *testing.T) {
	var scratch []byte
	for _, tc := range []struct{ in, want string }{
		{"data: {\"a\":1,\"usage\":null}\n\n", "data: {\"a\":1}\n\n"},
		{"data: {\"a\":1,\"usage\":null}\r\n\r\n", "data: {\"a\":1}\r\n\r\n"},
		{"data: {\"a\":1}\n\n", "data: {\"a\":1}\n\n"},
		{"data: {\"a\":{\"b\":1,\"usage\":null},\"c\":2}\n\n", "data: {\"a\":{\"b\":1,\"usage\":null},\"c\":2}\n\n"}, // not the chunk's own member
		{"data: [DONE]\n\n", "data: [DONE]\n\n"},
	} {
		if got := string(dropNullUsage([]byte(tc.in), &scratch)); got != tc.want {
			t.Errorf("dropNullUsage(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

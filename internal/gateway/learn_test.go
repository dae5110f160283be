package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
)

// replicaPair is two gateways sharing one limiter store, in front of the
// first one's simulated provider: two replicas of one deployment.
func replicaPair(t *testing.T, sc sim.Config, hide bool, rpm int64) (a, b *harness) {
	t.Helper()
	store := rlmemory.New(clock.Real{})
	limits := func(o *Options) {
		o.Limiter = ratelimit.New(store)
		for i := range o.Deployments {
			o.Deployments[i].Limits = Limits{RPM: rpm}
		}
	}
	noRetry := provider.Config{MaxAttempts: 1}
	a = newHarness(t, harnessConfig{sim: sc, hideLimits: hide, provider: noRetry, edit: func(o *Options, _ *harness) { limits(o) }})
	b = newHarness(t, harnessConfig{provider: noRetry, edit: func(o *Options, _ *harness) {
		limits(o)
		for i := range o.Deployments {
			o.Deployments[i].Target.BaseURL = a.simURL
		}
	}})
	return a, b
}

// call sends chatBody with a max wait and returns the status and whether
// the answer came from the provider.
func (h *harness) call(maxWait string) (status int, upstream bool) {
	resp := h.post("/v1/chat/completions", tenantKey, chatBody, "X-Llmgate-Max-Wait", maxWait)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Llmgate-Deployment") != ""
}

// TestLearnedLimitFromHeadersReachesEveryReplica: the provider allows 3
// requests a minute and says so in x-ratelimit-limit-requests; the
// replicas are configured for 100. After one answer through replica A,
// replica B, which never saw a header, holds to the 2 the provider has
// left: the provider never answers 429.
func TestLearnedLimitFromHeadersReachesEveryReplica(t *testing.T) {
	a, b := replicaPair(t, sim.Config{RPM: 3}, false, 100)
	if st, up := a.call("0"); st != http.StatusOK || !up {
		t.Fatalf("first request via A: %d", st)
	}
	// A shares the limit in the background, after the answer: wait for the
	// store call to have returned (a counter read, not a sleep).
	waitFor(t, func() bool {
		return promtestutil.ToFloat64(a.gw.metrics.learned.WithLabelValues("sim/gpt-4.1", "requests")) >= 1
	})
	for i := range 2 {
		if st, up := b.call("0"); st != http.StatusOK || !up {
			t.Fatalf("request %d via B: %d", i, st)
		}
	}
	if st, up := b.call("0"); st != http.StatusTooManyRequests || up {
		t.Fatalf("fourth request (via B): %d (from the provider: %v), want the gateway's 429", st, up)
	}
	if st := a.sim.Stats().Total; st.RateLimited != 0 || st.Calls != 3 {
		t.Fatalf("provider saw %+v, want 3 calls and no 429", st)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, a.url+"/admin/deployments", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var deps []deploymentState
	if err := json.NewDecoder(resp.Body).Decode(&deps); err != nil {
		t.Fatal(err)
	}
	for _, d := range deps {
		if d.Name == "sim/gpt-4.1" && (d.Learned.RPM != 3 || d.Limits.RPM != 100) {
			t.Fatalf("/admin/deployments: %+v, want rpm 100 configured and 3 learned", d)
		}
	}
}

// TestLearnedLimitFrom429PacesEveryReplica: the provider allows 60 requests
// a minute and says so only in its 429's message ("Limit 60, Used 60");
// the replicas are configured for 1,000. After the 429 via replica A,
// three requests via replica B that may wait 2.5s are released at the
// provider's pace once the cooldown ends — one a second, so two go
// through — instead of all at once: the provider answers one 429 in all.
func TestLearnedLimitFrom429PacesEveryReplica(t *testing.T) {
	a, b := replicaPair(t, sim.Config{RPM: 60}, true, 1000)
	got429 := false
	for i := 0; i < 100 && !got429; i++ {
		switch st, up := a.call("0"); {
		case st == http.StatusOK:
		case st == http.StatusTooManyRequests && !up:
			// The provider's 429 went back to the queue, where its cooldown
			// refused it: max wait 0.
			got429 = true
		default:
			t.Fatalf("request %d via A: %d (from the provider: %v)", i, st, up)
		}
	}
	if st := a.sim.Stats().Total; !got429 || st.RateLimited != 1 {
		t.Fatalf("provider saw %+v after the requests via A, want one 429", st)
	}

	type result struct {
		status   int
		upstream bool
		at       time.Duration
	}
	start := time.Now()
	out := make([]result, 3)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			st, up := b.call("2.5s")
			out[i] = result{st, up, time.Since(start)}
		})
	}
	wg.Wait()
	ok := 0
	for _, r := range out {
		switch {
		case r.status == http.StatusOK && r.upstream:
			ok++
		case r.status == http.StatusTooManyRequests && !r.upstream:
		default:
			t.Errorf("request via B: %+v", r)
		}
	}
	t.Logf("via B after the 429: %+v", out)
	if st := a.sim.Stats().Total; st.RateLimited != 1 {
		t.Fatalf("the provider answered %d 429s in all; after the first the replicas must send only what it has room for", st.RateLimited)
	}
	if ok != 2 {
		t.Fatalf("%d of 3 requests via B went through within 2.5s, want 2 (one a second after the cooldown)", ok)
	}
}

func TestProviderLimits(t *testing.T) {
	none := provider.Feedback{LimitRequests: -1, RemainingRequests: -1, LimitTokens: -1, RemainingTokens: -1,
		LimitInputTokens: -1, RemainingInputTokens: -1, LimitOutputTokens: -1, RemainingOutputTokens: -1}
	with := func(f func(*provider.Feedback)) provider.Feedback {
		fb := none
		f(&fb)
		return fb
	}
	minute := func(kind string, limit, used int64) provider.LimitReport {
		return provider.LimitReport{Kind: kind, Window: time.Minute, Limit: limit, Used: used, Requested: 1}
	}
	for _, tc := range []struct {
		name string
		f    provider.Feedback
		want [learnedKinds]reportedLimit
	}{
		{"nothing", none, [learnedKinds]reportedLimit{{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}}},
		{"headers", with(func(f *provider.Feedback) {
			f.LimitRequests, f.RemainingRequests, f.LimitTokens, f.RemainingTokens = 500, 499, 30000, 29000
		}), [learnedKinds]reportedLimit{{500, 499}, {30000, 29000}, {-1, -1}, {-1, -1}}},
		{"429 message, RPM", with(func(f *provider.Feedback) { f.Reported = minute("requests", 5, 5) }),
			[learnedKinds]reportedLimit{{5, 0}, {-1, -1}, {-1, -1}, {-1, -1}}},
		{"429 message, TPM", with(func(f *provider.Feedback) { f.Reported = minute("tokens", 100, 96) }),
			[learnedKinds]reportedLimit{{-1, -1}, {100, 4}, {-1, -1}, {-1, -1}}},
		{"429 message without Used", with(func(f *provider.Feedback) { f.Reported = minute("tokens", 100, -1) }),
			[learnedKinds]reportedLimit{{-1, -1}, {100, -1}, {-1, -1}, {-1, -1}}},
		{"used above the limit", with(func(f *provider.Feedback) { f.Reported = minute("requests", 5, 7) }),
			[learnedKinds]reportedLimit{{5, 0}, {-1, -1}, {-1, -1}, {-1, -1}}},
		{"headers win over the message", with(func(f *provider.Feedback) {
			f.LimitRequests, f.RemainingRequests = 6, 1
			f.Reported = minute("requests", 5, 5)
		}), [learnedKinds]reportedLimit{{6, 1}, {-1, -1}, {-1, -1}, {-1, -1}}},
		{"anthropic input and output", with(func(f *provider.Feedback) {
			f.LimitInputTokens, f.RemainingInputTokens, f.LimitOutputTokens, f.RemainingOutputTokens = 30000, 100, 8000, 7000
		}), [learnedKinds]reportedLimit{{-1, -1}, {-1, -1}, {30000, 100}, {8000, 7000}}},
		{"a per-day limit is not a per-minute one", with(func(f *provider.Feedback) {
			f.Reported = provider.LimitReport{Kind: "requests", Window: 24 * time.Hour, Limit: 200, Used: 200, Requested: 1}
		}), [learnedKinds]reportedLimit{{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := providerLimits(tc.f); got != tc.want {
				t.Fatalf("providerLimits = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestShareDue: a reported limit below the configured one is shared when
// new, on every 429, and again half a learnTTL later; one at or above it
// once (it replaces a lower one any replica shared), then not again.
func TestShareDue(t *testing.T) {
	d := newDeployment(&Deployment{Name: "x", Limits: Limits{RPM: 100}}, 0)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	step := func(v int64, at time.Time, on429, want bool) {
		t.Helper()
		got := d.shareDue(learnedRequests, v, at, on429)
		if got != want {
			t.Fatalf("shareDue(%d, +%v, 429 %v) = %v, want %v", v, at.Sub(now), on429, got, want)
		}
		if got {
			d.markShared(learnedRequests, v, at)
		}
	}
	step(100, now, false, true) // the configured limit itself, first seen
	step(100, now, false, false)
	step(100, now, true, false)
	step(5, now, false, true) // new and below
	step(5, now.Add(time.Second), false, false)
	step(5, now.Add(time.Second), true, true) // a 429: its count matters
	step(5, now.Add(time.Second+learnTTL/2-time.Nanosecond), false, false)
	step(5, now.Add(time.Second+learnTTL/2), false, true) // renewed
	step(7, now.Add(learnTTL), false, true)               // changed
	step(200, now.Add(learnTTL), false, true)             // raised above the configuration: replace the 7
	step(200, now.Add(learnTTL+time.Second), false, false)
	step(200, now.Add(2*learnTTL), true, false)

	// No configured tokens limit: any reported one is below.
	if !d.shareDue(learnedTokens, 1_000_000, now, false) {
		t.Fatal("a tokens limit with none configured is not shared")
	}
}

// TestLearnedLimitExpires: a limit the provider reported holds this
// replica's charges to it for learnTTL, then the configured one applies.
func TestLearnedLimitExpires(t *testing.T) {
	d := newDeployment(&Deployment{Name: "x", Limits: Limits{RPM: 100, TPM: 10_000}}, 0)
	now := time.Now()
	d.learnProvider([learnedKinds]reportedLimit{{5, 0}, {-1, -1}, {-1, -1}, {-1, -1}}, now)
	ch := d.charges(nil, 10)
	if len(ch) != 2 || ch[0].Limit.Limit != 5 || ch[1].Limit.Limit != 10_000 {
		t.Fatalf("charges with a learned RPM of 5: %+v", ch)
	}
	d.learned[learnedRequests].until.Store(now.Add(-time.Second).UnixNano()) // as if learnTTL had passed
	if ch := d.charges(nil, 10); ch[0].Limit.Limit != 100 {
		t.Fatalf("charges after the learned RPM ended: %+v, want the configured 100", ch)
	}
}

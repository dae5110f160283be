//go:build unix

package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// The end-to-end tests run real 'llmgate serve' processes (the binary
// TestMain builds), several replicas sharing one real redis-server, in
// front of the simulated provider running in the test on a loopback port.

// TestE2EReplicasShareProviderRPM: the provider allows 600 requests per
// minute for the key; three replicas configured with that limit take a
// burst of 1,000 requests from 50 clients. The provider must never answer
// 429, a client gets 429 only after waiting its whole max_wait, and the
// arrivals at the provider fit a 600-request bucket refilling at 10/s.
func TestE2EReplicasShareProviderRPM(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a 1,000-request burst that lasts about 30s; runs without -short")
	}
	e2eutil.LogRuntime(t)
	const (
		rpm      = 600
		requests = 1000
		clients  = 50
		warmup   = 10
		// maxWait is short enough that some requests give up waiting
		// (50 waiters, 10 admitted per second), so both outcomes are seen.
		maxWait = 3 * time.Second
	)
	rds := testutil.StartRedis(t)
	models := []string{"gpt-4.1", "gpt-4.1-mini"}
	s := newE2ESim(t, sim.Config{Models: models, RPM: rpm, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{
		Store: rds.URL(), SimURL: s.url, Limits: fmt.Sprintf("{rpm: %d}", rpm), Models: models,
		MaxWait: maxWait.String(), RequestTimeout: "60s", LogLevel: "info",
	})
	sdks := make([]openai.Client, len(reps))
	for i, r := range reps {
		sdks[i] = r.SDK(e2eutil.TenantKey)
	}

	type result struct {
		took    time.Duration
		status  int // 200, the error status, or -1 for a transport error
		code    string
		relayed bool // the answer came from the provider (x-llmgate-deployment)
		err     error
	}
	results := make([]result, requests)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// Warm-up. The provider's bucket and the gateway's are independent;
	// each starts when it first sees a request, the provider's later by
	// that request's trip from admission to the provider. Any later request
	// with a shorter trip finds the provider's bucket short of what the
	// gateway's had. Had the burst started on full buckets, that first trip
	// would be one of 50 requests competing for the replicas (tens of
	// milliseconds: a token at 10/s). So: first one request per replica on
	// another model (it has its own buckets) opens every connection and
	// runs every code path once; then requests one at a time on an idle
	// system start the two buckets as close together as they can be. The
	// warm-up takes a fraction of the second it takes the buckets to refill
	// what it used, so they are not full again when the burst begins.
	for i, c := range sdks {
		p := chatParams("warm-up", 4)
		p.Model = "gpt-4.1-mini"
		if _, err := c.Chat.Completions.New(ctx, p); err != nil {
			t.Fatalf("warm-up via %s: %v", reps[i].Name, err)
		}
	}
	for i := range warmup {
		if _, err := sdks[i%len(sdks)].Chat.Completions.New(ctx, chatParams(fmt.Sprintf("warm-up %d", i), 4)); err != nil {
			t.Fatalf("warm-up request %d: %v", i, err)
		}
	}

	var next atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= requests || ctx.Err() != nil {
					return
				}
				rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
				start := time.Now()
				_, err := sdks[i%len(sdks)].Chat.Completions.New(rctx, chatParams(fmt.Sprintf("request %d", i), 4))
				res := result{took: time.Since(start), status: http.StatusOK}
				rcancel()
				if err != nil {
					res.err = err
					if e := sdkError(err); e != nil {
						res.status, res.code = e.StatusCode, e.Code
						res.relayed = e.Response != nil && e.Response.Header.Get("X-Llmgate-Deployment") != ""
					} else {
						res.status = -1
					}
				}
				results[i] = res
			}
		})
	}
	wg.Wait()
	burst := time.Since(begin)

	var ok, limited int
	var slowestOK time.Duration
	for i, r := range results {
		switch {
		case r.status == http.StatusOK:
			ok++
			slowestOK = max(slowestOK, r.took)
		case r.status == http.StatusTooManyRequests && !r.relayed && r.code == "rate_limit_exceeded":
			limited++
			// The client's clock starts before the gateway's wait does.
			if r.took < maxWait {
				t.Errorf("request %d: 429 after %v, before its max_wait of %v", i, r.took, maxWait)
			}
		default:
			t.Errorf("request %d: status %d code %q relayed %v after %v: %v", i, r.status, r.code, r.relayed, r.took, r.err)
		}
	}
	st := s.Stats().Total
	arrivals, limitedAt := s.Arrivals("gpt-4.1")
	t.Logf("%d requests in %v: %d answered (slowest %v), %d got 429 after waiting; provider: %d calls, %d 429s",
		requests, burst.Round(time.Millisecond), ok, slowestOK.Round(time.Millisecond), limited, st.Calls, st.RateLimited)
	if st.RateLimited != 0 {
		var at []string
		for _, l := range limitedAt {
			n := 0
			for _, a := range arrivals {
				if !a.After(l) {
					n++
				}
			}
			at = append(at, fmt.Sprintf("arrival #%d, %v after the first", n, l.Sub(arrivals[0]).Round(time.Millisecond)))
		}
		t.Errorf("the provider answered %d requests with 429 (%s); the replicas must share its limit", st.RateLimited, strings.Join(at, "; "))
	}
	if st.Calls != int64(ok+warmup+len(reps)) || len(arrivals) != ok+warmup {
		t.Errorf("%d answers and %d+%d warm-ups, but the provider saw %d requests for gpt-4.1 and served %d in all",
			ok, warmup, len(reps), len(arrivals), st.Calls)
	}
	if ok < rpm-warmup {
		t.Errorf("only %d requests answered; the first %d should go through at once", ok, rpm-warmup)
	}
	// Every window of the arrivals fits the provider's bucket: at most
	// rpm at once, plus rpm/60 per second of the window.
	slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })
	e2eutil.CheckBucketBound(t, arrivals, rpm, rpm/60.0)
	// The burst started far from the limit, where the replicas admit from
	// local quota blocks (on by default with Redis): the bound above held
	// with them too.
	local := e2eutil.SumMetric(t, ctx, reps, `llmgate_rate_limit_admissions_total{path="local"}`)
	store := e2eutil.SumMetric(t, ctx, reps, `llmgate_rate_limit_admissions_total{path="store"}`)
	t.Logf("admissions: %.0f from local blocks, %.0f decided by Redis", local, store)
	if local == 0 {
		t.Error("no request was admitted from a local quota block; this test should cover them")
	}
}

// TestE2EMemoryStoreLocalQuota: on the memory store, too, the limiter
// admits far from a limit from local quota blocks by default (one backend
// decision for many requests is cheaper than one each), and
// ratelimit.local_quota: false turns them off. Near the limit the bound
// still holds: the provider, enforcing a quota just above the gateway's,
// never answers 429.
func TestE2EMemoryStoreLocalQuota(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	// The gateway's quota is a little below the provider's, as it should be
	// configured: two buckets of the same size in two processes can differ
	// by a fraction of a request (the provider's stays full a moment longer
	// at the start and loses that refill), enough for one 429 now and then.
	const providerRPM, rpm = 120, 110
	body := `{"model":"gpt-4.1","messages":[{"role":"user","content":"hello"}],"max_tokens":5}`
	for _, tc := range []struct {
		name, extra string
		local       bool
	}{
		{"default", "", true},
		{"local_quota=false", "ratelimit: {local_quota: false}\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			// A provider of its own: its quota starts full, as the gateway's.
			s := newE2ESim(t, sim.Config{RPM: providerRPM, APIKeys: []string{e2eutil.ProviderKey}})
			cfg := gatewayConfig{
				Store: "memory", SimURL: s.url, Limits: fmt.Sprintf("{rpm: %d}", rpm),
				MaxWait: "200ms", LogLevel: "info",
				Extra: fmt.Sprintf("state_dir: %q\n", t.TempDir()) + tc.extra,
			}
			r := e2eutil.LaunchReplica(t, "memory-"+tc.name, cfg)
			r.WaitReady(t)
			// 4 clients, 200 requests: the first ones far from the limit,
			// then up against it, where requests wait up to 200ms and get
			// the gateway's 429.
			const clients, requests = 4, 200
			var mu sync.Mutex
			statuses := map[int]int{}
			start := time.Now()
			var wg sync.WaitGroup
			next := make(chan struct{}, requests)
			for range requests {
				next <- struct{}{}
			}
			close(next)
			for range clients {
				wg.Go(func() {
					for range next {
						rep := e2eutil.Send(ctx, r, body)
						mu.Lock()
						statuses[rep.Status]++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			st := s.Stats().Total
			calls, limited := st.Calls, st.RateLimited
			local, err := r.Metric(ctx, `llmgate_rate_limit_admissions_total{path="local"}`)
			if err != nil {
				t.Fatal(err)
			}
			store, err := r.Metric(ctx, `llmgate_rate_limit_admissions_total{path="store"}`)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d requests in %v: statuses %v; provider: %d calls, %d 429s; admissions: %.0f local, %.0f store",
				requests, elapsed.Round(time.Millisecond), statuses, calls, limited, local, store)
			if limited != 0 {
				t.Errorf("the provider answered %d requests with 429; the gateway must keep within its quota", limited)
			}
			if statuses[200]+statuses[429] != requests {
				t.Errorf("statuses %v: want only 200 and 429", statuses)
			}
			// The bucket holds rpm and refills rpm/60 a second; one more
			// for the time between the first admission and start.
			if most := rpm + int(elapsed.Seconds()*rpm/60) + 1; statuses[200] > most {
				t.Errorf("%d answered in %v; the quota allows at most %d", statuses[200], elapsed, most)
			}
			if statuses[200] < rpm {
				t.Errorf("only %d answered; the first %d fit the quota", statuses[200], rpm)
			}
			if tc.local && local == 0 {
				t.Error("no request was admitted from a local quota block")
			}
			if !tc.local && local != 0 {
				t.Errorf("%.0f requests admitted from local blocks with local_quota: false", local)
			}
		})
	}
}

// TestE2EBudgetStopsAcrossReplicas: a tenant with a 2,000-token daily
// budget sends from 24 clients through three replicas at once. What it
// spends never exceeds the budget, the provider served exactly what was
// charged, and once the budget is used up every replica answers 429
// insufficient_quota with x-should-retry: false.
func TestE2EBudgetStopsAcrossReplicas(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		budgetTokens = 2000
		maxTokens    = 30
		perReplica   = 8
		maxPerClient = 200 // far more than the budget allows
	)
	rds := testutil.StartRedis(t)
	s := newE2ESim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{
		Store: rds.URL(), SimURL: s.url, LogLevel: "info",
		Budget: fmt.Sprintf("{period: day, tokens: %d}", budgetTokens),
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// An observer samples the spend while the clients run: it must never
	// be above the budget, even for a moment.
	stopObs := e2eutil.ObserveSpend(ctx, reps, "team-a")

	var answered, stopped atomic.Int64
	errs := make(chan error, len(reps)*perReplica)
	var wg sync.WaitGroup
	for ri, r := range reps {
		c := r.SDK(e2eutil.TenantKey)
		for k := range perReplica {
			wg.Go(func() {
				for n := range maxPerClient {
					_, err := c.Chat.Completions.New(ctx, chatParams(fmt.Sprintf("budget %d/%d/%d", ri, k, n), maxTokens))
					if err == nil {
						answered.Add(1)
						continue
					}
					e := sdkError(err)
					if e == nil || e.StatusCode != http.StatusTooManyRequests || e.Code != "insufficient_quota" {
						errs <- fmt.Errorf("%s: %w", r.Name, err)
						return
					}
					if v := e.Response.Header.Get("X-Should-Retry"); v != "false" {
						errs <- fmt.Errorf("%s: insufficient_quota with x-should-retry %q, want false", r.Name, v)
					}
					stopped.Add(1)
					return
				}
				errs <- fmt.Errorf("%s: a client sent %d requests without reaching the end of the budget", r.Name, maxPerClient)
			})
		}
	}
	wg.Wait()
	maxSeen, samples := stopObs()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Settles run after the answers: wait until no reservation is live.
	spent, holds := e2eutil.WaitSettled(t, ctx, reps[0], "team-a")
	st := s.Stats().Total
	t.Logf("%d answered, %d clients stopped by the budget; spent %d of %d tokens (highest sample %d of %d); provider counted %d+%d tokens",
		answered.Load(), stopped.Load(), spent, budgetTokens, maxSeen, samples, st.PromptTokens, st.CompletionTokens)
	if maxSeen > budgetTokens || spent > budgetTokens {
		t.Errorf("spent %d tokens (highest sample %d) of a %d-token budget", spent, maxSeen, budgetTokens)
	}
	if holds != 0 {
		t.Errorf("%d reservations still live", holds)
	}
	if provider := st.PromptTokens + st.CompletionTokens; provider != spent {
		t.Errorf("the provider served %d tokens, the budget charged %d", provider, spent)
	}
	if answered.Load() == 0 || stopped.Load() != int64(len(reps)*perReplica) {
		t.Errorf("%d answered, %d of %d clients stopped by the budget", answered.Load(), stopped.Load(), len(reps)*perReplica)
	}

	// One by one, nothing in flight: requests go through until what is
	// left is less than one request's estimate.
	var lastPrompt int64
	for i := range 100 {
		sdk := reps[i%len(reps)].SDK(e2eutil.TenantKey)
		c, err := sdk.Chat.Completions.New(ctx, chatParams(fmt.Sprintf("budget %d/%d/%d", 9, 9, i), maxTokens))
		if err != nil {
			if e := sdkError(err); e == nil || e.Code != "insufficient_quota" {
				t.Fatalf("draining the budget: %v", err)
			}
			break
		}
		lastPrompt = c.Usage.PromptTokens
	}
	spent, _ = e2eutil.WaitSettled(t, ctx, reps[0], "team-a")
	if spent > budgetTokens {
		t.Errorf("spent %d tokens of a %d-token budget", spent, budgetTokens)
	}
	if lastPrompt > 0 && budgetTokens-spent >= lastPrompt+maxTokens+2 {
		t.Errorf("%d tokens left, enough for another request (about %d), yet it was refused", budgetTokens-spent, lastPrompt+maxTokens)
	}
	for _, r := range reps {
		resp, body := r.Post(t, ctx, "/v1/chat/completions", e2eutil.TenantKey,
			`{"model":"gpt-4.1","max_tokens":30,"messages":[{"role":"user","content":"budget 9/9/9"}]}`)
		e := decodeError(t, body)
		if resp.StatusCode != http.StatusTooManyRequests || e.Error.Code != "insufficient_quota" || e.Error.Type != "insufficient_quota" ||
			resp.Header.Get("X-Should-Retry") != "false" || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s after the budget: %d, x-should-retry %q, retry-after %q, %s", r.Name, resp.StatusCode,
				resp.Header.Get("X-Should-Retry"), resp.Header.Get("Retry-After"), body)
		}
	}
	if got := s.Stats().Total; got.PromptTokens+got.CompletionTokens != spent {
		t.Errorf("the provider served %d tokens, the budget charged %d", got.PromptTokens+got.CompletionTokens, spent)
	}
}

// hello is a small chat completion request.
const hello = `{"model":"gpt-4.1","max_tokens":3,"messages":[{"role":"user","content":"hello"}]}`

// provoke429 starts a provider whose key really allows 5 requests per
// minute, says so only in its 429's message ("Limit 5, Used 5"), and three
// replicas that believe it allows 1,000, and sends
// requests through replica A until the provider answers 429 (the client
// then gets a 429: the request went back to the queue and the cooldown held
// it past its wait). It returns when the client has that 429.
func provoke429(t *testing.T) (*e2eSim, []*replica, time.Time) {
	t.Helper()
	rds := testutil.StartRedis(t)
	s := newE2ESim(t, sim.Config{Models: []string{"gpt-4.1"}, RPM: 5, APIKeys: []string{e2eutil.ProviderKey}})
	// A provider that does not advertise its quota in headers: the
	// replicas learn it only from the 429's message.
	s.hideLimits = true
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{
		Store: rds.URL(), SimURL: s.url, Limits: "{rpm: 1000}", MaxWait: "500ms", RequestTimeout: "30s",
		// No retry inside the gateway: the provider's 429 reaches the
		// client, which is what the tests watch for.
		MaxAttempts: 1,
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// One at a time: its quota of 5, then the 429.
	a := reps[0]
	for i := range 10 {
		resp, b := a.Post(t, ctx, "/v1/chat/completions", e2eutil.TenantKey, hello)
		if resp.StatusCode == http.StatusOK {
			continue
		}
		e := decodeError(t, b)
		// The gateway takes the provider's 429 back to the queue, where
		// the cooldown it set holds the request past its 500ms wait: the
		// client gets the gateway's 429.
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("request %d via A: %d %s", i, resp.StatusCode, b)
		}
		t.Logf("request %d via A: 429 after the provider's (%s), retry-after %ss", i, e.Error.Message, resp.Header.Get("Retry-After"))
		if st := s.Stats().Total; st.RateLimited != 1 || st.Calls != 5 {
			t.Fatalf("provider stats %+v, want 5 calls and one 429", st)
		}
		return s, reps, time.Now()
	}
	t.Fatal("10 requests via A and the provider never answered 429")
	return nil, nil, time.Time{}
}

// TestE2EProvider429HoldsBackEveryReplica: the provider key really allows 5
// requests per minute, the replicas believe 1,000. The first provider 429,
// reached through replica A, makes every replica hold back: the requests
// that follow, on any replica, wait and get the gateway's 429 without
// reaching the provider; and one that may wait long enough goes through
// once the provider's retry-after has passed, without another 429.
func TestE2EProvider429HoldsBackEveryReplica(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	s, reps, first429 := provoke429(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	before := s.Stats().Total

	// 15 requests from 5 clients across B, C and A, right away.
	const n = 15
	type out struct {
		status     int
		relayed    bool
		retryAfter string
		msg        string
	}
	outs := make([]out, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				resp, b, err := reps[(i+1)%len(reps)].TryPost(ctx, "/v1/chat/completions", e2eutil.TenantKey, hello)
				if err != nil {
					outs[i] = out{status: -1, msg: err.Error()}
					continue
				}
				var e apiErrorBody
				_ = json.Unmarshal(b, &e)
				outs[i] = out{status: resp.StatusCode, relayed: resp.Header.Get("X-Llmgate-Deployment") != "",
					retryAfter: resp.Header.Get("Retry-After"), msg: e.Error.Message}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(first429)
	after := s.Stats().Total
	for i, o := range outs {
		if o.status != http.StatusTooManyRequests || o.relayed {
			t.Errorf("request %d via %s after the provider's 429: %d (relayed %v) %s", i, reps[(i+1)%len(reps)].Name, o.status, o.relayed, o.msg)
			continue
		}
		ra, err := strconv.Atoi(o.retryAfter)
		if err != nil || ra < 1 || ra > 13 {
			t.Errorf("request %d: the gateway's 429 says retry-after %q; the provider asked for about 12s", i, o.retryAfter)
		}
	}
	t.Logf("15 requests across the replicas within %v of the 429: provider calls %d -> %d, 429s %d -> %d; gateway said %q, retry-after %ss",
		elapsed.Round(time.Millisecond), before.Calls, after.Calls, before.RateLimited, after.RateLimited, outs[0].msg, outs[0].retryAfter)
	if after.RateLimited > 2 {
		t.Errorf("the provider answered %d 429s in all; the replicas must hold back after the first", after.RateLimited)
	}
	if after.Calls != before.Calls || after.RateLimited != before.RateLimited {
		t.Errorf("requests reached the provider during its retry-after: calls %d -> %d, 429s %d -> %d",
			before.Calls, after.Calls, before.RateLimited, after.RateLimited)
	}

	// A request that may wait 20s goes through once the provider's wait
	// is over, on another replica, without a second 429.
	start := time.Now()
	resp, b := reps[2].Post(t, ctx, "/v1/chat/completions", e2eutil.TenantKey, hello, "X-Llmgate-Max-Wait", "20s")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a request allowed to wait 20s: %d %s", resp.StatusCode, b)
	}
	final := s.Stats().Total
	t.Logf("a request allowed to wait went through after %v (%v after the 429)", time.Since(start).Round(time.Millisecond),
		time.Since(first429).Round(time.Millisecond))
	if final.RateLimited != before.RateLimited {
		t.Errorf("the provider answered %d 429s in all", final.RateLimited)
	}
}

// TestE2ECooldownEndReleasesAHerd: after the provider's 429 via replica A
// ("Limit 5, Used 5": one request every 12s, none left), one request per
// replica waits up to 20s. The replicas hold back until the retry-after,
// and then — having learned the provider's limit through Redis, B and C
// without ever seeing it — release them at the provider's pace, not all
// at once as the configured 1,000 RPM (refilled meanwhile) would: one goes
// through when the provider has room for it, the next would only 12s
// later, past the others' wait. The provider answers one 429 in all.
func TestE2ECooldownEndReleasesAHerd(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	s, reps, _ := provoke429(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	type out struct {
		status   int
		upstream bool
		took     time.Duration
	}
	outs := make([]out, len(reps))
	var wg sync.WaitGroup
	for i, r := range reps {
		wg.Go(func() {
			resp, b, err := r.TryPost(ctx, "/v1/chat/completions", e2eutil.TenantKey, hello, "X-Llmgate-Max-Wait", "20s")
			if err != nil {
				t.Error(err)
				return
			}
			outs[i] = out{resp.StatusCode, resp.Header.Get("X-Llmgate-Deployment") != "", time.Since(start)}
			t.Logf("%s: %d after %v (from the provider: %v) %.100s", r.Name, resp.StatusCode, outs[i].took.Round(time.Millisecond), outs[i].upstream, b)
		})
	}
	wg.Wait()
	st := s.Stats().Total
	if st.RateLimited != 1 {
		t.Errorf("the provider answered %d 429s in all (%d calls); after the first the replicas should send it only what it has room for",
			st.RateLimited, st.Calls)
	}
	through := 0
	for i, o := range outs {
		switch {
		case o.status == http.StatusOK && o.upstream:
			through++
		case o.status == http.StatusTooManyRequests && !o.upstream && o.took >= 19*time.Second:
			// the gateway's 429, after waiting its 20s
		default:
			t.Errorf("request via %s: %+v; want the provider's 200 or the gateway's 429 after 20s", reps[i].Name, o)
		}
	}
	if through != 1 || st.Calls != 6 {
		t.Errorf("%d requests went through after the 429 (provider calls %d), want 1: the provider has room for one in 20s", through, st.Calls)
	}
	if all, limited := s.Arrivals("gpt-4.1"); len(limited) == 1 && len(all) == 7 {
		t.Logf("the request that went through reached the provider %v after its 429", all[6].Sub(limited[0]).Round(time.Millisecond))
	}
}

// TestE2EKilledReplicaFreesConcurrency: with a concurrency limit of 2, a
// replica holding both permits with two streams is killed with SIGKILL.
// The other replicas refuse a third request with a retry-after within the
// default reservation hold, the permits in Redis are leases that expire
// within that hold, and two streams on the other replicas get the permits
// within 15 s of the kill.
func TestE2EKilledReplicaFreesConcurrency(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const hold = config.DefaultReservationHold // running requests renew it every half hold
	rds := testutil.StartRedis(t)
	s := newE2ESim(t, sim.Config{Models: []string{"gpt-4.1"}, TokenDelay: time.Second, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{
		Store: rds.URL(), SimURL: s.url, Limits: "{concurrency: 2}", MaxWait: "0s",
	})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	a := reps[0]

	// Two streams through A; each holds a permit once its first chunk came.
	var streams []*ssestream.Stream[openai.ChatCompletionChunk]
	ac := a.SDK(e2eutil.TenantKey)
	for i := range 2 {
		st := ac.Chat.Completions.NewStreaming(ctx, chatParams(fmt.Sprintf("a long story %d", i), 100))
		if !st.Next() {
			t.Fatalf("stream %d via A: %v", i, st.Err())
		}
		streams = append(streams, st)
	}
	refused := func(r *replica) int {
		t.Helper()
		resp, b := r.Post(t, ctx, "/v1/chat/completions", e2eutil.TenantKey, `{"model":"gpt-4.1","max_tokens":1,"messages":[{"role":"user","content":"one more"}]}`)
		e := decodeError(t, b)
		if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(e.Error.Message, "concurrency") {
			t.Fatalf("a third request via %s: %d %s", r.Name, resp.StatusCode, b)
		}
		ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if err != nil {
			t.Fatalf("a third request via %s: retry-after %q", r.Name, resp.Header.Get("Retry-After"))
		}
		return ra
	}
	refused(reps[1]) // the limit holds while A is alive

	a.Kill(t)
	killedAt := time.Now()
	for _, st := range streams {
		for st.Next() {
		}
		if st.Err() == nil {
			t.Error("a stream through the killed replica ended without an error")
		}
		_ = st.Close()
	}

	// The permits of the dead replica still count, but not forever: the
	// other replicas say when they free, within the hold.
	for _, r := range reps[1:] {
		ra := refused(r)
		if ra < 1 || time.Duration(ra)*time.Second > hold+time.Second {
			t.Errorf("%s: retry-after %ds for the dead replica's permits; they must free within %v", r.Name, ra, hold)
		}
		t.Logf("%s refuses a third request, retry-after %ds", r.Name, ra)
	}
	// In Redis the permits are leases whose expiry (Redis time, ms) is at
	// most the hold after they were taken.
	rc := rds.Client(t)
	key := "llmgate:rl:{default}:c:dep:sim/gpt-4.1"
	permits, err := rc.Do(ctx, rc.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := rc.Do(ctx, rc.B().Time().Build()).AsStrSlice()
	if err != nil || len(tm) != 2 {
		t.Fatalf("TIME: %v %v", tm, err)
	}
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	usec, _ := strconv.ParseInt(tm[1], 10, 64)
	nowMs := float64(sec*1000 + usec/1000)
	if len(permits) != 2 {
		t.Fatalf("%d permits in %s, want the dead replica's 2: %v", len(permits), key, permits)
	}
	for _, p := range permits {
		// Renewed while A ran, never after the kill: each expires within
		// the hold of the kill (Redis counts whole milliseconds: 2ms of
		// slack).
		left := time.Duration(p.Score-nowMs) * time.Millisecond
		if hi := hold - time.Since(killedAt) + 2*time.Millisecond; left <= 0 || left > hi {
			t.Errorf("permit %s expires in %v; the replica renewing it was killed %v ago, hold %v", p.Member, left,
				time.Since(killedAt).Round(time.Millisecond), hold)
		}
		t.Logf("permit %s expires in %v", p.Member, left.Round(time.Millisecond))
	}

	// Two streams on B and C may wait up to the hold and a margin: both
	// get a permit when the dead replica's leases expire.
	type got struct {
		at  time.Time
		err error
	}
	gots := make(chan got, 2)
	for i, r := range reps[1:] {
		go func() {
			rc := r.SDK(e2eutil.TenantKey)
			st := rc.Chat.Completions.NewStreaming(ctx, chatParams(fmt.Sprintf("after the kill %d", i), 3),
				option.WithHeader("X-Llmgate-Max-Wait", (hold+30*time.Second).String()))
			defer st.Close()
			if !st.Next() {
				gots <- got{err: fmt.Errorf("%s: %w", r.Name, st.Err())}
				return
			}
			gots <- got{at: time.Now()}
			for st.Next() {
			}
		}()
	}
	for range 2 {
		g := <-gots
		if g.err != nil {
			t.Error(g.err)
			continue
		}
		t.Logf("a permit was used again %v after the kill", g.at.Sub(killedAt).Round(time.Millisecond))
		if g.at.Sub(killedAt) > 15*time.Second {
			t.Errorf("the dead replica's permit came back %v after the kill, want within 15s (hold %v)", g.at.Sub(killedAt), hold)
		}
	}
}

// TestE2ESecretsNeverLogged runs three replicas at debug level on a Redis
// that needs a password, and makes them log what they can: answers,
// streams, bad keys, a provider that refuses its key, a bad admin token,
// then the store going away. No key, token or password may appear in
// anything they print.
func TestE2ESecretsNeverLogged(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	rds := testutil.StartRedis(t)
	// testutil's readiness PING has no password, so the password is set
	// once the server runs.
	if line, err := rds.Do(t.Context(), "CONFIG", "SET", "requirepass", e2eutil.RedisPass); err != nil || line != "+OK" {
		t.Fatalf("CONFIG SET requirepass: %q %v", line, err)
	}
	store := "redis://:" + e2eutil.RedisPass + "@" + rds.Addr
	s := newE2ESim(t, sim.Config{Models: []string{"gpt-4.1", "gpt-4.1-mini"}, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{
		Store: store, SimURL: s.url, Limits: "{rpm: 100}", Budget: "{period: month, tokens: 100000}", BadProvider: true,
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, r := range reps {
		if !strings.Contains(r.Stderr.String(), "store=redis://") {
			t.Errorf("%s does not say which store it uses: %s", r.Name, r.Stderr.String())
		}
		c := r.SDK(e2eutil.TenantKey)
		if _, err := c.Chat.Completions.New(ctx, chatParams("hello", 5)); err != nil {
			t.Fatalf("%s: %v", r.Name, err)
		}
		st := c.Chat.Completions.NewStreaming(ctx, chatParams("hello stream", 5))
		for st.Next() {
		}
		if err := st.Err(); err != nil {
			t.Fatalf("%s stream: %v", r.Name, err)
		}
		// The provider refuses the other key: its 401 is relayed.
		if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4.1-mini",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}); err == nil {
			t.Errorf("%s: the provider accepted a key it does not know", r.Name)
		} else if e := sdkError(err); e == nil || e.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: provider refusing the key: %v", r.Name, err)
		} else {
			e2eutil.AssertNoSecrets(t, r.Name+" answer to a refused provider key", string(e.RawJSON()))
		}
		// A wrong tenant key, and the provider key used as a tenant key.
		for _, key := range []string{"sk-wrong", e2eutil.ProviderKey, e2eutil.AdminToken} {
			resp, b := r.Post(t, ctx, "/v1/chat/completions", key, `{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`)
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s with a wrong key: %d %s", r.Name, resp.StatusCode, b)
			}
			e2eutil.AssertNoSecrets(t, r.Name+" 401 answer", string(b))
		}
		var v any
		if err := r.Get(ctx, "/admin/usage", e2eutil.TenantKey, &v); err == nil || !strings.Contains(err.Error(), "401") {
			t.Errorf("%s admin API with the tenant key: %v", r.Name, err)
		}
		if err := r.Get(ctx, "/admin/usage", e2eutil.AdminToken, &v); err != nil {
			t.Errorf("%s admin API: %v", r.Name, err)
		}
	}

	// The store goes away: readiness fails and requests are refused (the
	// budget fails closed), both logged.
	rds.Stop()
	for _, r := range reps {
		resp, err := e2eutil.HTTP.Get(r.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s /readyz without its store: %d", r.Name, resp.StatusCode)
		}
		resp, b := r.Post(t, ctx, "/v1/chat/completions", e2eutil.TenantKey, `{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s without its store: %d %s", r.Name, resp.StatusCode, b)
		}
		e2eutil.AssertNoSecrets(t, r.Name+" answer without the store", string(b))
	}
	for _, r := range reps {
		r.Stop(t)
		out := r.Stderr.String()
		if !strings.Contains(out, "readiness check failed") || !strings.Contains(out, "level=ERROR") {
			t.Errorf("%s did not log the store outage:\n%s", r.Name, out)
		}
		e2eutil.AssertNoSecrets(t, r.Name+" stderr", out)
		e2eutil.AssertNoSecrets(t, r.Name+" stdout", r.Stdout.String())
	}
}

// TestE2EStoreDownBudgetPolicy: the store goes away. A replica with the
// default policy refuses a tenant that has a budget (budgets fail closed);
// one configured with budget.fail_open serves it, unchecked (rate limits
// fail open by default).
func TestE2EStoreDownBudgetPolicy(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	rds := testutil.StartRedis(t)
	s := newE2ESim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
	cfg := gatewayConfig{Store: rds.URL(), SimURL: s.url, LogLevel: "info", Budget: "{period: day, tokens: 100000}"}
	closed := e2eutil.LaunchReplica(t, "fail-closed", cfg)
	cfg.Extra = "budget: {fail_open: true}\n"
	open := e2eutil.LaunchReplica(t, "fail-open", cfg)
	closed.WaitReady(t)
	open.WaitReady(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, r := range []*replica{closed, open} {
		if resp, b := r.Post(t, ctx, "/v1/chat/completions", e2eutil.TenantKey, hello); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s with its store: %d %s", r.Name, resp.StatusCode, b)
		}
	}

	rds.Stop()
	resp, b := closed.Post(t, ctx, "/v1/chat/completions", e2eutil.TenantKey, hello)
	if e := decodeError(t, b); resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != "store_unavailable" {
		t.Errorf("%s without its store: %d %s; want 503 store_unavailable", closed.Name, resp.StatusCode, b)
	}
	resp, b = open.Post(t, ctx, "/v1/chat/completions", e2eutil.TenantKey, hello)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("%s (budget.fail_open: true) without its store: %d %s; want the answer", open.Name, resp.StatusCode, b)
	}
	// Its usage cannot be recorded: a graceful stop would retry that for
	// 10s (settleTimeout), which is not what this test is about.
	open.Kill(t)
}

// TestE2ECheckConfig runs 'llmgate check-config' on a valid and on an
// invalid file, both holding a Redis password, with the provider key in
// the environment.
func TestE2ECheckConfig(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	dir := t.TempDir()
	valid := gatewayConfig{
		Store: "redis://:" + e2eutil.RedisPass + "@127.0.0.1:6379/0", SimURL: "http://127.0.0.1:9/v1",
		Limits: "{rpm: 600, tpm: 100000, concurrency: 4}", Budget: "{period: month, tokens: 5000}",
	}.YAML()
	invalid := strings.NewReplacer(
		"store: \"redis://:"+e2eutil.RedisPass+"@127.0.0.1:6379/0\"", "store: \"redis://:"+e2eutil.RedisPass+"@127.0.0.1:notaport/0\"",
		"{period: month, tokens: 5000}", "{period: week, tokens: 5000}",
		"{rpm: 600,", "{rpm: -600,",
	).Replace(valid)
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	validPath, invalidPath := write("valid.yaml", valid), write("invalid.yaml", invalid)
	typo := write("typo.yaml", valid+"max_wat: 3s\n")

	t.Run("valid", func(t *testing.T) {
		p := startLlmgate(t, e2eutil.Env, "check-config", validPath)
		code, _ := p.wait(t)
		out, errOut := p.stdout.String(), p.stderr.String()
		for _, want := range []string{"sim/gpt-4.1  rpm 600, tpm 100000, concurrency 4", "$E2E_PROVIDER_KEY (set)",
			"team-a: key in $E2E_TENANT_KEY (set)", "5000 tokens per month", "redis://xxxxx@127.0.0.1:6379/0"} {
			if !strings.Contains(out, want) {
				t.Errorf("the explanation does not say %q", want)
			}
		}
		if code != 0 || errOut != "" || t.Failed() {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		e2eutil.AssertNoSecrets(t, "check-config output", out+errOut)
	})
	t.Run("invalid", func(t *testing.T) {
		p := startLlmgate(t, e2eutil.Env, "check-config", invalidPath)
		code, _ := p.wait(t)
		out, errOut := p.stdout.String(), p.stderr.String()
		if code != 2 || out != "" {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		for _, want := range []string{"store", "providers[0].limits.rpm", "tenants[0].budget.period", "invalid.yaml"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("stderr does not mention %q:\n%s", want, errOut)
			}
		}
		e2eutil.AssertNoSecrets(t, "check-config output", out+errOut)
		t.Logf("stderr:\n%s", errOut)
	})
	t.Run("unknown key", func(t *testing.T) {
		p := startLlmgate(t, e2eutil.Env, "check-config", typo)
		code, _ := p.wait(t)
		out, errOut := p.stdout.String(), p.stderr.String()
		if code != 2 || out != "" || !strings.Contains(errOut, "max_wat") || !strings.Contains(errOut, "line") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		e2eutil.AssertNoSecrets(t, "check-config output", out+errOut)
		t.Logf("stderr:\n%s", errOut)
	})
}

// TestE2EServeEmbeddedDefault: 'llmgate serve' with no configuration and
// no OPENAI_API_KEY runs on the memory store with the built-in simulated
// provider, says so, and serves the official SDK (JSON and stream).
func TestE2EServeEmbeddedDefault(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	home := t.TempDir()
	r := e2eutil.Launch(t, "default", []string{"HOME=" + home, "XDG_STATE_HOME=", "OPENAI_API_KEY="}, "--listen", "127.0.0.1:0")
	r.WaitReady(t)
	if !strings.Contains(r.Stderr.String(), "running the embedded default (memory store, built-in simulated provider)") {
		t.Errorf("serve does not say it runs the embedded default:\n%s", r.Stderr.String())
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c := r.SDK("any-key")
	params := openai.ChatCompletionNewParams{
		Model:    "gpt-4.1-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is a token bucket?")},
	}
	cc, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" || cc.Usage.TotalTokens == 0 || cc.Model != "gpt-4.1-mini" {
		t.Fatalf("chat completion %s", cc.RawJSON())
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	st := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for st.Next() {
		acc.AddChunk(st.Current())
		chunks++
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 3 || acc.Choices[0].Message.Content != cc.Choices[0].Message.Content || acc.Usage.TotalTokens != cc.Usage.TotalTokens {
		t.Fatalf("stream: %d chunks, %q (usage %+v); JSON said %q (usage %+v)", chunks, acc.Choices[0].Message.Content, acc.Usage,
			cc.Choices[0].Message.Content, cc.Usage)
	}
	// The memory store keeps its state under $HOME/.local/state/llmgate.
	r.Stop(t)
	if _, err := os.Stat(filepath.Join(home, ".local", "state", "llmgate")); err != nil {
		t.Errorf("state directory: %v", err)
	}
}

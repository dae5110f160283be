//go:build unix

package e2etopo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/internal/testutil"
	lockredis "github.com/llmgate/llmgate/lock/redis"
)

// topology is the store the replicas share, and what the tests need to
// look inside it.
type topology struct {
	url      string             // the store URL the replicas are given
	cluster  *testutil.Cluster  // nil on Sentinel
	sentinel *testutil.Sentinel // nil on Cluster
}

func onCluster(t *testing.T) topology {
	c := testutil.SharedCluster(t)
	return topology{url: c.URL(), cluster: c}
}

func onSentinel(t *testing.T) topology {
	s := testutil.SharedSentinel(t)
	return topology{url: s.URL(), sentinel: s}
}

// open returns a client of the store, as the replicas make theirs,
// closed when the test ends.
func (tp topology) open(t *testing.T) rueidis.Client {
	t.Helper()
	c, err := storeurl.OpenRedis(tp.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// keysPerMaster counts, on each master, the keys matching a SCAN pattern.
func (tp topology) keysPerMaster(ctx context.Context, pattern string) (map[*testutil.Redis]int, error) {
	if tp.cluster != nil {
		return tp.cluster.KeysPerMaster(ctx, pattern)
	}
	m, err := tp.sentinel.Master(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := m.Keys(ctx, pattern)
	return map[*testutil.Redis]int{m: len(keys)}, err
}

// countKeys counts the keys matching pattern on all masters.
func (tp topology) countKeys(t *testing.T, ctx context.Context, pattern string) int {
	t.Helper()
	per, err := tp.keysPerMaster(ctx, pattern)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, k := range per {
		n += k
	}
	return n
}

// The scenario's configuration: a provider "limited" serving burstModel
// with RPM and TPM limits, a provider "sim" serving gpt-4.1 without, and
// tenants team-a (key in $E2E_TENANT_KEY, cache on), "burst" (a short
// max_wait) and "budget-N" (a daily token cap each).
const (
	burstModel = "gpt-4.1-mini"
	// gatewayRPM and gatewayTPM are the limits the replicas are told; the
	// provider's own are a tenth higher, as a tier's quota is configured
	// with some margin, so that the only way to a provider 429 is replicas
	// that do not share the limit.
	gatewayRPM, gatewayTPM   = 60, 60_000
	providerRPM, providerTPM = 66, 66_000
	burstMaxWait             = time.Second
	budgetTenants            = 3
	budgetTokens             = 400
	// phaseTimeout bounds each phase of the scenario.
	phaseTimeout = time.Minute
	// followerSeries counts requests that followed another's upstream call.
	followerSeries = `llmgate_dedup_total{role="follower"}`
)

// Keys of the tenants besides team-a, given to the replicas as hashes.
const burstKey = "sk-e2etopo-burst-3c9d0b7a"

func budgetKey(i int) string    { return fmt.Sprintf("sk-e2etopo-budget-%d-5e81f2", i) }
func budgetTenant(i int) string { return "budget-" + strconv.Itoa(i) }

func scenarioYAML(store, limitedURL, simURL string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nstore: %q\nlog: {level: info}\n", store)
	b.WriteString("upstream: {backoff_base: 10ms, backoff_max: 100ms}\nproviders:\n")
	fmt.Fprintf(&b, "  - name: limited\n    base_url: %s\n    api_key_env: E2E_PROVIDER_KEY\n    models: [%s]\n    limits: {rpm: %d, tpm: %d}\n",
		limitedURL, burstModel, gatewayRPM, gatewayTPM)
	fmt.Fprintf(&b, "  - name: sim\n    base_url: %s\n    api_key_env: E2E_PROVIDER_KEY\n    models: [gpt-4.1]\n", simURL)
	b.WriteString("tenants:\n  - name: team-a\n    api_key_env: E2E_TENANT_KEY\n    cache: {ttl: 1m}\n")
	fmt.Fprintf(&b, "  - name: burst\n    api_key_sha256: %s\n    max_wait: %v\n", config.HashKey(burstKey), burstMaxWait)
	for i := range budgetTenants {
		fmt.Fprintf(&b, "  - name: %s\n    api_key_sha256: %s\n    budget: {period: day, tokens: %d}\n",
			budgetTenant(i), config.HashKey(budgetKey(i)), budgetTokens)
	}
	return b.String()
}

// TestGatewayOnCluster: three replicas on the 3+3 Cluster share limits,
// budgets, de-duplication, sessions and the cache (see runScenario), and
// their keys spread over the masters.
func TestGatewayOnCluster(t *testing.T) { runScenario(t, onCluster(t)) }

// TestGatewayOnSentinel: three replicas on the Sentinel topology share
// limits, budgets, de-duplication, sessions and the cache (see
// runScenario), and their keys are on the master and both replicas.
func TestGatewayOnSentinel(t *testing.T) { runScenario(t, onSentinel(t)) }

// runScenario runs every shared capability through three replicas on tp,
// one after the other, then checks where their keys landed.
func runScenario(t *testing.T, tp topology) {
	e2eutil.LogRuntime(t)
	var spread func()
	if tp.cluster != nil {
		spread = tp.cluster.TrackSpread(t, 20)
	}
	limited := e2eutil.NewGatedSim(t, sim.Config{Models: []string{burstModel}, RPM: providerRPM, TPM: providerTPM, APIKeys: []string{e2eutil.ProviderKey}})
	s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}, TokenDelay: time.Millisecond})
	reps := e2eutil.StartReplicasYAML(t, 3, scenarioYAML(tp.url, limited.URL, s.URL))

	t.Run("limits", func(t *testing.T) { sharedLimits(t, limited, reps) })
	t.Run("budgets", func(t *testing.T) { sharedBudgets(t, s, reps) })
	// The cache before any other request of team-a: the one entry the
	// store then holds is this test's.
	t.Run("cache", func(t *testing.T) { sharedCache(t, tp, s, reps) })
	t.Run("dedup", func(t *testing.T) { sharedFlight(t, s, reps) })
	t.Run("sessions", func(t *testing.T) { sessionOrder(t, tp.open(t), s, reps) })

	checkKeys(t, tp)
	if spread != nil {
		spread()
	}
}

// sdkError returns the SDK's API error, or nil if err is another kind.
func sdkError(err error) *openai.Error {
	var e *openai.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// chatParams is a short chat completion of model.
func chatParams(model, prompt string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:               model,
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		MaxCompletionTokens: openai.Int(maxTokens),
	}
}

// sharedLimits: 90 requests from 20 clients over the three replicas, half
// again the provider's RPM: no provider 429, at most the limit (a bucket
// of 60 refilling at 1/s) reaches the provider, and what does not fit is
// answered 429 after the tenant's max_wait.
func sharedLimits(t *testing.T, p *e2eutil.GatedSim, reps []*e2eutil.Replica) {
	const requests, clients = 90, 20
	ctx, cancel := context.WithTimeout(t.Context(), phaseTimeout)
	defer cancel()
	sdks := make([]openai.Client, len(reps))
	for i, r := range reps {
		sdks[i] = r.SDK(burstKey)
	}
	var next, ok, limited atomic.Int64
	errs := make(chan error, requests)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= requests {
					return
				}
				_, err := sdks[i%int64(len(sdks))].Chat.Completions.New(ctx, chatParams(burstModel, fmt.Sprintf("burst %d", i), 4))
				e := sdkError(err)
				switch {
				case err == nil:
					ok.Add(1)
				case e != nil && e.StatusCode == http.StatusTooManyRequests && e.Code == "rate_limit_exceeded" &&
					e.Response.Header.Get("X-Llmgate-Deployment") == "":
					limited.Add(1)
				default:
					errs <- fmt.Errorf("request %d: %w", i, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := p.Stats().Total
	calls := p.Seen()
	t.Logf("%d requests: %d answered, %d got 429 after waiting; provider: %d calls, %d 429s", requests, ok.Load(), limited.Load(), st.Calls, st.RateLimited)
	if st.RateLimited != 0 {
		t.Errorf("the provider answered %d requests 429: the replicas did not share its limit", st.RateLimited)
	}
	if limited.Load() == 0 || ok.Load() < gatewayRPM*9/10 {
		t.Errorf("%d answered, %d refused: the burst should fill the limit and go past it", ok.Load(), limited.Load())
	}
	if int64(len(calls)) != ok.Load() {
		t.Errorf("%d answers, %d calls reached the provider", ok.Load(), len(calls))
	}
	at := make([]time.Time, len(calls))
	for i, c := range calls {
		at[i] = c.At
	}
	slices.SortFunc(at, time.Time.Compare)
	e2eutil.CheckBucketBound(t, at, gatewayRPM, gatewayRPM/60.0)
}

// sharedBudgets: three tenants with a 400-token daily cap each, each
// sending from a client per replica until the cap stops it: none spends
// above its cap (sampled while they run too), every reservation settles,
// and what the budgets charged is what the provider served.
func sharedBudgets(t *testing.T, s *e2eutil.GatedSim, reps []*e2eutil.Replica) {
	const maxPerClient = 40 // far more than a cap allows
	ctx, cancel := context.WithTimeout(t.Context(), phaseTimeout)
	defer cancel()
	before := s.Stats().Total
	var served [budgetTenants]atomic.Int64
	var stopped atomic.Int64
	observers := make([]func() (int64, int), budgetTenants)
	errs := make(chan error, budgetTenants*len(reps))
	var wg sync.WaitGroup
	for i := range budgetTenants {
		observers[i] = e2eutil.ObserveSpend(ctx, reps, budgetTenant(i))
		for _, r := range reps {
			c := r.SDK(budgetKey(i))
			wg.Go(func() {
				for n := range maxPerClient {
					resp, err := c.Chat.Completions.New(ctx, chatParams("gpt-4.1", fmt.Sprintf("budget %d via %s, %d", i, r.Name, n), 16))
					if err == nil {
						served[i].Add(resp.Usage.TotalTokens)
						continue
					}
					if e := sdkError(err); e == nil || e.StatusCode != http.StatusTooManyRequests || e.Code != "insufficient_quota" {
						errs <- fmt.Errorf("%s via %s: %w", budgetTenant(i), r.Name, err)
						return
					}
					stopped.Add(1)
					return
				}
				errs <- fmt.Errorf("%s via %s: %d requests without reaching the cap", budgetTenant(i), r.Name, maxPerClient)
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var total int64
	for i := range budgetTenants {
		highest, samples := observers[i]()
		spent, holds := e2eutil.WaitSettled(t, ctx, reps[i%len(reps)], budgetTenant(i))
		total += spent
		t.Logf("%s: spent %d of %d tokens (highest of %d samples %d), clients served %d", budgetTenant(i), spent, budgetTokens, samples, highest, served[i].Load())
		if spent > budgetTokens || highest > budgetTokens {
			t.Errorf("%s spent %d tokens (highest sample %d) of a %d-token cap", budgetTenant(i), spent, highest, budgetTokens)
		}
		if spent < budgetTokens*3/4 {
			t.Errorf("%s spent only %d of %d tokens before it was stopped", budgetTenant(i), spent, budgetTokens)
		}
		if holds != 0 {
			t.Errorf("%s: %d reservations still live", budgetTenant(i), holds)
		}
		if spent != served[i].Load() {
			t.Errorf("%s: the clients were served %d tokens, the budget charged %d", budgetTenant(i), served[i].Load(), spent)
		}
	}
	after := s.Stats().Total
	if provider := after.PromptTokens + after.CompletionTokens - before.PromptTokens - before.CompletionTokens; provider != total {
		t.Errorf("the provider served %d tokens, the budgets charged %d", provider, total)
	}
	if stopped.Load() != int64(budgetTenants*len(reps)) {
		t.Errorf("%d of %d clients stopped by their cap", stopped.Load(), budgetTenants*len(reps))
	}
}

// sharedCache: an answer of team-a (cache on) filled through one replica
// is a hit, byte for byte, through the two others, without a call to the
// provider.
func sharedCache(t *testing.T, tp topology, s *e2eutil.GatedSim, reps []*e2eutil.Replica) {
	ctx, cancel := context.WithTimeout(t.Context(), phaseTimeout)
	defer cancel()
	// max_tokens above the simulator's longest answer: an answer cut by
	// the limit is not cached.
	const body = `{"model":"gpt-4.1","max_tokens":64,"messages":[{"role":"user","content":"cache me on every replica"}]}`
	before := tp.countKeys(t, ctx, "llmgate:cache:*")
	first := e2eutil.Send(ctx, reps[0], body)
	if first.Err != nil || first.Status != http.StatusOK || first.Header.Get("X-Llmgate-Cache") != "miss" {
		t.Fatalf("first request: %d %v cache %q %s", first.Status, first.Err, first.Header.Get("X-Llmgate-Cache"), first.Body)
	}
	// The fill runs after the answer, in the background.
	e2eutil.WaitUntil(t, 10*time.Second, "the answer is in the shared cache", func() bool {
		return tp.countKeys(t, ctx, "llmgate:cache:*") > before
	})
	calls := s.Count()
	for _, r := range reps[1:] {
		hit := e2eutil.Send(ctx, r, body)
		if hit.Err != nil || hit.Status != http.StatusOK || hit.Header.Get("X-Llmgate-Cache") != "hit" || !bytes.Equal(hit.Body, first.Body) {
			t.Errorf("via %s: %d %v cache %q\n%s\nwant a hit with the first answer\n%s", r.Name, hit.Status, hit.Err, hit.Header.Get("X-Llmgate-Cache"), hit.Body, first.Body)
		}
	}
	if c := s.Count(); c != calls {
		t.Errorf("%d cache hits reached the provider", c-calls)
	}
}

// sharedFlight: 30 identical temperature-0 requests over the three
// replicas while the provider holds the first make one upstream call; all
// get its answer, byte for byte.
func sharedFlight(t *testing.T, s *e2eutil.GatedSim, reps []*e2eutil.Replica) {
	const n = 30
	const body = `{"model":"gpt-4.1","temperature":0,"max_tokens":24,"messages":[{"role":"user","content":"one question for every replica"}]}`
	ctx, cancel := context.WithTimeout(t.Context(), phaseTimeout)
	defer cancel()
	followersBefore := e2eutil.SumMetric(t, ctx, reps, followerSeries)
	callsBefore := s.Count()
	s.Hold()
	replies := make([]e2eutil.Reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i] = e2eutil.Send(ctx, reps[i%len(reps)], body) })
	}
	e2eutil.WaitUntil(t, 30*time.Second, fmt.Sprintf("1 request reached the provider and %d follow it", n-1), func() bool {
		if c := s.Count() - callsBefore; c > 1 {
			t.Fatalf("%d identical requests reached the provider", c)
		}
		return s.Count()-callsBefore == 1 && e2eutil.SumMetric(t, ctx, reps, followerSeries)-followersBefore == n-1
	})
	s.Release()
	wg.Wait()
	roles := map[string]int{}
	for i, r := range replies {
		if r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("request %d via %s: %d %v %s", i, reps[i%len(reps)].Name, r.Status, r.Err, r.Body)
		}
		roles[r.Header.Get("X-Llmgate-Dedup")]++
		if !bytes.Equal(r.Body, replies[0].Body) {
			t.Errorf("request %d got another answer than request 0:\n%s\n%s", i, r.Body, replies[0].Body)
		}
	}
	if roles["leader"] != 1 || roles["follower"] != n-1 {
		t.Errorf("x-llmgate-dedup roles %v; want 1 leader and %d followers", roles, n-1)
	}
	if c := s.Count() - callsBefore; c != 1 {
		t.Errorf("%d requests reached the provider; want 1", c)
	}
}

// sessionTurnRE reads the session and turn back from a request body.
var sessionTurnRE = regexp.MustCompile(`topo session (\d+) turn (\d+)"`)

// sessionOrder: 3 sessions of 6 turns, each turn sent to a random
// replica, reach the provider in the order they were sent, one at a time
// per session (each after the provider was done with the one before),
// with increasing fencing tokens. The send order is made a fact: the
// provider holds turn 0 of every session, and turn k is sent once the
// session's queue in the store holds k waiters.
func sessionOrder(t *testing.T, client rueidis.Client, s *e2eutil.GatedSim, reps []*e2eutil.Replica) {
	const sessions, turns = 3, 6
	ctx, cancel := context.WithTimeout(t.Context(), phaseTimeout)
	defer cancel()
	// The gateway's session lock: "session:<tenant>:<id>" on lock/redis
	// with its default prefix.
	locks := lockredis.New(client, lockredis.Config{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("replica choice seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	id := func(sn int) string { return "topo-conv-" + strconv.Itoa(sn) }
	body := func(sn, k int) string {
		return fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":4,"messages":[{"role":"user","content":"topo session %d turn %d"}]}`, sn, k)
	}
	s.Hold()
	replies := make([][]e2eutil.Reply, sessions)
	for sn := range replies {
		replies[sn] = make([]e2eutil.Reply, turns)
	}
	var wg sync.WaitGroup
	for k := range turns {
		for sn := range sessions {
			r := reps[rng.IntN(len(reps))]
			wg.Go(func() { replies[sn][k] = e2eutil.Send(ctx, r, body(sn, k), "X-Session-Id", id(sn)) })
		}
		for sn := range sessions {
			if k == 0 {
				s.WaitArrival(t, fmt.Sprintf(`topo session %d turn 0"`, sn), 30*time.Second)
				continue
			}
			e2eutil.WaitUntil(t, 30*time.Second, fmt.Sprintf("session %d has %d waiters", sn, k), func() bool {
				n, err := locks.Waiters(ctx, "session:team-a:"+id(sn))
				if err != nil {
					t.Fatal(err)
				}
				return n == k
			})
		}
	}
	s.Release()
	wg.Wait()
	for sn := range sessions {
		for k, r := range replies[sn] {
			if r.Err != nil || r.Status != http.StatusOK {
				t.Errorf("session %d turn %d: %d %v %s", sn, k, r.Status, r.Err, r.Body)
			}
		}
	}
	next := make([]int, sessions)
	last := make([]e2eutil.UpstreamCall, sessions)
	var lastFence [sessions]uint64
	for _, c := range s.Seen() {
		m := sessionTurnRE.FindStringSubmatch(c.Body)
		if m == nil {
			continue // another phase's
		}
		sn, _ := strconv.Atoi(m[1])
		k, _ := strconv.Atoi(m[2])
		fence, err := strconv.ParseUint(c.Fence, 10, 64)
		if err != nil {
			t.Fatalf("session %d turn %d reached the provider with x-fencing-token %q", sn, k, c.Fence)
		}
		if k != next[sn] {
			t.Fatalf("session %d: turn %d reached the provider when turn %d was next", sn, k, next[sn])
		}
		if k > 0 && (last[sn].Done.IsZero() || c.At.Before(last[sn].Done)) {
			t.Errorf("session %d turn %d reached the provider while it still served turn %d", sn, k, k-1)
		}
		if fence <= lastFence[sn] {
			t.Errorf("session %d turn %d: fencing token %d, not above the previous turn's %d", sn, k, fence, lastFence[sn])
		}
		next[sn]++
		last[sn], lastFence[sn] = c, fence
	}
	for sn, n := range next {
		if n != turns {
			t.Errorf("session %d: %d of %d turns reached the provider", sn, n, turns)
		}
	}
}

// keyFamilies are the store's key prefixes, by what uses them.
var keyFamilies = []struct{ name, pattern string }{
	{"rate limits", "llmgate:rl:*"},
	{"budgets", "llmgate:budget:*"},
	{"sessions (locks)", "llmgate:lock:*"},
	{"dedup", "llmgate:dedup:*"},
	{"cache", "llmgate:cache:*"},
}

// checkKeys logs where each family of keys landed and checks that the
// scenario's keys are on more than one master of a Cluster, and on the
// master and both replicas of Sentinel.
func checkKeys(t *testing.T, tp topology) {
	ctx, cancel := context.WithTimeout(t.Context(), phaseTimeout)
	defer cancel()
	all, err := tp.keysPerMaster(ctx, "llmgate:*")
	if err != nil {
		t.Fatal(err)
	}
	masters := slices.SortedFunc(maps.Keys(all), func(a, b *testutil.Redis) int { return a.Port - b.Port })
	for _, f := range keyFamilies {
		per, err := tp.keysPerMaster(ctx, f.pattern)
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, m := range masters {
			parts = append(parts, fmt.Sprintf("%s: %d", m.Addr, per[m]))
		}
		t.Logf("%s keys per master: %s", f.name, strings.Join(parts, ", "))
	}
	used := 0
	for _, n := range all {
		if n > 0 {
			used++
		}
	}
	if tp.cluster != nil && used < 2 {
		t.Errorf("the scenario's keys are on %d of %d masters; want them spread", used, len(all))
	}
	if tp.sentinel != nil {
		n, err := tp.sentinel.Replicated(ctx, "llmgate:*")
		if err != nil {
			t.Error(err)
		}
		if n == 0 {
			t.Error("no key of the scenario on the master")
		}
		t.Logf("%d keys on the master, all on both replicas", n)
	}
}

//go:build unix

package app

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/gateway"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// Benchmarks of what sharing an answer costs and saves: the latency a
// cache hit and a follower add to a call compared with calling the
// provider directly, and the upstream calls and billed tokens a workload
// with 30% duplicate prompts makes through llmgate and without it. The
// gateway runs in this process with the wiring 'llmgate serve' uses
// (startServer), on the memory store and on a real redis-server, in front
// of the simulated provider on a loopback port.
//
//	go test -run XXX -bench 'Share|DuplicateWorkload' -benchtime 200x ./internal/app/

const (
	// shareBenchKey is the tenant key of the benchmark gateways; not a
	// secret, the gateway lives for one benchmark on loopback.
	shareBenchKey = "sk-share-bench-tenant"
	// shareBenchProviderEnv names the upstream key in the benchmark's
	// private getenv (the simulator accepts any key).
	shareBenchProviderEnv = "SHARE_BENCH_PROVIDER_KEY"
	// shareBenchTimeout bounds every request and wait of the benchmarks.
	shareBenchTimeout = time.Minute
)

// shareBench is an in-process gateway in front of a simulated provider
// that records and can hold requests, and a client for both.
type shareBench struct {
	up    *gatedSim
	gw    *gateway.Gateway
	gwURL string
	hc    *http.Client
}

// newShareBench starts the provider and a gateway on store ("memory" or a
// redis:// URL); cache opts the tenant into the response cache.
func newShareBench(b *testing.B, store string, simCfg sim.Config, cache bool) *shareBench {
	b.Helper()
	up := e2eutil.NewGatedSim(b, simCfg)
	getenv := func(k string) string {
		if k == shareBenchProviderEnv {
			return "sk-share-bench-upstream"
		}
		return ""
	}
	cfg := &config.Config{
		Store:    store,
		StateDir: b.TempDir(),
		MaxWait:  config.DefaultMaxWait,
		Log:      config.Log{Level: "error"},
		Providers: []config.Provider{{
			Name: "sim", Type: config.TypeOpenAI, BaseURL: up.URL, APIKeyEnv: shareBenchProviderEnv, Models: []string{"gpt-4.1"},
		}},
		Tenants: []config.Tenant{{Name: "bench", APIKeySHA256: config.HashKey(shareBenchKey)}},
		Source:  "share benchmark",
	}
	if cache {
		cfg.Tenants[0].Cache = &config.TenantCache{TTL: time.Hour}
	}
	cfg.SetDefaults(getenv)
	if err := cfg.Validate(getenv); err != nil {
		b.Fatal(err)
	}
	logs := testutil.NewBuffer()
	a := &App{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard, Getenv: getenv, Environ: func() []string { return nil }}
	s, err := a.startServer(cfg, newLogger(logs, cfg.Log, nil), nil)
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(s.gw.Handler())
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(func() {
		hc.CloseIdleConnections()
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), shareBenchTimeout)
		defer cancel()
		_ = s.gw.Close(ctx)
		s.close()
		if out := logs.String(); out != "" {
			b.Logf("gateway errors:\n%s", out)
		}
	})
	return &shareBench{up: up, gw: s.gw, gwURL: hs.URL, hc: hc}
}

// do posts body to the gateway (direct: to the provider) and returns the
// answer's dedup and cache headers and how long the whole answer took.
func (sb *shareBench) do(ctx context.Context, direct bool, body string) (role, cache string, took time.Duration, err error) {
	url, key := sb.gwURL+"/v1/chat/completions", shareBenchKey
	if direct {
		url, key = sb.up.URL+"/chat/completions", "sk-share-bench-upstream"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return "", "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	start := time.Now()
	resp, err := sb.hc.Do(req)
	if err != nil {
		return "", "", 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return "", "", 0, err
	}
	took = time.Since(start)
	if resp.StatusCode != http.StatusOK {
		return "", "", took, fmt.Errorf("POST %s: status %d", url, resp.StatusCode)
	}
	return resp.Header.Get("X-Llmgate-Dedup"), resp.Header.Get("X-Llmgate-Cache"), took, nil
}

// followers reads the gateway's follower count from its /metrics.
func (sb *shareBench) followers(ctx context.Context) (float64, error) {
	return (&replica{Name: "benchmark gateway", URL: sb.gwURL}).Metric(ctx, followerSeries)
}

// shareBody is a chat completion request; deterministic ones have
// temperature 0 (de-duplicated automatically). max_tokens is above the
// simulator's longest answer, so every answer may be cached.
func shareBody(prompt string, deterministic bool) string {
	temp := ""
	if deterministic {
		temp = `"temperature":0,`
	}
	return fmt.Sprintf(`{"model":"gpt-4.1",%s"max_tokens":64,"messages":[{"role":"user","content":%q}]}`, temp, prompt)
}

// benchStores returns the stores to run on: memory, and a fresh Redis.
func benchStores(b *testing.B) []struct{ name, url string } {
	stores := []struct{ name, url string }{{"memory", "memory"}}
	if _, err := testutil.RedisServerPath(); err == nil {
		stores = append(stores, struct{ name, url string }{"redis", testutil.StartRedis(b).URL()})
	} else {
		b.Logf("redis-server not found (%v): memory store only", err)
	}
	return stores
}

// p50 returns the median of d in microseconds.
func p50(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Microsecond)
}

// BenchmarkShareLatency measures, one request at a time, what a request
// costs through the gateway compared with a direct call to the provider
// made in the same iteration (so drifts of a shared machine fall on both):
//
//   - gateway: an ordinary request (neither cached nor shared), for scale;
//   - cache-hit: a request answered from the response cache;
//   - follower-retained: a request identical to one (temperature 0) whose
//     client has just received its answer: it follows the flight the
//     leader is finishing, or its retained result (a client retrying at
//     once);
//   - follower-live: a request identical to one in flight; its added
//     latency is how long after the leader's client it gets the whole
//     answer (negative: before it), the leader's own overhead being the
//     gateway case.
//
// Reported: direct-µs (p50 of the direct calls), path-µs (p50 of the
// request measured), added-µs (p50 of the per-iteration difference; for
// follower-live, of the lag behind the leader).
func BenchmarkShareLatency(b *testing.B) {
	for _, st := range benchStores(b) {
		for _, path := range []string{"gateway", "cache-hit", "follower-retained", "follower-live"} {
			b.Run(st.name+"/"+path, func(b *testing.B) { benchShareLatency(b, st.url, path) })
		}
	}
}

func benchShareLatency(b *testing.B, store, path string) {
	sb := newShareBench(b, store, sim.Config{Models: []string{"gpt-4.1"}}, path == "cache-hit")
	ctx, cancel := context.WithTimeout(b.Context(), 10*shareBenchTimeout)
	defer cancel()
	nonce := time.Now().UnixNano() // prompts never repeat across runs on one Redis
	fixed := shareBody(fmt.Sprintf("share latency %d", nonce), false)
	if path == "cache-hit" {
		if _, c, _, err := sb.do(ctx, false, fixed); err != nil || c != "miss" {
			b.Fatalf("filling the cache: %q %v", c, err)
		}
		if err := sb.gw.Close(ctx); err != nil { // the fill runs in the background
			b.Fatal(err)
		}
	}
	var direct, measured, added []time.Duration
	for i := 0; b.Loop(); i++ {
		body := fixed
		if strings.HasPrefix(path, "follower") {
			body = shareBody(fmt.Sprintf("share latency %d/%d", nonce, i), true)
		}
		var d, m, lag time.Duration
		directCall := func() {
			var err error
			if _, _, d, err = sb.do(ctx, true, body); err != nil {
				b.Fatal(err)
			}
		}
		// The direct call goes first in even iterations, last in odd ones.
		if i%2 == 0 {
			directCall()
		}
		switch path {
		case "gateway", "cache-hit":
			_, c, took, err := sb.do(ctx, false, body)
			if err != nil || (path == "cache-hit") != (c == "hit") {
				b.Fatalf("%s: cache %q, %v", path, c, err)
			}
			m = took
		case "follower-retained":
			if role, _, _, err := sb.do(ctx, false, body); err != nil || role != "leader" {
				b.Fatalf("leader: %q %v", role, err)
			}
			role, _, took, err := sb.do(ctx, false, body)
			if err != nil || role != "follower" {
				b.Fatalf("follower: %q %v", role, err)
			}
			m = took
		case "follower-live":
			m, lag = liveFollower(b, ctx, sb, body)
		}
		if i%2 == 1 {
			directCall()
		}
		if path != "follower-live" {
			lag = m - d
		}
		direct, measured, added = append(direct, d), append(measured, m), append(added, lag)
	}
	b.ReportMetric(p50(direct), "direct-µs")
	b.ReportMetric(p50(measured), "path-µs")
	b.ReportMetric(p50(added), "added-µs")
}

// liveFollower sends body twice: the leader, held by the provider until
// the follower has joined its flight, then the follower. It returns the
// follower's latency and how long after the leader's answer it ended.
func liveFollower(b *testing.B, ctx context.Context, sb *shareBench, body string) (took, lag time.Duration) {
	before, err := sb.followers(ctx)
	if err != nil {
		b.Fatal(err)
	}
	sb.up.Hold()
	type result struct {
		role string
		done time.Time
		took time.Duration
		err  error
	}
	leader, follower := make(chan result, 1), make(chan result, 1)
	send := func(out chan<- result) {
		role, _, took, err := sb.do(ctx, false, body)
		out <- result{role, time.Now(), took, err}
	}
	arrived := sb.up.Count()
	go send(leader)
	sb.up.WaitCount(b, arrived+1, shareBenchTimeout)
	go send(follower)
	deadline := time.Now().Add(shareBenchTimeout)
	for {
		n, err := sb.followers(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if n > before {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the follower did not join the flight")
		}
		time.Sleep(100 * time.Microsecond) // the gateway's metrics: nothing to wait on
	}
	sb.up.Release()
	l, f := <-leader, <-follower
	if l.err != nil || f.err != nil || l.role != "leader" || f.role != "follower" {
		b.Fatalf("leader %q %v, follower %q %v", l.role, l.err, f.role, f.err)
	}
	return f.took, f.done.Sub(l.done)
}

// BenchmarkDuplicateWorkload runs a workload of 300 requests of which 30%
// repeat one of the 16 most recent distinct prompts (several clients
// asking the same thing at about the same time), 16 at a time, through
// llmgate and directly, against a provider with 20ms to the first token.
// Modes: dedup (temperature 0: identical requests in flight or just
// answered share one call), cache (the tenant's response cache, no
// temperature 0), dedup+cache. Reported per workload: the upstream calls
// through llmgate (gw-calls) and directly (direct-calls), the billed
// tokens through llmgate divided by those billed directly (billed-ratio),
// and the tokens saved.
func BenchmarkDuplicateWorkload(b *testing.B) {
	for _, st := range benchStores(b) {
		for _, mode := range []string{"dedup", "cache", "dedup+cache"} {
			b.Run(st.name+"/"+mode, func(b *testing.B) { benchDuplicateWorkload(b, st.url, mode) })
		}
	}
}

func benchDuplicateWorkload(b *testing.B, store, mode string) {
	const (
		requests    = 300
		concurrency = 16
		recent      = 16
	)
	sb := newShareBench(b, store, sim.Config{Models: []string{"gpt-4.1"}, TTFT: 20 * time.Millisecond}, strings.Contains(mode, "cache"))
	ctx, cancel := context.WithTimeout(b.Context(), 10*shareBenchTimeout)
	defer cancel()
	deterministic := strings.Contains(mode, "dedup")
	nonce := time.Now().UnixNano()
	fillers := []string{"", " Explain briefly.", " Give the main steps and one example of each.", " Compare it with two alternatives, with pros and cons."}
	var gwCalls, directCalls, gwTokens, directTokens int64
	ops := 0
	for op := 0; b.Loop(); op++ {
		ops++
		// 30% repeats (positions 3, 6, 9 of every ten), each of one of the
		// recent distinct prompts.
		rng := rand.New(rand.NewPCG(uint64(op), 5))
		bodies := make([]string, requests)
		var distinct []string
		for i := range bodies {
			if i%10 == 3 || i%10 == 6 || i%10 == 9 {
				bodies[i] = distinct[len(distinct)-1-rng.IntN(min(recent, len(distinct)))]
				continue
			}
			p := fmt.Sprintf("workload %d/%d question %d: what is a token bucket?%s", nonce, op, len(distinct), fillers[len(distinct)%len(fillers)])
			distinct = append(distinct, shareBody(p, deterministic))
			bodies[i] = distinct[len(distinct)-1]
		}
		for _, direct := range []bool{false, true} {
			before := sb.up.Stats().Total
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, concurrency)
			for range concurrency {
				wg.Go(func() {
					for {
						i := int(next.Add(1) - 1)
						if i >= requests {
							return
						}
						if _, _, _, err := sb.do(ctx, direct, bodies[i]); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			after := sb.up.Stats().Total
			calls, tokens := after.Calls-before.Calls, after.PromptTokens+after.CompletionTokens-before.PromptTokens-before.CompletionTokens
			if direct {
				directCalls, directTokens = directCalls+calls, directTokens+tokens
			} else {
				gwCalls, gwTokens = gwCalls+calls, gwTokens+tokens
			}
		}
	}
	n := float64(ops)
	b.ReportMetric(float64(gwCalls)/n, "gw-calls/op")
	b.ReportMetric(float64(directCalls)/n, "direct-calls/op")
	b.ReportMetric(float64(gwTokens)/float64(directTokens), "billed-ratio")
	b.ReportMetric(float64(directTokens-gwTokens)/n, "tokens-saved/op")
}

// Package simrun runs an `llmgate sim` scenario: the same workload straight to a simulated provider and through gateway replicas started as separate processes, and measures both.
package simrun

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/localredis"
	"github.com/llmgate/llmgate/internal/scenario"
	"github.com/llmgate/llmgate/internal/storeurl"
)

// Errors returned by Run.
var (
	// ErrSetup wraps failures to start the provider, the store or the
	// replicas.
	ErrSetup = errors.New("sim: setup failed")
)

// replicasStarted, when set (by tests), is told the replicas of an arm
// once they are ready.
var replicasStarted func([]*replica)

// Options says how to run a scenario.
type Options struct {
	// Binary is the llmgate executable the replicas run as `BIN serve`.
	// Required.
	Binary string
	// Replicas overrides the scenario's (0: the scenario's).
	Replicas int
	// Store is a redis:// URL for the replicas when there are more than
	// one; empty: a redis-server is started on a free loopback port.
	Store string
	// Duration overrides the scenario's bound per arm (0: the scenario's).
	Duration time.Duration
	// Seed overrides the scenario's (0: the scenario's).
	Seed uint64
	// Environ is the environment the replicas inherit (nil: os.Environ).
	Environ []string
	// Progress, if not nil, receives progress lines (see Live).
	Progress io.Writer
	// Live redraws one progress line every half second (a terminal);
	// otherwise one line is written per arm.
	Live bool
}

// Run runs both arms of sc and returns what they measured.
func Run(ctx context.Context, sc *scenario.Scenario, o Options) (*Result, error) {
	s := *sc
	if o.Duration > 0 {
		s.Duration = min(o.Duration, scenario.MaxDuration)
	}
	if o.Seed != 0 {
		s.Seed = o.Seed
	}
	n := s.Replicas
	if o.Replicas > 0 {
		n = o.Replicas
	}
	if n < 1 || n > scenario.MaxReplicas {
		return nil, fmt.Errorf("%w: %d replicas; use 1 to %d", ErrSetup, n, scenario.MaxReplicas)
	}
	if o.Binary == "" {
		return nil, fmt.Errorf("%w: no llmgate binary to run the replicas", ErrSetup)
	}
	if o.Environ == nil {
		o.Environ = os.Environ()
	}
	warmTokenizer()
	res := &Result{Scenario: s.Name, Description: s.Description, Replicas: n, Store: "memory", Seed: s.Seed}
	store := "memory"
	if n > 1 {
		res.Store = "redis"
		if o.Store != "" {
			if _, err := storeurl.RedisOption(o.Store); err != nil || storeurl.IsMemory(o.Store) {
				if err == nil {
					err = errors.New("the memory store lives in one process; several replicas need a redis:// URL")
				}
				return nil, fmt.Errorf("%w: --store: %w", ErrSetup, err)
			}
			store = o.Store
		} else {
			bin, err := localredis.Path()
			if err != nil {
				return nil, fmt.Errorf("%w: %d replicas share a Redis store: %w, or give --store redis://HOST:PORT (or run with --replicas 1)", ErrSetup, n, err)
			}
			r, err := localredis.Start(ctx, bin)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrSetup, err)
			}
			defer r.Stop()
			store = r.URL
		}
	}
	for _, arm := range []string{ArmDirect, ArmLlmgate} {
		a, err := runArm(ctx, &s, arm, n, store, o)
		if err != nil {
			return nil, err
		}
		res.Arms = append(res.Arms, *a)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	return res, nil
}

// runArm starts the provider (and, for the llmgate arm, the replicas),
// plays the workload and measures it.
func runArm(ctx context.Context, sc *scenario.Scenario, arm string, n int, store string, o Options) (*Arm, error) {
	dir, err := os.MkdirTemp("", "llmgate-sim-")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	defer os.RemoveAll(dir)
	// The clock of the arm starts once everything is up; the providers
	// take it from this value, set again just before the load starts.
	start := time.Now()
	primary, err := newUpstream("provider", &sc.Provider, sc.Seed, start)
	if err != nil {
		return nil, fmt.Errorf("%w: simulated provider: %w", ErrSetup, err)
	}
	defer primary.close()
	ups := []*upstream{primary}
	var fallback *upstream
	if sc.Fallback != nil {
		fallback, err = newUpstream("fallback", sc.Fallback, sc.Seed+1, start)
		if err != nil {
			return nil, fmt.Errorf("%w: simulated fallback provider: %w", ErrSetup, err)
		}
		defer fallback.close()
		ups = append(ups, fallback)
	}
	targets := []string{primary.BaseURL()}
	key := providerKey
	if arm == ArmLlmgate {
		nonce := make([]byte, 4)
		_, _ = rand.Read(nonce)
		fbURL := ""
		if fallback != nil {
			fbURL = fallback.BaseURL()
		}
		cfg := gatewayYAML(sc, store, dir, hex.EncodeToString(nonce), primary.BaseURL(), fbURL)
		if err := checkGatewayYAML(cfg); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		path, err := writeFile(dir, "gateway.yaml", []byte(cfg))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		rs, err := startReplicas(ctx, o.Binary, n, path, childEnv(o.Environ, providerKeyEnv+"="+providerKey))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		defer stopReplicas(rs)
		if replicasStarted != nil {
			replicasStarted(rs)
		}
		targets = targets[:0]
		for _, r := range rs {
			targets = append(targets, r.url+"/v1")
		}
		key = tenantKey
		if err := warmUp(ctx, targets); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
	}
	start = time.Now()
	for _, u := range ups {
		u.start = start
	}
	cs := newClients(sc, targets, key, primary, start)
	defer cs.close()
	actx, cancel := context.WithTimeout(ctx, sc.Duration)
	defer cancel()
	var samples []float64
	sampled := make(chan struct{})
	sctx, stopSampling := context.WithCancel(actx)
	go func() {
		defer close(sampled)
		cs.sampleQueue(sctx, ups, &samples)
	}()
	stopProgress := progress(o, sc.Name, arm, cs, start)
	cs.run(actx)
	stopSampling()
	<-sampled
	elapsed := time.Since(start)
	stopProgress()
	return measure(sc, arm, cs, ups, samples, elapsed), nil
}

// measure turns what the clients and the provider recorded into an Arm.
func measure(sc *scenario.Scenario, arm string, cs *clients, ups []*upstream, samples []float64, elapsed time.Duration) *Arm {
	a := &Arm{Name: arm, Seconds: round1(elapsed.Seconds())}
	cs.mu.Lock()
	records := append([]record(nil), cs.records...)
	rejects := append([]time.Duration(nil), cs.rejects...)
	cs.mu.Unlock()
	var calls []call
	for _, u := range ups {
		calls = append(calls, u.snapshot()...)
	}
	sort.SliceStable(calls, func(i, j int) bool { return calls[i].at < calls[j].at })

	records = slices.DeleteFunc(records, func(r record) bool {
		if r.cut {
			a.Cut++
		}
		return r.cut
	})
	a.Requests = len(records)
	var lat []float64
	classLat := make([][]float64, len(sc.Clients.Mix))
	classes := make([]ClassResult, len(sc.Clients.Mix))
	for i, cl := range sc.Clients.Mix {
		classes[i] = ClassResult{Model: cl.Model, Priority: cl.Priority}
	}
	for _, r := range records {
		classes[r.class].Requests++
		if r.ok {
			a.Succeeded++
			ms := float64(r.end-r.start) / float64(time.Millisecond)
			lat = append(lat, ms)
			classLat[r.class] = append(classLat[r.class], ms)
			classes[r.class].Succeeded++
		} else {
			if r.status == 429 {
				a.Failed429++
			}
			if a.Failures == nil {
				a.Failures = map[string]int{}
			}
			a.Failures[strconv.Itoa(r.status)]++
		}
	}
	if a.Requests > 0 {
		a.SuccessRate = round4(float64(a.Succeeded) / float64(a.Requests))
	}
	a.Client429 = len(rejects)
	slices.Sort(lat)
	a.LatencyMS = percentiles(lat)
	a.Histogram = histogram(lat)
	for i := range classes {
		slices.Sort(classLat[i])
		classes[i].LatencyMS = percentiles(classLat[i])
	}
	a.Classes = classes

	secs := int(math.Ceil(elapsed.Seconds()))
	a.Series = make([]Point, secs)
	for i := range a.Series {
		a.Series[i].Second = i
	}
	slot := func(d time.Duration) int { return max(0, min(int(d/time.Second), secs-1)) }
	for _, c := range calls {
		a.UpstreamCalls++
		switch {
		case c.admitted():
			if secs > 0 {
				a.Series[slot(c.at)].Admitted++
			}
		case c.status == 429:
			a.Provider429++
		case c.status >= 500:
			a.ProviderErrors++
		}
	}
	if secs > 0 {
		for _, t := range rejects {
			a.Series[slot(t)].Got429++
		}
		sums := make([]float64, secs)
		counts := make([]int, secs)
		for i, v := range samples {
			k := min(i/10, secs-1)
			sums[k] += v
			counts[k]++
		}
		for i := range sums {
			if counts[i] > 0 {
				a.Series[i].Queued = round1(sums[i] / float64(counts[i]))
			}
		}
	}

	// Billing and quota, per provider and model.
	prices := budget.DefaultPrices()
	var usedShare, allowedShare float64
	admittedPer := map[string]int{}
	for _, c := range ups[0].snapshot() {
		if c.admitted() {
			admittedPer[c.model]++
		}
	}
	for _, u := range ups {
		billed := u.billed()
		for _, m := range u.sc.Models {
			st := billed[m.Name]
			a.TokensBilled += st.PromptTokens + st.CompletionTokens
			in, out := m.InputPerMTok, m.OutputPerMTok
			if in == 0 && out == 0 {
				if p, ok := prices[m.Name]; ok {
					in, out = p.InputPerMTok, p.OutputPerMTok
				}
			}
			a.CostUSD += (float64(st.PromptTokens)*in + float64(st.CompletionTokens)*out) / 1e6
			rpm, tpm := u.sc.Limits(m)
			minutes := elapsed.Minutes()
			share := 0.0
			if rpm > 0 {
				share = max(share, float64(admittedPer[m.Name])/(float64(rpm)*(1+minutes)))
			}
			if tpm > 0 {
				share = max(share, float64(st.PromptTokens+st.CompletionTokens)/(float64(tpm)*(1+minutes)))
			}
			if u == ups[0] && (rpm > 0 || tpm > 0) {
				usedShare += share
				allowedShare++
			}
		}
	}
	a.CostUSD = math.Round(a.CostUSD*1e6) / 1e6
	if allowedShare > 0 {
		a.QuotaUsed = round4(usedShare / allowedShare)
	}

	if g := sc.Clients.Identical; g > 1 && sc.Conversations == nil {
		per := map[[8]byte]int{}
		for _, c := range calls {
			if c.status == 200 {
				per[c.prompt]++
			}
		}
		groups := (sc.Clients.Callers + g - 1) / g
		gr := &Groups{Groups: groups}
		if len(per) > 0 {
			gr.CallsMin = math.MaxInt
		}
		for _, v := range per {
			gr.CallsMin = min(gr.CallsMin, v)
			gr.CallsMax = max(gr.CallsMax, v)
		}
		a.Groups = gr
	}
	if cv := sc.Conversations; cv != nil {
		t := &Turns{Sessions: cv.Sessions, Sent: len(records)}
		t.Duplicates = t.Sent - min(t.Sent, cv.Sessions*cv.Turns)
		seen := map[int]int{}
		bad := map[int]bool{}
		for _, c := range calls {
			if c.status != 200 || c.session < 0 {
				continue
			}
			if last, ok := seen[c.session]; ok && c.turn < last {
				t.OutOfOrder++
				bad[c.session] = true
				continue
			}
			seen[c.session] = c.turn
		}
		t.SessionsOutOfOrder = len(bad)
		a.Turns = t
	}
	if b := sc.Gateway.Budget; b != nil {
		br := &BudgetResult{CapTokens: b.Tokens, CapUSD: b.USD}
		if b.Tokens > 0 {
			br.Over = max(br.Over, float64(a.TokensBilled-b.Tokens)/float64(b.Tokens))
		}
		if b.USD > 0 {
			br.Over = max(br.Over, (a.CostUSD-b.USD)/b.USD)
		}
		br.Over = round4(max(br.Over, 0))
		a.Budget = br
	}
	return a
}

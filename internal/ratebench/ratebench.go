// Package ratebench measures the rate limiter on Redis: decisions per second, latency, round trips and accuracy across processes, against a GCRA baseline.
//
// A throughput run has N workers, each with its own store client (as
// separate replicas would) unless SharedClient, deciding admissions in a
// loop for a duration: by default each decision checks a gateway request's
// three limits (deployment RPM, deployment TPM, tenant RPM) through package
// ratelimit. The same run then measures the baseline, the GCRA script of
// go-redis/redis_rate v10 on one limit, with the same workers and clients,
// so the two rates form a ratio measured under the same conditions. PING
// round trips before and after give the unit of latency, and the server's
// INFO commandstats how many commands each decision cost.
//
// An accuracy run (see Accuracy) starts several OS processes that share one
// limit and counts what they were admitted against the ideal.
package ratebench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/benchcli"
	"github.com/llmgate/llmgate/internal/lockbench"
	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/ratelimit"
)

// Defaults used by Main for flags left out.
const (
	DefaultWorkers  = 8
	DefaultDuration = 3 * time.Second
	DefaultPings    = 500
	DefaultLimits   = 3
	DefaultMaxOps   = 50_000_000
	// maxSamples bounds the latencies kept per worker.
	maxSamples = 1 << 20
	// maxErrors aborts a run whose decisions keep failing.
	maxErrors = 1000
)

// Errors from Run and Accuracy.
var (
	// ErrConfig wraps every complaint about a Config.
	ErrConfig = errors.New("ratebench: bad configuration")
	// ErrTooManyErrors means a run was cut short because decisions kept failing.
	ErrTooManyErrors = errors.New("ratebench: too many errors")
)

// Config describes one throughput run.
type Config struct {
	Store        string        // redis:// URL
	Workers      int           // concurrent workers
	Duration     time.Duration // per algorithm
	Limits       int           // 1, 2 or 3 limits per llmgate decision
	Settle       bool          // also Settle every admitted request (two round trips)
	Baseline     bool          // also measure the GCRA baseline
	SharedClient bool          // all workers share one client
	Local        bool          // llmgate with a local quota; the workers share one Limiter (one replica)
	Pings        int           // PINGs timed before and after
	MaxOps       int64         // upper bound on decisions per algorithm
	Hold         time.Duration // reservation hold (0: ratelimit.DefaultHold)
}

// Validate reports a Config that cannot run, in words a user can act on.
func (c Config) Validate() error {
	switch {
	case c.Workers < 1 || c.Workers > 10_000:
		return fmt.Errorf("%w: --workers must be between 1 and 10000, got %d", ErrConfig, c.Workers)
	case c.Duration <= 0 || c.Duration > time.Hour:
		return fmt.Errorf("%w: --duration must be positive and at most 1h, got %v", ErrConfig, c.Duration)
	case c.Limits < 1 || c.Limits > 3:
		return fmt.Errorf("%w: --limits must be 1, 2 or 3, got %d", ErrConfig, c.Limits)
	case c.Pings < 0 || c.Pings > 1_000_000:
		return fmt.Errorf("%w: --ping must be between 0 and 1000000, got %d", ErrConfig, c.Pings)
	case c.MaxOps < 1:
		return fmt.Errorf("%w: --max-ops must be at least 1, got %d", ErrConfig, c.MaxOps)
	case c.Hold < 0 || (c.Hold > 0 && c.Hold < time.Millisecond):
		return fmt.Errorf("%w: --hold must be at least 1ms, got %v", ErrConfig, c.Hold)
	case storeurl.IsMemory(c.Store):
		return fmt.Errorf("%w: the rate-limit benchmark needs a Redis store (--store redis://host:port)", ErrConfig)
	}
	return nil
}

// Phase is what one algorithm did in a run.
type Phase struct {
	Algo            string  `json:"algo"`
	Limits          int     `json:"limits"` // limits checked per decision
	Decisions       int64   `json:"decisions"`
	Admitted        int64   `json:"admitted"`
	Denied          int64   `json:"denied"`
	Errors          int64   `json:"errors"`
	FirstError      string  `json:"first_error,omitempty"`
	DurationS       float64 `json:"duration_s"`
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	P50Us           float64 `json:"p50_us"`
	P99Us           float64 `json:"p99_us"`
	// RoundTripsPerDecision is the commands the clients sent per decision
	// (EVALSHA, its EVAL fallback, Settle's script, BLPOP...): each is one
	// request/reply exchange with the server.
	RoundTripsPerDecision float64 `json:"round_trips_per_decision"`
	// ServerScriptsPerDecision is the script runs the server counted per
	// decision (INFO commandstats): it confirms RoundTripsPerDecision from
	// the other side.
	ServerScriptsPerDecision float64 `json:"server_scripts_per_decision"`
	// ServerCommandsPerDecision is the commands run inside the scripts per
	// decision: the server-side work.
	ServerCommandsPerDecision float64 `json:"server_commands_per_decision"`
	// ServerUsPerDecision is the server's time inside scripts per decision.
	ServerUsPerDecision float64 `json:"server_us_per_decision"`
	// Masters is what each master spent during the run, busiest first.
	Masters []MasterLoad `json:"masters"`
	// DecisionsPerBusiestCPUSec is the decisions per CPU-second of the
	// busiest master: the rate the store would sustain with a core per
	// master, when the masters are what limits it.
	DecisionsPerBusiestCPUSec float64 `json:"decisions_per_busiest_cpu_sec"`
	// ClientCPUSec is the CPU time this process (the benchmark's
	// clients) used during the run; 0 where it cannot be read.
	ClientCPUSec float64 `json:"client_cpu_sec"`
}

// MasterLoad is what one master spent during a run.
type MasterLoad struct {
	Addr string `json:"addr"`
	// CPUSec is its CPU time (INFO cpu: used_cpu_sys + used_cpu_user).
	CPUSec float64 `json:"cpu_sec"`
	// ScriptSec is its time inside scripts (INFO commandstats).
	ScriptSec float64 `json:"script_sec"`
	// Scripts is the script runs it served.
	Scripts int64 `json:"scripts"`
}

// loadOf fills in what each master spent between before and after, over
// n decisions.
func (ph *Phase) loadOf(before, after map[string]nodeLoad, n int64) {
	ph.Masters = ph.Masters[:0]
	for addr, a := range after {
		b, ok := before[addr]
		if !ok {
			continue // a master that took over during the run
		}
		d := diffStats(b.cmds, a.cmds)
		ph.Masters = append(ph.Masters, MasterLoad{Addr: addr, CPUSec: round(a.cpu-b.cpu, 3), ScriptSec: round(d.scriptTime.Seconds(), 3), Scripts: d.scripts})
	}
	slices.SortFunc(ph.Masters, func(x, y MasterLoad) int { return cmp.Compare(y.CPUSec, x.CPUSec) })
	if len(ph.Masters) > 0 && ph.Masters[0].CPUSec > 0 {
		ph.DecisionsPerBusiestCPUSec = math.Round(float64(n) / ph.Masters[0].CPUSec)
	}
}

// Result is the outcome of one throughput run; Main prints it as JSON.
type Result struct {
	Store        string  `json:"store"` // password redacted
	Workers      int     `json:"workers"`
	SharedClient bool    `json:"shared_client"`
	Local        bool    `json:"local_quota,omitempty"`
	Settle       bool    `json:"settle"`
	PingP50Us    float64 `json:"ping_p50_us"` // median of the PINGs before and after
	Phase                // llmgate: its fields are the top-level figures
	// Baseline is the GCRA run, when measured.
	Baseline *Phase `json:"baseline,omitempty"`
	// RatioVsBaseline is llmgate's decisions/s over the baseline's.
	RatioVsBaseline float64 `json:"ratio_vs_baseline,omitempty"`
	// DecisionPings is p50_us in PINGs.
	DecisionPings float64 `json:"decision_p50_pings,omitempty"`
	Interrupted   bool    `json:"interrupted,omitempty"`
	GoMaxProcs    int     `json:"gomaxprocs"`
	StartedAt     string  `json:"started_at"`
}

// requestFor returns the request of a throughput run: the first n of
// deployment RPM, deployment TPM and tenant RPM, so high that every
// decision admits (a refusal writes nothing and costs less). The limits
// stay below 1e14: the Redis backend cannot decode larger statuses (see
// the conformance test LargeLimits).
func requestFor(run string, n int, hold time.Duration) ratelimit.Request {
	dep, tenant := "deployment:"+run+"/gpt-4.1", "tenant:"+run
	all := []ratelimit.Charge{
		{Scope: dep, Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: 1 << 40, Window: time.Minute}},
		{Scope: dep, Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 1 << 45, Window: time.Minute}, Cost: 1500},
		{Scope: tenant, Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: 1 << 40, Window: time.Minute}},
	}
	return ratelimit.Request{Charges: all[:n], Hold: hold}
}

func newRunID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Run measures llmgate (and the baseline) under cfg. When ctx ends early it
// returns what was measured so far, marked Interrupted.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opt, err := storeurl.RedisOption(cfg.Store)
	if err != nil {
		return nil, err
	}
	res := &Result{
		Store: storeurl.Redact(cfg.Store), Workers: cfg.Workers, SharedClient: cfg.SharedClient, Settle: cfg.Settle, Local: cfg.Local,
		GoMaxProcs: runtime.GOMAXPROCS(0), StartedAt: time.Now().UTC().Format(time.RFC3339),
	}
	// Clients: one per worker (separate replicas), or one for all; plus
	// one for PINGs and INFO, outside the measured traffic.
	var sent atomic.Int64
	clients := make([]rueidis.Client, 0, cfg.Workers)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	nClients := cfg.Workers
	if cfg.SharedClient {
		nClients = 1
	}
	for range nClients {
		c, err := rueidis.NewClient(opt)
		if err != nil {
			return nil, fmt.Errorf("ratebench: cannot connect to %s: %w", storeurl.Redact(cfg.Store), err)
		}
		clients = append(clients, c)
	}
	ctl, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("ratebench: cannot connect to %s: %w", storeurl.Redact(cfg.Store), err)
	}
	defer ctl.Close()
	clientOf := func(w int) rueidis.Client { return countingClient{Client: clients[w%len(clients)], n: &sent} }

	var pings []time.Duration
	pingSome := func() error {
		for range cfg.Pings {
			t0 := time.Now()
			if err := ctl.Do(ctx, ctl.B().Ping().Build()).Error(); err != nil {
				return fmt.Errorf("ratebench: PING: %w", err)
			}
			pings = append(pings, time.Since(t0))
		}
		return nil
	}
	if err := pingSome(); err != nil {
		return nil, err
	}

	run := newRunID()
	req := requestFor(run, cfg.Limits, cfg.Hold)
	llmgate := make([]decider, cfg.Workers)
	var shared *ratelimit.Limiter
	if cfg.Local {
		shared = newLimiter(clientOf(0), "ratebench-"+run, true)
		defer func() { _ = shared.Close(context.WithoutCancel(ctx)) }()
	}
	for w := range llmgate {
		l := shared
		if l == nil {
			l = newLimiter(clientOf(w), "ratebench-"+run, false)
		}
		llmgate[w] = newLimiterDecider(l, req, false, cfg.Settle)
	}
	ph, interrupted, err := measure(ctx, ctl, &sent, AlgoLlmgate, cfg.Limits, llmgate, cfg)
	if err != nil {
		return nil, err
	}
	res.Phase = ph
	res.Interrupted = interrupted
	if cfg.Baseline && !interrupted {
		gcra := make([]decider, cfg.Workers)
		for w := range gcra {
			gcra[w] = newGCRADecider(clientOf(w), "ratebench:{gcra-"+run+"}", 1<<40, 1<<40, time.Minute)
		}
		bp, interrupted, err := measure(ctx, ctl, &sent, AlgoGCRA, 1, gcra, cfg)
		if err != nil {
			return nil, err
		}
		res.Baseline = &bp
		res.Interrupted = interrupted
		if bp.DecisionsPerSec > 0 {
			res.RatioVsBaseline = round(ph.DecisionsPerSec/bp.DecisionsPerSec, 3)
		}
	}
	if err := pingSome(); err != nil && ctx.Err() == nil {
		return nil, err
	}
	slices.Sort(pings)
	res.PingP50Us = us(lockbench.Percentile(pings, 50))
	if res.PingP50Us > 0 {
		res.DecisionPings = round(res.P50Us/res.PingP50Us, 2)
	}
	return res, nil
}

// measure runs ds, one worker each, for cfg.Duration.
func measure(ctx context.Context, ctl rueidis.Client, sent *atomic.Int64, algo string, limits int, ds []decider, cfg Config) (Phase, bool, error) {
	ph := Phase{Algo: algo, Limits: limits}
	// One untimed decision per worker: scripts loaded, connections up.
	for _, d := range ds {
		if _, err := d.decide(ctx); err != nil {
			return ph, false, fmt.Errorf("ratebench: %s: warm-up: %w", algo, err)
		}
	}
	before, err := loads(ctx, ctl)
	if err != nil {
		return ph, false, fmt.Errorf("ratebench: INFO: %w", err)
	}
	sent.Store(0)
	cpu0, _ := benchcli.ProcessCPU()
	type stats struct {
		admitted, denied, errs int64
		firstErr               error
		lat                    []time.Duration
	}
	all := make([]stats, len(ds))
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var ops, errCount atomic.Int64
	start := time.Now()
	stop := start.Add(cfg.Duration)
	var wg sync.WaitGroup
	for w, d := range ds {
		wg.Go(func() {
			st := &all[w]
			st.lat = make([]time.Duration, 0, 4096)
			for ops.Add(1) <= cfg.MaxOps {
				t0 := time.Now()
				if !t0.Before(stop) || runCtx.Err() != nil {
					return
				}
				ok, err := d.decide(runCtx)
				dt := time.Since(t0)
				if err != nil {
					if runCtx.Err() != nil {
						return
					}
					st.errs++
					if st.firstErr == nil {
						st.firstErr = err
					}
					if errCount.Add(1) >= maxErrors {
						cancel(fmt.Errorf("%w: %d failed decisions; first: %w", ErrTooManyErrors, errCount.Load(), st.firstErr))
						return
					}
					continue
				}
				if ok {
					st.admitted++
				} else {
					st.denied++
				}
				if len(st.lat) < maxSamples {
					st.lat = append(st.lat, dt)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if cpu1, ok := benchcli.ProcessCPU(); ok {
		ph.ClientCPUSec = round((cpu1 - cpu0).Seconds(), 3)
	}
	if cause := context.Cause(runCtx); cause != nil && errors.Is(cause, ErrTooManyErrors) {
		return ph, false, cause
	}
	commands := sent.Load()
	after, err := loads(context.WithoutCancel(ctx), ctl)
	if err != nil {
		return ph, false, fmt.Errorf("ratebench: INFO: %w", err)
	}
	var lat []time.Duration
	for _, st := range all {
		ph.Admitted += st.admitted
		ph.Denied += st.denied
		ph.Errors += st.errs
		if st.firstErr != nil && ph.FirstError == "" {
			ph.FirstError = st.firstErr.Error()
		}
		lat = append(lat, st.lat...)
	}
	slices.Sort(lat)
	ph.Decisions = ph.Admitted + ph.Denied
	ph.DurationS = round(elapsed.Seconds(), 3)
	if elapsed > 0 {
		ph.DecisionsPerSec = math.Round(float64(ph.Decisions) / elapsed.Seconds())
	}
	ph.P50Us = us(lockbench.Percentile(lat, 50))
	ph.P99Us = us(lockbench.Percentile(lat, 99))
	if n := ph.Decisions + ph.Errors; n > 0 {
		sd := diffStats(total(before), total(after))
		ph.loadOf(before, after, n)
		ph.RoundTripsPerDecision = round(float64(commands)/float64(n), 3)
		ph.ServerScriptsPerDecision = round(float64(sd.scripts)/float64(n), 3)
		ph.ServerCommandsPerDecision = round(float64(sd.inner)/float64(n), 2)
		ph.ServerUsPerDecision = round(float64(sd.scriptTime.Microseconds())/float64(n), 2)
	}
	return ph, ctx.Err() != nil, nil
}

// us converts d to microseconds rounded to 0.1.
func us(d time.Duration) float64 { return math.Round(float64(d)/100) / 10 }

func round(x float64, places int) float64 {
	f := math.Pow(10, float64(places))
	return math.Round(x*f) / f
}

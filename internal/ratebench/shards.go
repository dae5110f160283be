package ratebench

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/ratelimit"
	rlredis "github.com/llmgate/llmgate/ratelimit/redis"
)

// Defaults of a comparison run (ShardConfig).
const (
	DefaultDeployments = 64
	DefaultTenants     = 8
	DefaultReps        = 3
	// DefaultTenantLimitsPct: every tenant has a limit of its own.
	DefaultTenantLimitsPct = 100
)

// ShardConfig describes a run that compares one master with a Cluster:
// the same requests, spread over many deployments (and tenants), decided on
// the one master and on the Cluster in turn, each store used as the
// gateway uses it: on the Cluster every deployment and every tenant is a
// rate-limit group of its own (ratelimit.Sharded), on the one master all
// limits are in one group (unless SingleSharded).
type ShardConfig struct {
	Config        // Store is the Cluster; the rest applies to both
	Single string // the one master
	// Deployments is how many deployments the requests go to, in turn:
	// each is a group, so a Cluster spreads them over its masters.
	Deployments int
	// Tenants is how many tenants the requests come from, in turn; with
	// Limits 3 a request of a tenant with a limit also charges it, in the
	// tenant's group (on the Cluster, a request over two groups).
	Tenants int
	// TenantLimitsPct is the percentage of the tenants that have a limit
	// of their own (with Limits 3); the others' requests charge their
	// deployment's limits only, as the gateway does for tenants without
	// limits.
	TenantLimitsPct int
	// Reps is how many times each store is measured, alternately.
	Reps int
	// SingleSharded lays the limits out on the one master as on the
	// Cluster, a group per deployment and per tenant: the same work on
	// both stores, instead of what the gateway does on each.
	SingleSharded bool
}

// Validate reports a ShardConfig that cannot run.
func (c ShardConfig) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	switch {
	case c.Deployments < 1 || c.Deployments > 100_000:
		return fmt.Errorf("%w: --deployments must be between 1 and 100000, got %d", ErrConfig, c.Deployments)
	case c.Tenants < 1 || c.Tenants > 100_000:
		return fmt.Errorf("%w: --tenants must be between 1 and 100000, got %d", ErrConfig, c.Tenants)
	case c.Reps < 1 || c.Reps > 100:
		return fmt.Errorf("%w: --reps must be between 1 and 100, got %d", ErrConfig, c.Reps)
	case c.TenantLimitsPct < 0 || c.TenantLimitsPct > 100:
		return fmt.Errorf("%w: --tenant-limits must be a percentage from 0 to 100, got %d", ErrConfig, c.TenantLimitsPct)
	case storeurl.IsMemory(c.Single):
		return fmt.Errorf("%w: --single needs a Redis store (redis://host:port)", ErrConfig)
	}
	if _, err := storeurl.RedisOption(c.Single); err != nil {
		return fmt.Errorf("%w: --single: %w", ErrConfig, err)
	}
	return nil
}

// ShardRep is one repetition: each store measured once, back to back.
type ShardRep struct {
	Single  Phase `json:"single"`
	Cluster Phase `json:"cluster"`
	// Ratio is the Cluster's decisions/s over the one master's.
	Ratio float64 `json:"ratio"`
	// CapacityRatio is the same for decisions per CPU-second of the
	// busiest master: what the Cluster would reach over one master with a
	// core per master.
	CapacityRatio float64 `json:"capacity_ratio"`
	// BusiestShare is the share of the Cluster's scripts that its
	// busiest master ran.
	BusiestShare float64 `json:"busiest_share"`
	SingleFirst  bool    `json:"single_first"`
}

// ShardResult is the outcome of a comparison run.
type ShardResult struct {
	Single        string     `json:"single"`
	Cluster       string     `json:"cluster"`
	Masters       int        `json:"cluster_masters"`
	Workers       int        `json:"workers"`
	SharedClient  bool       `json:"shared_client"`
	Local         bool       `json:"local_quota,omitempty"`
	Settle        bool       `json:"settle"`
	Limits        int        `json:"limits"`
	Deployments   int        `json:"deployments"`
	Tenants       int        `json:"tenants"`
	SingleSharded bool       `json:"single_sharded"`
	TenantLimits  int        `json:"tenants_with_limits"`
	DurationS     float64    `json:"duration_s"` // per phase
	Reps          []ShardRep `json:"reps"`
	// Medians over the repetitions.
	SingleDecisionsPerSec  float64 `json:"single_decisions_per_sec"`
	ClusterDecisionsPerSec float64 `json:"cluster_decisions_per_sec"`
	Ratio                  float64 `json:"ratio"`
	CapacityRatio          float64 `json:"capacity_ratio"`
	BusiestShare           float64 `json:"busiest_share"`
	Interrupted            bool    `json:"interrupted,omitempty"`
	GoMaxProcs             int     `json:"gomaxprocs"`
	StartedAt              string  `json:"started_at"`
}

// limitedTenants is how many of the tenants have a limit of their own.
func (c ShardConfig) limitedTenants() int {
	if c.Limits < 3 {
		return 0
	}
	return (c.Tenants*c.TenantLimitsPct + 50) / 100
}

// shardRequests returns the requests of a comparison run, one per
// deployment, from the tenants in turn: the deployment's RPM (and TPM with
// limits 2 or 3), and with limits 3 the RPM of the tenant if it has one,
// all so high that every decision admits.
func shardRequests(run string, cfg ShardConfig) []ratelimit.Request {
	reqs := make([]ratelimit.Request, cfg.Deployments)
	limited := cfg.limitedTenants()
	for i := range reqs {
		dep := "dep:" + run + "/d" + strconv.Itoa(i)
		tenant := i % cfg.Tenants
		all := []ratelimit.Charge{
			{Scope: dep, Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: 1 << 40, Window: time.Minute}},
			{Scope: dep, Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 1 << 45, Window: time.Minute}, Cost: 1500},
			{Scope: "tenant:" + run + "/t" + strconv.Itoa(tenant), Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: 1 << 40, Window: time.Minute}},
		}
		n := cfg.Limits
		if n == 3 && tenant >= limited {
			n = 2
		}
		reqs[i] = ratelimit.Request{Charges: all[:n], Hold: cfg.Hold}
	}
	return reqs
}

// shardLimiter returns a limiter over c in which every scope is a group
// of its own (as the gateway's on a Cluster) when sharded, else one with
// every limit in one group (as the gateway's on one master).
func shardLimiter(c rueidis.Client, sharded, local bool) *ratelimit.Limiter {
	var opts []ratelimit.Option
	if local {
		opts = append(opts, ratelimit.WithLocalQuota(ratelimit.LocalQuota{}))
	}
	if !sharded {
		return ratelimit.New(rlredis.New(c, rlredis.Config{Group: "ratebench"}), opts...)
	}
	sh := ratelimit.NewSharded(func(scope string) string { return scope }, func(g string) ratelimit.Backend {
		return rlredis.New(c, rlredis.Config{Group: "ratebench-" + g})
	})
	return ratelimit.New(sh, opts...)
}

// rotatingDecider decides its requests in turn.
type rotatingDecider struct {
	ds   []*limiterDecider
	next int
}

func (r *rotatingDecider) decide(ctx context.Context) (bool, error) {
	d := r.ds[r.next]
	r.next = (r.next + 1) % len(r.ds)
	return d.decide(ctx)
}

// shardStore is one of the two stores of a comparison run, with its
// clients and deciders.
type shardStore struct {
	url      string
	clients  []rueidis.Client
	ctl      rueidis.Client
	deciders []decider
	limiters []*ratelimit.Limiter // with a local quota: one, shared
	sent     atomic.Int64
}

func openShardStore(url string, cfg ShardConfig, reqs []ratelimit.Request) (*shardStore, error) {
	opt, err := storeurl.RedisOption(url)
	if err != nil {
		return nil, err
	}
	s := &shardStore{url: url}
	n := cfg.Workers
	if cfg.SharedClient || cfg.Local {
		n = 1
	}
	for range n + 1 {
		c, err := rueidis.NewClient(opt)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("ratebench: cannot connect to %s: %w", storeurl.Redact(url), err)
		}
		s.clients = append(s.clients, c)
	}
	s.ctl, s.clients = s.clients[n], s.clients[:n]
	sharded := cfg.SingleSharded || s.ctl.Mode() == rueidis.ClientModeCluster
	for w := range cfg.Workers {
		var l *ratelimit.Limiter
		if len(s.limiters) > 0 && cfg.Local {
			l = s.limiters[0]
		} else {
			l = shardLimiter(countingClient{Client: s.clients[w%n], n: &s.sent}, sharded, cfg.Local)
			s.limiters = append(s.limiters, l)
		}
		rd := &rotatingDecider{next: (w * 7) % len(reqs)} // workers start apart
		for _, r := range reqs {
			rd.ds = append(rd.ds, newLimiterDecider(l, r, false, cfg.Settle))
		}
		s.deciders = append(s.deciders, rd)
	}
	return s, nil
}

func (s *shardStore) close() {
	for _, l := range s.limiters {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = l.Close(ctx)
		cancel()
	}
	for _, c := range s.clients {
		c.Close()
	}
	if s.ctl != nil {
		s.ctl.Close()
	}
}

// RunShards measures the same requests on the one master and on the
// Cluster, alternately (which goes first alternates too), cfg.Reps times,
// and reports each repetition and the medians.
func RunShards(ctx context.Context, cfg ShardConfig) (*ShardResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &ShardResult{
		Single: storeurl.Redact(cfg.Single), Cluster: storeurl.Redact(cfg.Store), Workers: cfg.Workers, SharedClient: cfg.SharedClient,
		Local: cfg.Local, Settle: cfg.Settle, Limits: cfg.Limits, Deployments: cfg.Deployments, Tenants: cfg.Tenants,
		TenantLimits: cfg.limitedTenants(), SingleSharded: cfg.SingleSharded, DurationS: cfg.Duration.Seconds(), GoMaxProcs: runtime.GOMAXPROCS(0), StartedAt: time.Now().UTC().Format(time.RFC3339),
	}
	reqs := shardRequests(newRunID(), cfg)
	single, err := openShardStore(cfg.Single, cfg, reqs)
	if err != nil {
		return nil, err
	}
	defer single.close()
	cluster, err := openShardStore(cfg.Store, cfg, reqs)
	if err != nil {
		return nil, err
	}
	defer cluster.close()
	if cluster.ctl.Mode() != rueidis.ClientModeCluster {
		return nil, fmt.Errorf("%w: --store must be a Redis Cluster to compare with --single", ErrConfig)
	}
reps:
	for i := range cfg.Reps {
		rep := ShardRep{SingleFirst: i%2 == 0}
		order := []*shardStore{single, cluster}
		if !rep.SingleFirst {
			order[0], order[1] = cluster, single
		}
		for _, st := range order {
			ph, interrupted, err := measure(ctx, st.ctl, &st.sent, AlgoLlmgate, cfg.Limits, st.deciders, cfg.Config)
			if err != nil && ctx.Err() != nil {
				interrupted, err = true, nil // cut short in its warm-up
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", storeurl.Redact(st.url), err)
			}
			if st == single {
				rep.Single = ph
			} else {
				rep.Cluster = ph
			}
			if interrupted {
				// The repetition cut short is left out; the medians
				// cover those before it.
				res.Interrupted = true
				break reps
			}
		}
		if rep.Single.DecisionsPerSec > 0 {
			rep.Ratio = round(rep.Cluster.DecisionsPerSec/rep.Single.DecisionsPerSec, 3)
		}
		if rep.Single.DecisionsPerBusiestCPUSec > 0 {
			rep.CapacityRatio = round(rep.Cluster.DecisionsPerBusiestCPUSec/rep.Single.DecisionsPerBusiestCPUSec, 3)
		}
		rep.BusiestShare = busiestShare(rep.Cluster.Masters)
		res.Masters = len(rep.Cluster.Masters)
		res.Reps = append(res.Reps, rep)
	}
	if len(res.Reps) == 0 {
		return res, nil
	}
	med := func(f func(ShardRep) float64) float64 {
		xs := make([]float64, len(res.Reps))
		for i, r := range res.Reps {
			xs[i] = f(r)
		}
		slices.Sort(xs)
		if len(xs)%2 == 1 {
			return xs[len(xs)/2]
		}
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	res.SingleDecisionsPerSec = math.Round(med(func(r ShardRep) float64 { return r.Single.DecisionsPerSec }))
	res.ClusterDecisionsPerSec = math.Round(med(func(r ShardRep) float64 { return r.Cluster.DecisionsPerSec }))
	res.Ratio = round(med(func(r ShardRep) float64 { return r.Ratio }), 3)
	res.CapacityRatio = round(med(func(r ShardRep) float64 { return r.CapacityRatio }), 3)
	res.BusiestShare = round(med(func(r ShardRep) float64 { return r.BusiestShare }), 3)
	return res, nil
}

// busiestShare is the largest share of the scripts that one of ms ran.
func busiestShare(ms []MasterLoad) float64 {
	var sum, most int64
	for _, m := range ms {
		sum += m.Scripts
		most = max(most, m.Scripts)
	}
	if sum == 0 {
		return 0
	}
	return round(float64(most)/float64(sum), 3)
}

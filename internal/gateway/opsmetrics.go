package gateway

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// opsMetrics are the series operators watch a fleet by: upstream latency
// and time to first token per deployment, the queue per lane, and (at
// scrape time, opsCollector) breakers, quotas, budgets, the store and the
// session locks. Labels are deployments and tenants: bounded by
// configuration and the tenant registry.
type opsMetrics struct {
	upstreamDuration *prometheus.HistogramVec
	ttft             *prometheus.HistogramVec
	queueDepth       *prometheus.GaugeVec
	queueWait        *prometheus.HistogramVec

	// durationSeries caches upstreamDuration's series by deployment:
	// every request observes one.
	durationSeries seriesCache[string, prometheus.Observer]
}

// latencyBuckets span a fast embedding (5ms) to a long completion (~5m).
var latencyBuckets = prometheus.ExponentialBuckets(0.005, 2, 16)

func newOpsMetrics(reg prometheus.Registerer) (*opsMetrics, error) {
	m := &opsMetrics{
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmgate_upstream_duration_seconds",
			Help:    "Time from the start of the upstream call (retries included) to the end of the answer relayed, by deployment.",
			Buckets: latencyBuckets,
		}, []string{"deployment"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmgate_upstream_time_to_first_token_seconds",
			Help:    "Streams: time from the start of the upstream call to the first bytes of the stream's events, by deployment.",
			Buckets: latencyBuckets,
		}, []string{"deployment"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmgate_queue_depth",
			Help: "Requests of this replica waiting in the rate-limit queue now, by lane (the deployment they wait for).",
		}, []string{"deployment"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmgate_queue_wait_seconds",
			Help:    "Time requests waited in the rate-limit queue, admitted or not, by lane (deployment).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 12),
		}, []string{"deployment"}),
	}
	for _, c := range []prometheus.Collector{m.upstreamDuration, m.ttft, m.queueDepth, m.queueWait} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// queued counts a request waiting for dep's lane until the returned
// function is called with how long it waited.
func (m *opsMetrics) queued(dep string) func(waited time.Duration) {
	g := m.queueDepth.WithLabelValues(dep)
	g.Inc()
	return func(waited time.Duration) {
		g.Dec()
		m.queueWait.WithLabelValues(dep).Observe(waited.Seconds())
	}
}

// upstreamDone observes an upstream call to dep that started at start.
func (m *opsMetrics) upstreamDone(dep string, start time.Time) {
	if !start.IsZero() {
		m.durationSeries.get(dep, func() prometheus.Observer {
			return m.upstreamDuration.WithLabelValues(dep)
		}).Observe(time.Since(start).Seconds())
	}
}

// firstToken wraps a stream's body to observe the time to its first bytes.
func (m *opsMetrics) firstToken(body io.ReadCloser, dep string, start time.Time) io.ReadCloser {
	if start.IsZero() {
		return body
	}
	return &firstRead{ReadCloser: body, observe: func() {
		m.ttft.WithLabelValues(dep).Observe(time.Since(start).Seconds())
	}}
}

type firstRead struct {
	io.ReadCloser
	once    sync.Once
	observe func()
}

func (r *firstRead) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if n > 0 {
		r.once.Do(r.observe)
	}
	return n, err
}

// maxBudgetSeries bounds the tenants whose remaining budget a scrape
// reports (each costs a store read).
const maxBudgetSeries = 200

// opsCollector reports, at each scrape, what is read rather than counted.
type opsCollector struct {
	g *Gateway

	breaker, limit, learned, headroom     *prometheus.Desc
	remainingUSD, remainingTokens, capUSD *prometheus.Desc
	budgetWaiting                         *prometheus.Desc
	lockAcquired, lockHandedOff, lockLost *prometheus.Desc
	tenantsInForce                        *prometheus.Desc
}

func newOpsCollector(g *Gateway) *opsCollector {
	d := prometheus.NewDesc
	return &opsCollector{
		g:        g,
		breaker:  d("llmgate_breaker_state", "Circuit breaker of each deployment on this replica: 1 for its current state (closed, half-open, open), 0 for the others.", []string{"deployment", "state"}, nil),
		limit:    d("llmgate_deployment_limit", "Configured quota of each deployment, by kind (rpm, tpm, concurrency); absent when not limited.", []string{"deployment", "kind"}, nil),
		learned:  d("llmgate_deployment_learned_limit", "Per-minute limits the provider reported for the deployment and still in force on this replica, by kind (rpm, tpm); absent when none.", []string{"deployment", "kind"}, nil),
		headroom: d("llmgate_deployment_headroom_ratio", "Smaller of the remaining requests and tokens fractions last seen for the deployment (1 = all of the quota left).", []string{"deployment"}, nil),
		remainingUSD: d("llmgate_budget_remaining_usd",
			"What is left of the tenant's money cap in the current period (cap minus spend), for tenants with a USD cap.", []string{"tenant"}, nil),
		remainingTokens: d("llmgate_budget_remaining_tokens",
			"What is left of the tenant's token cap in the current period, for tenants with a token cap.", []string{"tenant"}, nil),
		capUSD: d("llmgate_budget_limit_usd", "The tenant's money cap per period.", []string{"tenant"}, nil),
		budgetWaiting: d("llmgate_budget_waiting",
			"Requests of this replica waiting for budget room now (the tenant's requests in flight must settle first).", nil, nil),
		lockAcquired:   d("llmgate_session_locks_acquired_total", "Session leases obtained.", nil, nil),
		lockHandedOff:  d("llmgate_session_lock_handoffs_total", "Session leases handed to a waiting request by the previous request's release (the session was busy).", nil, nil),
		lockLost:       d("llmgate_session_locks_lost_total", "Session leases that ended lost rather than released (expired or taken over while held).", nil, nil),
		tenantsInForce: d("llmgate_tenants", "Tenants in force on this replica (the configuration file's and the registry's).", nil, nil),
	}
}

func (c *opsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.breaker, c.limit, c.learned, c.headroom, c.remainingUSD, c.remainingTokens, c.capUSD,
		c.budgetWaiting, c.lockAcquired, c.lockHandedOff, c.lockLost, c.tenantsInForce} {
		ch <- d
	}
}

var breakerStates = [...]string{"closed", "half-open", "open"}

func (c *opsCollector) Collect(ch chan<- prometheus.Metric) {
	g := c.g
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	now := time.Now()
	for _, d := range g.deps {
		st := g.opt.Upstream.State(d.Name)
		for _, s := range breakerStates {
			v := 0.0
			if s == st {
				v = 1
			}
			gauge(c.breaker, v, d.Name, s)
		}
		for kind, v := range map[string]int64{"rpm": d.Limits.RPM, "tpm": d.Limits.TPM, "concurrency": d.Limits.Concurrency} {
			if v > 0 {
				gauge(c.limit, float64(v), d.Name, kind)
			}
		}
		if v := d.learned[learnedRequests].get(now); v > 0 {
			gauge(c.learned, float64(v), d.Name, "rpm")
		}
		if v := d.learned[learnedTokens].get(now); v > 0 {
			gauge(c.learned, float64(v), d.Name, "tpm")
		}
		if d.Limits.any() {
			gauge(c.headroom, float64(d.headroom.Load())/1e6, d.Name)
		}
	}

	gauge(c.budgetWaiting, float64(g.opt.Budgets.Stats().Waiting))
	ix := g.tenants.Load()
	n := len(ix.list)
	if len(ix.byKey) == 0 {
		n = 0
	}
	gauge(c.tenantsInForce, float64(n))
	if l := g.opt.Sessions.Locker; l != nil {
		s := l.Stats()
		counter(c.lockAcquired, s.Acquired)
		counter(c.lockHandedOff, s.HandedOff)
		counter(c.lockLost, s.Lost)
	}

	// Budgets last: each is a store read, all within one deadline.
	ctx, cancel := context.WithTimeout(context.Background(), storePingTimeout)
	defer cancel()
	reported := 0
	for _, t := range ix.list {
		if t.Budget == nil || !t.capped() || reported >= maxBudgetSeries || ctx.Err() != nil {
			continue
		}
		reported++
		st, err := g.opt.Budgets.Spend(ctx, *t.Budget, now)
		if err != nil {
			continue
		}
		b := t.Budget
		if b.MicroUSD > 0 {
			gauge(c.capUSD, float64(b.MicroUSD)/1e6, t.Name)
			gauge(c.remainingUSD, float64(max(b.MicroUSD-st.Spent.MicroUSD, 0))/1e6, t.Name)
		}
		if b.Tokens > 0 {
			gauge(c.remainingTokens, float64(max(b.Tokens-st.Spent.Tokens, 0)), t.Name)
		}
	}
}

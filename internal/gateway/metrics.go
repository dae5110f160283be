package gateway

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/ratelimit"
)

// metrics are the gateway's Prometheus series. Label values are bounded by
// configuration (tenants, models, deployments), never by client input:
// model labels are only set for routed models.
type metrics struct {
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	upstream      *prometheus.CounterVec
	tokens        *prometheus.CounterVec
	cost          *prometheus.CounterVec
	limited       *prometheus.CounterVec
	budgetDenied  *prometheus.CounterVec
	fallbacks     *prometheus.CounterVec
	feedback429   *prometheus.CounterVec
	learned       *prometheus.CounterVec
	retries429    prometheus.Counter
	admissionWait prometheus.Histogram
	sessionWait   prometheus.Histogram
	sessionsLost  prometheus.Counter
	dedup         *prometheus.CounterVec
	cache         *prometheus.CounterVec
	settleErrors  prometheus.Counter
	clientTimeout *prometheus.CounterVec

	// The series every request touches, by label values: WithLabelValues
	// hashes and checks every value on each call.
	requestSeries  seriesCache[requestLabels, prometheus.Counter]
	durationSeries seriesCache[openai.Endpoint, prometheus.Observer]
	upstreamSeries seriesCache[[2]string, prometheus.Counter]    // deployment, status class
	tokenSeries    seriesCache[[3]string, [2]prometheus.Counter] // tenant, model, deployment: prompt, completion
}

type requestLabels struct {
	tenant, model, outcome string
	ep                     openai.Endpoint
}

// seriesCache maps label values to their series, made on first use. Its
// keys are the label values the metric already holds, so it grows no more
// than the metric does.
type seriesCache[K comparable, S any] struct {
	mu sync.RWMutex // protects m
	m  map[K]S
}

func (c *seriesCache[K, S]) get(k K, mk func() S) S {
	c.mu.RLock()
	s, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return s
	}
	s = mk()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[K]S)
	}
	c.m[k] = s
	return s
}

// upstreamAnswer counts an answer of deployment dep with status.
func (m *metrics) upstreamAnswer(dep string, status int) {
	k := [2]string{dep, statusClass(status)}
	m.upstreamSeries.get(k, func() prometheus.Counter { return m.upstream.WithLabelValues(k[0], k[1]) }).Inc()
}

// tokensUsed counts the tokens of a request of tenant on model at dep.
func (m *metrics) tokensUsed(tenant, model, dep string, prompt, completion int64) {
	k := [3]string{tenant, model, dep}
	s := m.tokenSeries.get(k, func() [2]prometheus.Counter {
		return [2]prometheus.Counter{m.tokens.WithLabelValues(tenant, model, dep, "prompt"), m.tokens.WithLabelValues(tenant, model, dep, "completion")}
	})
	s[0].Add(float64(prompt))
	s[1].Add(float64(completion))
}

// admissionCollector reports the limiter's admissions by path: "local"
// from a local quota block, "store" decided by the store.
type admissionCollector struct {
	l    *ratelimit.Limiter
	desc *prometheus.Desc
}

func newAdmissionCollector(l *ratelimit.Limiter) *admissionCollector {
	return &admissionCollector{l: l, desc: prometheus.NewDesc("llmgate_rate_limit_admissions_total",
		"Requests admitted by the rate limits, by path: local (from a block this replica reserved in the store) or store (one store decision each).",
		[]string{"path"}, nil)}
}

func (c *admissionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *admissionCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.l.Stats()
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(st.Local), "local")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(st.Admitted-st.Local), "store")
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_requests_total", Help: "Client requests by tenant, endpoint, model and outcome.",
		}, []string{"tenant", "endpoint", "model", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmgate_request_duration_seconds", Help: "Time from request to the end of the answer.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"endpoint"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_upstream_responses_total", Help: "Upstream answers relayed, by deployment and status class.",
		}, []string{"deployment", "status"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_tokens_total", Help: "Tokens used, by tenant, model, deployment and kind (prompt, completion).",
		}, []string{"tenant", "model", "deployment", "kind"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_cost_usd_total", Help: "Cost in US dollars from the price table, by tenant and model.",
		}, []string{"tenant", "model"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_rate_limited_total", Help: "Requests answered 429 by the gateway's limits, by scope kind and limit kind.",
		}, []string{"scope", "kind"}),
		budgetDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_budget_denied_total", Help: "Requests denied because the tenant's budget is used up.",
		}, []string{"tenant"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_fallbacks_total", Help: "Requests moved to the next route target after this deployment failed.",
		}, []string{"deployment"}),
		feedback429: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_upstream_429_total", Help: "429 answers from providers (each one slows every replica down).",
		}, []string{"deployment"}),
		learned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_provider_limits_learned_total",
			Help: "Provider limits (from x-ratelimit-limit-* or a 429's message) shared with every replica, below the configured ones or replacing a lower one, by deployment and kind (requests, tokens).",
		}, []string{"deployment", "kind"}),
		retries429: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgate_upstream_429_retries_total", Help: "Requests sent back to the rate-limit queue after a provider 429.",
		}),
		admissionWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "llmgate_admission_wait_seconds", Help: "Time requests waited in the rate-limit queue.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 12),
		}),
		sessionWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "llmgate_session_wait_seconds", Help: "Time requests waited for their session's earlier requests.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 12),
		}),
		sessionsLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgate_session_leases_lost_total",
			Help: "Session requests stopped because their session lease was lost (the replica was paused or cut off from the store past sessions.ttl): before their upstream call, or with it cancelled.",
		}),
		dedup: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_dedup_total", Help: "Requests that shared an upstream call, by role (leader made it, follower received it).",
		}, []string{"role"}),
		cache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_cache_lookups_total", Help: "Response cache lookups, by result (hit, miss).",
		}, []string{"result"}),
		settleErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgate_settle_errors_total", Help: "Finished requests whose usage could not be recorded in the store.",
		}),
		clientTimeout: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_client_timeouts_total",
			Help: "Client connections cut because the client was too slow, by what it was slow at: body (sending the request body), write (taking an answer or a stream event).",
		}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.upstream, m.tokens, m.cost, m.limited,
		m.budgetDenied, m.fallbacks, m.feedback429, m.learned, m.retries429, m.admissionWait, m.sessionWait, m.sessionsLost, m.dedup, m.cache, m.settleErrors, m.clientTimeout} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observeRequest counts a finished request. model is the model the client
// asked for, used as a label only when it was routed (known).
func (m *metrics) observeRequest(c *call, ep openai.Endpoint, model string) {
	tenant := ""
	if c.tenant != nil {
		tenant = c.tenant.Name
	}
	if c.targets == nil {
		model = "" // unknown or unrouted: never a client-chosen label value
	}
	k := requestLabels{tenant: tenant, model: model, outcome: c.outcome, ep: ep}
	m.requestSeries.get(k, func() prometheus.Counter {
		return m.requests.WithLabelValues(tenant, ep.String(), model, k.outcome)
	}).Inc()
	m.durationSeries.get(ep, func() prometheus.Observer {
		return m.duration.WithLabelValues(ep.String())
	}).Observe(time.Since(c.start).Seconds())
}

// metricsHandler serves /metrics, behind the metrics token when one is
// configured: the series name tenants, models and their spend.
func (g *Gateway) metricsHandler() http.Handler {
	h := promhttp.HandlerFor(g.registry, promhttp.HandlerOpts{})
	if g.opt.MetricsTokenSHA256 == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tokenMatches(r, g.opt.MetricsTokenSHA256) {
			setRequestID(w, r)
			errf(http.StatusUnauthorized, "authentication_error", "invalid_metrics_token", "",
				"/metrics needs the metrics token as 'Authorization: Bearer TOKEN'.").Write(w)
			return
		}
		h.ServeHTTP(w, r)
	})
}

package gateway

import (
	"net/http"
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
	dedup         *prometheus.CounterVec
	cache         *prometheus.CounterVec
	settleErrors  prometheus.Counter
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
		dedup: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_dedup_total", Help: "Requests that shared an upstream call, by role (leader made it, follower received it).",
		}, []string{"role"}),
		cache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_cache_lookups_total", Help: "Response cache lookups, by result (hit, miss).",
		}, []string{"result"}),
		settleErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgate_settle_errors_total", Help: "Finished requests whose usage could not be recorded in the store.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.upstream, m.tokens, m.cost, m.limited,
		m.budgetDenied, m.fallbacks, m.feedback429, m.learned, m.retries429, m.admissionWait, m.sessionWait, m.dedup, m.cache, m.settleErrors} {
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
	m.requests.WithLabelValues(tenant, ep.String(), model, c.outcome).Inc()
	m.duration.WithLabelValues(ep.String()).Observe(time.Since(c.start).Seconds())
}

func (g *Gateway) metricsHandler() http.Handler {
	return promhttp.HandlerFor(g.registry, promhttp.HandlerOpts{})
}

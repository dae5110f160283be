package gateway

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/ratelimit"
)

// storePingTimeout bounds the store check of one /metrics scrape.
const storePingTimeout = time.Second

// storeCollector reports the coordination store's health at every scrape:
// whether it answers now, how many store calls failed, and how many
// requests were admitted without a check because it failed.
type storeCollector struct {
	pingStore func(context.Context) error
	limiter   *ratelimit.Limiter
	budgets   *budget.Manager

	up, ping, errors, failedOpen, failedClosed *prometheus.Desc
}

func newStoreCollector(ping func(context.Context) error, l *ratelimit.Limiter, b *budget.Manager) *storeCollector {
	return &storeCollector{
		pingStore: ping, limiter: l, budgets: b,
		up: prometheus.NewDesc("llmgate_store_up",
			"1 when the coordination store answered a PING at this scrape (within 1s), else 0.", nil, nil),
		ping: prometheus.NewDesc("llmgate_store_ping_seconds",
			"Round trip of the PING this scrape sent to the coordination store; absent when it failed (about 0 on the memory store).", nil, nil),
		errors: prometheus.NewDesc("llmgate_store_errors_total",
			"Store calls that failed, by component (ratelimit, budget).", []string{"component"}, nil),
		failedOpen: prometheus.NewDesc("llmgate_fail_open_total",
			"Requests admitted without a check because the store failed, by check (ratelimit; budget with budget.fail_open).", []string{"check"}, nil),
		failedClosed: prometheus.NewDesc("llmgate_fail_closed_total",
			"Requests refused (503) because the store failed and the check fails closed, by check (ratelimit with ratelimit.fail_closed).", []string{"check"}, nil),
	}
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.ping
	ch <- c.errors
	ch <- c.failedOpen
	ch <- c.failedClosed
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), storePingTimeout)
	up := 0.0
	start := time.Now()
	if c.pingStore(ctx) == nil {
		up = 1
		ch <- prometheus.MustNewConstMetric(c.ping, prometheus.GaugeValue, time.Since(start).Seconds())
	}
	cancel()
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
	rl := c.limiter.Stats()
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(rl.StoreErrors), "ratelimit")
	ch <- prometheus.MustNewConstMetric(c.failedOpen, prometheus.CounterValue, float64(rl.FailedOpen), "ratelimit")
	ch <- prometheus.MustNewConstMetric(c.failedClosed, prometheus.CounterValue, float64(rl.FailedClosed), "ratelimit")
	if c.budgets != nil {
		bs := c.budgets.Stats()
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(bs.StoreErrors), "budget")
		ch <- prometheus.MustNewConstMetric(c.failedOpen, prometheus.CounterValue, float64(bs.FailedOpen), "budget")
	}
}

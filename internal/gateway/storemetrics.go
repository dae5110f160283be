package gateway

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/ratelimit"
)

// storePingTimeout bounds the store check of one /metrics scrape.
const storePingTimeout = time.Second

// Values of the store label: the coordination store, and the cache's own
// store when it has one.
const (
	storeCoordination = "coordination"
	storeCache        = "cache"
)

// storeCollector reports the stores' health at every scrape: whether they
// answer now, how many store calls failed, and how many requests were
// admitted without a check because the coordination store failed.
type storeCollector struct {
	pingStore func(context.Context) error
	pingCache func(context.Context) error // nil: the cache has no store of its own
	limiter   *ratelimit.Limiter
	budgets   *budget.Manager
	cache     *respcache.Breaker // nil without a cache

	up, ping, errors, failedOpen, failedClosed *prometheus.Desc
}

func newStoreCollector(opt Options, cache *respcache.Breaker) *storeCollector {
	return &storeCollector{
		pingStore: opt.Ready, pingCache: opt.Cache.Ping, limiter: opt.Limiter, budgets: opt.Budgets, cache: cache,
		up: prometheus.NewDesc("llmgate_store_up",
			"1 when the store answered a PING at this scrape (within 1s), else 0; store is coordination, or cache for the cache's own store.", []string{"store"}, nil),
		ping: prometheus.NewDesc("llmgate_store_ping_seconds",
			"Round trip of the PING this scrape sent to the store; absent when it failed (about 0 on the memory store).", []string{"store"}, nil),
		errors: prometheus.NewDesc("llmgate_store_errors_total",
			"Store calls that failed, by component (ratelimit, budget, cache) and the store they went to.", []string{"component", "store"}, nil),
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
	c.collectPing(ch, c.pingStore, storeCoordination)
	cacheStore := storeCoordination
	if c.pingCache != nil {
		cacheStore = storeCache
		c.collectPing(ch, c.pingCache, storeCache)
	}
	rl := c.limiter.Stats()
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(rl.StoreErrors), "ratelimit", storeCoordination)
	ch <- prometheus.MustNewConstMetric(c.failedOpen, prometheus.CounterValue, float64(rl.FailedOpen), "ratelimit")
	ch <- prometheus.MustNewConstMetric(c.failedClosed, prometheus.CounterValue, float64(rl.FailedClosed), "ratelimit")
	if c.budgets != nil {
		bs := c.budgets.Stats()
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(bs.StoreErrors), "budget", storeCoordination)
		ch <- prometheus.MustNewConstMetric(c.failedOpen, prometheus.CounterValue, float64(bs.FailedOpen), "budget")
	}
	if c.cache != nil {
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(c.cache.Failures()), "cache", cacheStore)
	}
}

// collectPing sends one store's up and ping series.
func (c *storeCollector) collectPing(ch chan<- prometheus.Metric, ping func(context.Context) error, store string) {
	ctx, cancel := context.WithTimeout(context.Background(), storePingTimeout)
	defer cancel()
	up := 0.0
	start := time.Now()
	if ping(ctx) == nil {
		up = 1
		ch <- prometheus.MustNewConstMetric(c.ping, prometheus.GaugeValue, time.Since(start).Seconds(), store)
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up, store)
}

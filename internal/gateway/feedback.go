package gateway

import (
	"context"
	"time"

	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/ratelimit"
)

// defaultCooldown is how long every replica holds back from a deployment
// that answered 429 without saying for how long.
const defaultCooldown = time.Second

// feedbackTimeout bounds the store call that shares a provider's signal.
const feedbackTimeout = 2 * time.Second

// Feedback feeds what a provider said about its limits into the shared
// limiter: a 429 makes every replica hold back until the provider's reset,
// and a nearly exhausted x-ratelimit-remaining lowers the shared bucket.
// Pass it as provider.Config.Feedback. Only a 429 waits for the store.
func (g *Gateway) Feedback(t *provider.Target, f provider.Feedback) {
	d := g.byName[t.Name]
	if d == nil {
		return
	}
	d.learnProvider(f.LimitRequests, f.RemainingRequests, f.LimitTokens, f.RemainingTokens)
	if f.Status == 429 {
		g.metrics.feedback429.WithLabelValues(d.Name).Inc()
		wait := f.RetryAfter
		if wait <= 0 {
			wait = defaultCooldown
		}
		// Synchronously: by the time anyone sees this 429, every replica
		// holds back. 429s are rare once the limits are configured right.
		ctx, cancel := context.WithTimeout(context.Background(), feedbackTimeout)
		defer cancel()
		if _, err := g.opt.Limiter.Cooldown(ctx, d.scope, wait); err != nil {
			g.log.Warn("could not share a provider 429 with other replicas", "deployment", d.Name, "err", err)
		}
		return
	}
	// Lower the shared buckets only when the provider is nearly out: that
	// is when its count matters, and it keeps the hot path free of store
	// calls the rest of the time.
	if d.Limits.RPM > 0 && f.RemainingRequests >= 0 && f.LimitRequests > 0 && f.RemainingRequests*10 < f.LimitRequests {
		g.observe(d, ratelimit.Limit{Kind: ratelimit.Requests, Limit: d.Limits.RPM, Window: time.Minute}, f.RemainingRequests)
	}
	if d.Limits.TPM > 0 && f.RemainingTokens >= 0 && f.LimitTokens > 0 && f.RemainingTokens*10 < f.LimitTokens {
		g.observe(d, ratelimit.Limit{Kind: ratelimit.Tokens, Limit: d.Limits.TPM, Window: time.Minute}, f.RemainingTokens)
	}
}

func (g *Gateway) observe(d *deployment, l ratelimit.Limit, remaining int64) {
	if !d.observing.CompareAndSwap(false, true) {
		return // one report in flight per deployment is enough
	}
	g.background(feedbackTimeout, func(ctx context.Context) {
		defer d.observing.Store(false)
		if err := g.opt.Limiter.Observe(ctx, d.scope, l, remaining); err != nil {
			g.log.Warn("could not share a provider's remaining quota", "deployment", d.Name, "err", err)
		}
	})
}

// background runs f in its own goroutine with a context bounded by
// timeout, tracked by Close.
func (g *Gateway) background(timeout time.Duration, f func(ctx context.Context)) {
	g.pending.Add(1)
	go func() {
		defer g.pending.Done()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		f(ctx)
	}()
}

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
// limiter: a 429 makes every replica hold back until the provider's reset;
// a limit below the configured one (x-ratelimit-limit-*, or a 429's "Limit
// 5, Used 5") holds every replica to it, from what the provider says is
// left, for learnTTL; and a nearly exhausted x-ratelimit-remaining lowers
// the shared bucket. Pass it as provider.Config.Feedback. Only a 429 waits
// for the store; outside one, a learned limit is shared when it is new and
// then every half learnTTL, so the hot path makes no store call for it.
func (g *Gateway) Feedback(t *provider.Target, f provider.Feedback) {
	d := g.byName[t.Name]
	if d == nil {
		return
	}
	now := time.Now()
	rep := providerLimits(f)
	d.learnProvider(rep, now)
	if f.Status == 429 || f.Status == statusOverloaded {
		// Anthropic's 529 (overloaded) asks everyone to back off too.
		if f.Status == 429 {
			g.metrics.feedback429.WithLabelValues(d.Name).Inc()
		}
		wait := f.RetryAfter
		if wait <= 0 {
			wait = defaultCooldown
		}
		// Synchronously: by the time anyone sees this 429, every replica
		// holds back, and after the cooldown goes at the provider's pace.
		// 429s are rare once the limits are configured right. The limit
		// first: it marks this replica's local blocks to give nothing
		// back on it before the cooldown retires them.
		ctx, cancel := context.WithTimeout(context.Background(), feedbackTimeout)
		defer cancel()
		for k, r := range rep {
			if r.limit > 0 && d.shareDue(k, r.limit, now, true) {
				d.markShared(k, r.limit, now)
				g.learn(ctx, d, k, r)
			}
		}
		if _, err := g.opt.Limiter.Cooldown(ctx, d.scope, wait); err != nil {
			g.log.Warn("could not share a provider 429 with other replicas", "deployment", d.Name, "err", err)
		}
		return
	}
	if d.dueToShare(rep, now) && d.sharing.CompareAndSwap(false, true) {
		var due []int
		for k, r := range rep {
			if r.limit > 0 && d.shareDue(k, r.limit, now, false) {
				d.markShared(k, r.limit, now)
				due = append(due, k)
			}
		}
		g.workers.run(feedbackTimeout, func(ctx context.Context) {
			defer d.sharing.Store(false)
			for _, k := range due {
				g.learn(ctx, d, k, rep[k])
			}
		})
	}
	// Lower the shared buckets only when the provider is nearly out: that
	// is when its count matters, and it keeps the hot path free of store
	// calls the rest of the time.
	if d.Limits.RPM > 0 && f.RemainingRequests >= 0 && f.LimitRequests > 0 && f.RemainingRequests*10 < f.LimitRequests {
		g.observe(d, d.scope, ratelimit.Limit{Kind: ratelimit.Requests, Limit: d.Limits.RPM, Window: time.Minute}, f.RemainingRequests)
	}
	if d.Limits.TPM > 0 && f.RemainingTokens >= 0 && f.LimitTokens > 0 && f.RemainingTokens*10 < f.LimitTokens {
		g.observe(d, d.scope, ratelimit.Limit{Kind: ratelimit.Tokens, Limit: d.Limits.TPM, Window: time.Minute}, f.RemainingTokens)
	}
	// Anthropic's input and output tokens per minute, on their scopes.
	if d.Limits.ITPM > 0 && f.RemainingInputTokens >= 0 && f.LimitInputTokens > 0 && f.RemainingInputTokens*10 < f.LimitInputTokens {
		g.observe(d, d.inScope, ratelimit.Limit{Kind: ratelimit.Tokens, Limit: d.Limits.ITPM, Window: time.Minute}, f.RemainingInputTokens)
	}
	if d.Limits.OTPM > 0 && f.RemainingOutputTokens >= 0 && f.LimitOutputTokens > 0 && f.RemainingOutputTokens*10 < f.LimitOutputTokens {
		g.observe(d, d.outScope, ratelimit.Limit{Kind: ratelimit.Tokens, Limit: d.Limits.OTPM, Window: time.Minute}, f.RemainingOutputTokens)
	}
}

// statusOverloaded is Anthropic's 529.
const statusOverloaded = 529

// dueToShare reports whether any limit in rep is due to be shared (most
// responses: none, and no atomic write is made).
func (d *deployment) dueToShare(rep [learnedKinds]reportedLimit, now time.Time) bool {
	for k, r := range rep {
		if r.limit > 0 && d.shareDue(k, r.limit, now, false) {
			return true
		}
	}
	return false
}

// learn shares the provider's limit r of kind k (learnedRequests or
// learnedTokens) with every replica: the shared bucket is held to it and
// drops to what the provider says is left.
func (g *Gateway) learn(ctx context.Context, d *deployment, k int, r reportedLimit) {
	kind, label := ratelimit.Tokens, [learnedKinds]string{"requests", "tokens", "input_tokens", "output_tokens"}[k]
	if k == learnedRequests {
		kind = ratelimit.Requests
	}
	lim := ratelimit.Limit{Kind: kind, Limit: d.charged(k, r.limit), Window: time.Minute}
	err := g.opt.Limiter.Learn(ctx, d.kindScope(k), lim, ratelimit.Learned{Limit: r.limit, Remaining: r.remaining, TTL: learnTTL})
	if err != nil {
		d.learned[k].sharedAt.Store(0) // again at the next report
		g.log.Warn("could not share a provider's limit with other replicas", "deployment", d.Name, "kind", label, "limit", r.limit, "err", err)
		return
	}
	g.metrics.learned.WithLabelValues(d.Name, label).Inc()
	g.log.Debug("provider limit shared with every replica", "deployment", d.Name, "kind", label, "limit", r.limit, "remaining", r.remaining)
}

func (g *Gateway) observe(d *deployment, scope string, l ratelimit.Limit, remaining int64) {
	if !d.observing.CompareAndSwap(false, true) {
		return // one report in flight per deployment is enough
	}
	g.workers.run(feedbackTimeout, func(ctx context.Context) {
		defer d.observing.Store(false)
		if err := g.opt.Limiter.Observe(ctx, scope, l, remaining); err != nil {
			g.log.Warn("could not share a provider's remaining quota", "deployment", d.Name, "err", err)
		}
	})
}

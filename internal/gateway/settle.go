package gateway

import (
	"context"
	"strconv"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/ratelimit"
)

// finish records a relayed request: the rate limits are settled with the
// real token count and the budget is charged (or released when usage is nil:
// the provider refused the request). It runs after the answer reached the
// client: on the caller's goroutine what needs no store call (the limits,
// most of the time, and the usage of a tenant without a budget cap, which
// is batched), the rest in the background; Close waits for it.
func (g *Gateway) finish(c *call, adm admitted, res budget.Reservation, usage *openai.Usage) {
	_, end := g.stage(c.access.tctx, c, "settle")
	defer end()
	var answer int64 // an unbounded answer's size, which the budget store learns from
	if usage != nil {
		if c.access.usage == nil {
			g.used(c, adm.dep.Model, usage)
		}
		g.metrics.tokensUsed(c.tenant.Name, adm.dep.Model, adm.dep.Name, usage.PromptTokens, usage.CompletionTokens)
		answer = g.learnCompletion(c, usage)
	}
	g.charge(c, adm, res, usage, answer)
}

// finishUnanswered records a request the provider has, whose answer its
// client will never get (it left, or the shutdown cut it) and that said
// nothing of what it used: the provider may still do the work and bill it,
// so the request is charged its estimate, the most it may cost.
func (g *Gateway) finishUnanswered(c *call, adm admitted, res budget.Reservation) {
	g.charge(c, adm, res, &openai.Usage{PromptTokens: c.promptEstimate, CompletionTokens: c.completionEstimate}, 0)
}

// charge settles the limits and the budget with usage (nil: nothing used);
// answer, when positive, is what the budget store learns estimates from.
func (g *Gateway) charge(c *call, adm admitted, res budget.Reservation, usage *openai.Usage, answer int64) {
	limitsDone := g.settleLimitsNow(c, adm, usage)
	switch {
	case limitsDone && usage == nil && res.Hold == (budget.Amount{}):
		return // nothing held, nothing to record
	case limitsDone && usage != nil && !c.tenant.capped():
		g.usage.add(res, g.usageRecord(adm, usage))
		return
	}
	g.finishInBackground(c, adm, res, usage, answer, !limitsDone)
}

// finishInBackground is finish's work on a background worker (the limits
// too when settleLimits is set). A function of its own: the values its
// closure captures would otherwise be moved to the heap on every call of
// finish, when most return before it.
func (g *Gateway) finishInBackground(c *call, adm admitted, res budget.Reservation, usage *openai.Usage, answer int64, settleLimits bool) {
	g.workers.run(settleTimeout, func(ctx context.Context) {
		if settleLimits {
			g.settleLimits(ctx, c, adm, usage)
		}
		if usage == nil {
			if res.Hold != (budget.Amount{}) {
				if err := g.opt.Budgets.Release(ctx, res); err != nil {
					g.log.Warn("budget release failed; the hold expires by itself", "request_id", c.id, "err", err)
				}
			}
			return
		}
		rec := g.usageRecord(adm, usage)
		if !c.tenant.capped() {
			g.usage.add(res, rec) // nothing to enforce: recorded with others
			return
		}
		rec.LearnCompletion = answer
		s, err := g.settleBudget(ctx, res, rec)
		if err != nil {
			g.metrics.settleErrors.Inc()
			g.log.Error("usage could not be recorded", "request_id", c.id, "tenant", c.tenant.Name, "err", err)
			return
		}
		g.metrics.cost.WithLabelValues(c.tenant.Name, adm.dep.Model).Add(float64(s.Record.MicroUSD) / 1e6)
	})
}

// usageRecord is what a request used on adm's deployment.
func (g *Gateway) usageRecord(adm admitted, usage *openai.Usage) budget.Record {
	return budget.Record{
		Model:      adm.dep.Model,
		Deployment: adm.dep.Name,
		Usage: budget.Usage{
			PromptTokens:     usage.PromptTokens,
			CompletionTokens: usage.CompletionTokens,
			CachedTokens:     usage.Cached(),
		},
	}
}

// settleBudget charges rec, retrying store failures within ctx: a settle is
// the only record of money spent, and a retry cannot charge twice.
func (g *Gateway) settleBudget(ctx context.Context, res budget.Reservation, rec budget.Record) (budget.Settled, error) {
	backoff := 50 * time.Millisecond
	for {
		s, err := g.opt.Budgets.Settle(ctx, res, rec)
		if err == nil || ctx.Err() != nil {
			return s, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return s, err
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// settleLimits replaces the token estimate by what was used; with usage nil
// the request counts but its tokens are refunded, except on the deployment
// when the provider refused it with 429 (see settleRefused).
func (g *Gateway) settleLimits(ctx context.Context, c *call, adm admitted, usage *openai.Usage) {
	if adm.decision.ID == "" {
		return
	}
	if err := g.opt.Limiter.Settle(ctx, adm.decision.ID, actualCosts(adm, usage)); err != nil {
		g.log.Warn("rate-limit settle failed; the reservation expires charged its estimate, or a stream's usage at its last renewal", "request_id", c.id, "err", err)
	}
}

// settleLimitsNow is settleLimits when it needs no store call; it reports
// false, having done nothing, when it does.
func (g *Gateway) settleLimitsNow(c *call, adm admitted, usage *openai.Usage) bool {
	if adm.decision.ID == "" {
		return true
	}
	done, err := g.opt.Limiter.SettleNow(adm.decision.ID, actualCosts(adm, usage))
	if err != nil {
		g.log.Warn("rate-limit settle failed; the reservation expires charged its estimate, or a stream's usage at its last renewal", "request_id", c.id, "err", err)
	}
	return done
}

// actualCosts is what adm's charges really cost given usage.
func actualCosts(adm admitted, usage *openai.Usage) []int64 {
	actual := make([]int64, len(adm.charges))
	var prompt, completion int64
	if usage != nil {
		prompt, completion = usage.PromptTokens, usage.CompletionTokens
	}
	for i, ch := range adm.charges {
		used := prompt + completion
		switch ch.Scope {
		case adm.dep.inScope:
			used = prompt
		case adm.dep.outScope:
			used = completion
		}
		switch {
		case ch.Limit.Kind == ratelimit.Tokens && !(adm.refused && adm.dep.ownScope(ch.Scope)):
			actual[i] = min(used, ratelimit.MaxAmount)
		default:
			actual[i] = ch.Cost
		}
	}
	return actual
}

// settleRefused settles an admission whose request the provider refused
// with 429 before it goes back to the queue or on to another deployment
// (where it is charged again). Its charges on the deployment stand as
// reserved: the provider is at its limit, and the count it reported with
// the 429 (now the shared bucket's level, see Feedback) leaves this request
// out, so giving it back would lift the bucket above what the provider has.
// Its other charges (the tenant's) are given back.
func (g *Gateway) settleRefused(adm admitted) {
	if adm.decision.ID == "" {
		return
	}
	actual := make([]int64, len(adm.charges))
	for i, ch := range adm.charges {
		if adm.dep.ownScope(ch.Scope) {
			actual[i] = ch.Cost
		}
	}
	g.workers.run(settleTimeout, func(ctx context.Context) {
		if err := g.opt.Limiter.Settle(ctx, adm.decision.ID, actual); err != nil {
			g.log.Warn("rate-limit settle of a refused request failed; the reservation expires by itself", "err", err)
		}
	})
}

// refund gives back an admission that never reached the provider.
func (g *Gateway) refund(adm admitted) {
	if adm.decision.ID == "" {
		return
	}
	g.workers.run(settleTimeout, func(ctx context.Context) {
		if err := g.opt.Limiter.Refund(ctx, adm.decision.ID); err != nil {
			g.log.Warn("rate-limit refund failed; the reservation expires by itself", "err", err)
		}
	})
}

func (g *Gateway) releaseBudget(res budget.Reservation) {
	g.workers.run(settleTimeout, func(ctx context.Context) {
		if err := g.opt.Budgets.Release(ctx, res); err != nil {
			g.log.Warn("budget release failed; the hold expires by itself", "err", err)
		}
	})
}

// Close waits until every request in progress has ended and been recorded
// and the limiter's unused local blocks are back in the store, or ctx ends.
// Stop the HTTP server first.
func (g *Gateway) Close(ctx context.Context) error {
	// Requests and their settles first: they may add to the usage batch,
	// whose timer Close must not wait for.
	if err := g.pending.wait(ctx); err != nil {
		return err
	}
	g.usage.flushNow()
	// Settles are done: the limiter's local blocks can all go back. Work
	// started after this runs on goroutines of its own.
	g.workers.close()
	g.keeper.close()
	return g.opt.Limiter.Close(ctx)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// settleTimeout bounds the store calls that record a finished request.
const settleTimeout = 10 * time.Second

package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/ratelimit"
)

// accountingPeriod is the window usage is recorded in for tenants without a
// budget.
const accountingPeriod = budget.Month

// lastWindow is the budget window reserveBudget computed last.
type lastWindow struct {
	period budget.Period
	loc    *time.Location
	w      budget.Window
}

// window returns b's window at now, reusing the last one computed while it
// lasts: every request of a tenant without a cap needs it, and most share
// one (the month, in UTC).
func (g *Gateway) window(b budget.Budget, now time.Time) (budget.Window, error) {
	if l := g.lastWindow.Load(); l != nil && l.period == b.Period && l.loc == b.Location &&
		!now.Before(l.w.Start) && now.Before(l.w.End) {
		return l.w, nil
	}
	w, err := b.Window(now)
	if err == nil {
		g.lastWindow.Store(&lastWindow{period: b.Period, loc: b.Location, w: w})
	}
	return w, err
}

// reserveBudget holds the request's estimate on the tenant's budget. Tenants
// without a budget get a reservation that only names the accounting window
// (nothing is held, so no store call is needed).
func (g *Gateway) reserveBudget(ctx context.Context, c *call) (budget.Reservation, *apiError) {
	est := budget.Usage{PromptTokens: c.promptEstimate, CompletionTokens: c.completionEstimate}
	b := c.tenant.accountingBudget()
	if b.Tokens == 0 && b.MicroUSD == 0 {
		win, err := g.window(b, time.Now())
		if err != nil {
			return budget.Reservation{}, internalError(g, c, "budget window", err)
		}
		return budget.Reservation{ID: c.usageID(), Tenant: c.tenant.Name, Window: win, Model: c.priceModel(), Estimate: est}, nil
	}
	// A request that does not fit while others are in flight waits for
	// them to settle (usually below their estimates), within its max wait;
	// the rate limits get what is left of it.
	_, end := g.stage(ctx, c, "budget.wait")
	defer end()
	start := time.Now()
	res, err := g.opt.Budgets.ReserveWaitFunc(ctx, b, c.usageID(), c.priceModel(), func() budget.Usage {
		g.estimateCompletion(c)
		return budget.Usage{PromptTokens: c.promptEstimate, CompletionTokens: c.completionEstimate}
	}, c.maxWait)
	c.access.budgetWait = time.Since(start)
	if c.maxWait > 0 {
		c.maxWait = max(c.maxWait-time.Since(start), 0)
	}
	if err == nil {
		return res, nil
	}
	var ex *budget.ExhaustedError
	switch {
	case errors.As(err, &ex):
		c.outcome = "budget"
		g.metrics.budgetDenied.WithLabelValues(c.tenant.Name).Inc()
		e := errf(http.StatusTooManyRequests, openai.TypeQuota, "insufficient_quota", "",
			"The %s budget of this API key for %s is used up (%s); it resets at %s.",
			b.Period, ex.Window.ID, exhaustedWhat(ex), ex.ResetAt().UTC().Format(time.RFC3339))
		return budget.Reservation{}, withHeaders(e, func(h http.Header) {
			h.Set("X-Should-Retry", "false")
			h.Set("Retry-After", strconv.FormatInt(int64(max(time.Until(ex.ResetAt()), time.Second)/time.Second), 10))
		})
	case ctx.Err() != nil:
		// Before the store check: a reserve cut short by the client or
		// the shutdown is reported as the store's failure too.
		return budget.Reservation{}, g.cancelled(c, ctx)
	case errors.Is(err, budget.ErrStoreUnavailable):
		c.outcome = "store_unavailable"
		g.log.Error("budget store unavailable; request denied (budgets fail closed)", "request_id", c.id, "tenant", c.tenant.Name, "err", err)
		return budget.Reservation{}, errf(http.StatusServiceUnavailable, openai.TypeUnavailable, "store_unavailable", "",
			"The gateway cannot check this API key's budget right now. Retry shortly.")
	default:
		return budget.Reservation{}, internalError(g, c, "budget reserve", err)
	}
}

func exhaustedWhat(ex *budget.ExhaustedError) string {
	switch {
	case ex.Tokens && ex.Money:
		return "tokens and money"
	case ex.Tokens:
		return "tokens"
	default:
		return "money"
	}
}

// admitted is a request that passed the rate limits on one deployment.
type admitted struct {
	dep      *deployment
	decision ratelimit.Decision
	charges  []ratelimit.Charge // nil when no limit applied (nothing to settle)
	// refused is set when the provider answered the request 429: its
	// charges on the deployment then stand as reserved (see settleRefused).
	refused bool
}

// chargesFor lists every limit a request sent to dep must pass: the
// deployment's (first, so it is the request's queue), the tenant's, and the
// tenant's for the model asked for.
func (g *Gateway) chargesFor(c *call, dep *deployment) []ratelimit.Charge {
	tok := c.tokenEstimate()
	t := c.tenant
	ml := t.ModelLimits[c.req.Model]
	ch := make([]ratelimit.Charge, 0, 6+t.Limits.count()+ml.count()) // at most 6 on the deployment (with slow start)
	ch = dep.charges(ch, tok)
	ch = dep.ioCharges(ch, c.promptEstimate, c.completionEstimate)
	if t.Limits.any() { // the scope is made only when it is charged
		ch = appendCharges(ch, "tenant:"+t.Name, t.Limits, tok)
	}
	if ml.any() {
		ch = appendCharges(ch, "tenant-model:"+t.Name+"/"+c.req.Model, ml, tok)
	}
	if g.opt.Admission.FailClosed {
		for i := range ch {
			ch[i].Limit.FailClosed = true
		}
	}
	return ch
}

// admit finds a deployment among cands that admits c. It asks each in turn
// (most headroom first) without waiting; if none has room it waits, in the
// fair queue of the one that will have room soonest, up to c.maxWait.
func (g *Gateway) admit(ctx context.Context, c *call, cands []*deployment) (admitted, *apiError) {
	ctx, end := g.stage(ctx, c, "admission.wait")
	defer end()
	var (
		best     admitted
		bestWait = time.Duration(-1)
	)
	for _, dep := range cands {
		ch := g.chargesFor(c, dep)
		if len(ch) == 0 {
			return admitted{dep: dep}, nil
		}
		req := ratelimit.Request{Charges: ch, Priority: c.priority, Hold: g.opt.Admission.ReservationHold}
		if len(cands) == 1 && c.maxWait > 0 {
			return g.wait(ctx, c, dep, req)
		}
		d, err := g.opt.Limiter.Allow(ctx, req)
		if err != nil {
			return admitted{}, g.limiterError(ctx, c, err)
		}
		dep.learn(d.Limits)
		if d.Allowed {
			return admitted{dep: dep, decision: d, charges: ch}, nil
		}
		if bestWait < 0 || d.RetryAfter < bestWait {
			best, bestWait = admitted{dep: dep, decision: d, charges: ch}, d.RetryAfter
		}
	}
	if c.maxWait <= 0 {
		return admitted{}, g.limited(c, best.decision, 0)
	}
	return g.wait(ctx, c, best.dep, ratelimit.Request{Charges: best.charges, Priority: c.priority, Hold: g.opt.Admission.ReservationHold})
}

// wait queues c for dep until admitted or c.maxWait passes.
func (g *Gateway) wait(ctx context.Context, c *call, dep *deployment, req ratelimit.Request) (admitted, *apiError) {
	req.MaxWait = c.maxWait
	start := time.Now()
	done := g.ops.queued(dep.Name)
	d, err := g.limiterWait(ctx, c, dep, &req, start)
	waited := time.Since(start)
	done(waited)
	c.access.admissionWait += waited
	g.metrics.admissionWait.Observe(waited.Seconds())
	if err == nil {
		dep.learn(d.Limits)
		return admitted{dep: dep, decision: d, charges: req.Charges}, nil
	}
	if errors.Is(err, ratelimit.ErrLimited) && ctx.Err() == nil {
		return admitted{}, g.limited(c, d, waited)
	}
	return admitted{}, g.limiterError(ctx, c, err)
}

// errSlowStartOver ends the wait of a request queued behind a slow-start
// window that has closed.
var errSlowStartOver = errors.New("gateway: slow start over")

// limiterWait is Limiter.Wait, except that a request queued behind dep's
// slow-start window goes back to the queue without it when the slow start
// ends: the window's permits are held by requests that may run for minutes
// (streams), and nothing needs the window any more.
func (g *Gateway) limiterWait(ctx context.Context, c *call, dep *deployment, req *ratelimit.Request, start time.Time) (ratelimit.Decision, error) {
	for {
		over := dep.inSlowStart(req.Charges)
		if over == nil {
			return g.opt.Limiter.Wait(ctx, *req)
		}
		wctx, cancel := context.WithCancelCause(ctx)
		go func() {
			select {
			case <-over:
				cancel(errSlowStartOver)
			case <-wctx.Done():
			}
		}()
		d, err := g.opt.Limiter.Wait(wctx, *req)
		overNow := errors.Is(context.Cause(wctx), errSlowStartOver)
		cancel(nil)
		if err == nil || !overNow || ctx.Err() != nil {
			return d, err
		}
		req.Charges = g.chargesFor(c, dep)
		req.MaxWait = max(c.maxWait-time.Since(start), time.Millisecond)
	}
}

// limited is the 429 of a request the limits did not admit in time.
func (g *Gateway) limited(c *call, d ratelimit.Decision, waited time.Duration) *apiError {
	c.outcome = "limited"
	kind := "requests"
	if d.DeniedKind != 0 {
		kind = d.DeniedKind.String()
	}
	g.metrics.limited.WithLabelValues(scopeKind(d.DeniedBy), kind).Inc()
	msg := fmt.Sprintf("Rate limit reached on %s (%s)", describeScope(d.DeniedBy), kind)
	if waited > 0 {
		msg += fmt.Sprintf(" after waiting %s", waited.Round(time.Millisecond))
	}
	msg += "."
	e := errf(http.StatusTooManyRequests, kind, "rate_limit_exceeded", "", "%s", msg)
	return withHeaders(e, func(h http.Header) {
		ra := d.RetryAfter
		if ra <= 0 {
			ra = time.Second
		}
		h.Set("Retry-After", strconv.FormatInt(int64((ra+time.Second-1)/time.Second), 10))
		h.Set("Retry-After-Ms", strconv.FormatInt(ra.Milliseconds(), 10))
		setRateHeaders(h, d.Limits)
	})
}

// limiterError answers a limiter failure that is not a denial.
func (g *Gateway) limiterError(ctx context.Context, c *call, err error) *apiError {
	switch {
	case ctx.Err() != nil:
		return g.cancelled(c, ctx)
	case errors.Is(err, ratelimit.ErrStoreUnavailable):
		c.outcome = "store_unavailable"
		g.log.Error("rate-limit store unavailable; request denied (limit fails closed)", "request_id", c.id, "err", err)
		return errf(http.StatusServiceUnavailable, openai.TypeUnavailable, "store_unavailable", "",
			"The gateway cannot check rate limits right now. Retry shortly.")
	default:
		return internalError(g, c, "rate limit", err)
	}
}

// cancelled is the answer to a request whose client left, whose deadline
// passed or whose session lease was lost.
func (g *Gateway) cancelled(c *call, ctx context.Context) *apiError {
	if errors.Is(context.Cause(ctx), lock.ErrLost) {
		return g.sessionLost(c)
	}
	if shuttingDown(ctx) {
		c.outcome = "shutdown"
		return withHeaders(errShuttingDown(), func(h http.Header) { h.Set("Retry-After", "1") })
	}
	if errors.Is(context.Cause(ctx), context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		c.outcome = "timeout"
		return errf(http.StatusGatewayTimeout, openai.TypeTimeout, "request_timeout", "",
			"The request did not complete within the gateway's request timeout.")
	}
	c.outcome = "cancelled"
	return errf(499, openai.TypeInvalidRequest, "client_closed_request", "", "The client closed the request.")
}

func internalError(g *Gateway, c *call, what string, err error) *apiError {
	c.outcome = "error"
	g.log.Error("internal error", "request_id", c.id, "step", what, "err", err)
	return errf(http.StatusInternalServerError, openai.TypeServer, "internal_error", "",
		"The gateway failed to process the request (request id %s).", c.id)
}

// setRateHeaders sets OpenAI's x-ratelimit-* headers from the tightest
// requests and tokens limits of a decision.
func setRateHeaders(h http.Header, st []ratelimit.Status) {
	var req, tok *ratelimit.Status
	for i := range st {
		s := &st[i]
		switch s.Kind {
		case ratelimit.Requests:
			if s.Limit >= unlimitedRPM {
				continue // the stand-in for "no limit" is not the client's business
			}
			if req == nil || s.Remaining < req.Remaining {
				req = s
			}
		case ratelimit.Tokens:
			if tok == nil || s.Remaining < tok.Remaining {
				tok = s
			}
		}
	}
	// Every value is a slice of one string, in one []string: two
	// allocations instead of twelve, on every answer.
	var buf [128]byte
	text, ends := buf[:0], [6]int{}
	for i, s := range [2]*ratelimit.Status{req, tok} {
		if s == nil {
			continue
		}
		text = strconv.AppendInt(text, s.Limit, 10)
		ends[3*i] = len(text)
		text = strconv.AppendInt(text, s.Remaining, 10)
		ends[3*i+1] = len(text)
		text = append(text, formatReset(s.Reset)...)
		ends[3*i+2] = len(text)
	}
	if len(text) == 0 {
		return
	}
	all, vals := string(text), make([]string, 6)
	start := 0
	for i, s := range [2]*ratelimit.Status{req, tok} {
		if s == nil {
			continue
		}
		for j, name := range rateHeaderNames[i] {
			k := 3*i + j
			vals[k] = all[start:ends[k]]
			start = ends[k]
			h[name] = vals[k : k+1 : k+1]
		}
	}
}

// rateHeaderNames are OpenAI's x-ratelimit-* headers: limit, remaining and
// reset, for requests and for tokens.
var rateHeaderNames = [2][3]string{
	{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
	{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
}

// formatReset writes a duration the way OpenAI does ("1s", "6m0s", "20ms").
func formatReset(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

// scopeKind is the metrics label of a scope: its prefix.
func scopeKind(scope string) string {
	for _, k := range []string{"dep", "tenant-model", "tenant"} {
		if len(scope) > len(k) && scope[:len(k)] == k && scope[len(k)] == ':' {
			return k
		}
	}
	return "other"
}

func describeScope(scope string) string {
	switch scopeKind(scope) {
	case "dep":
		return "deployment " + scope[len("dep:"):]
	case "tenant":
		return "this API key's limit"
	case "tenant-model":
		return "this API key's limit for the model"
	}
	return "a shared limit"
}

// available returns the deployments of a route target whose breaker lets
// requests through, most headroom first.
func (g *Gateway) available(target string) []*deployment {
	all := g.byTarget[target]
	out := make([]*deployment, 0, len(all))
	for _, d := range all {
		if g.opt.Upstream.Available(d.Name) {
			out = append(out, d)
		}
	}
	if len(out) > 1 {
		slices.SortStableFunc(out, func(a, b *deployment) int {
			return int(b.headroom.Load() - a.headroom.Load())
		})
	}
	return out
}

package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/provider"
)

// run reserves budget, admits the request on a deployment, calls it (falling
// back along the route when a target fails) and relays the answer.
func (g *Gateway) run(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call) {
	res, aerr := g.reserveBudget(ctx, c)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	settled := false
	defer func() {
		if !settled && res.Hold != (budget.Amount{}) {
			g.releaseBudget(res)
		}
	}()
	defer g.keepBudget(c, res).stop()

	var cands []*deployment
	for _, t := range c.targets {
		for _, d := range g.available(t) {
			if servesEndpoint(d, c.req.Endpoint) {
				cands = append(cands, d)
			}
		}
	}
	if len(cands) == 0 && !g.anyServes(c) {
		c.outcome = "bad_request"
		errf(http.StatusBadRequest, openai.TypeInvalidRequest, "unsupported_model", "model",
			"The model '%s' is not served by a provider that speaks %s (see docs/gateway.md).", c.req.Model, c.req.Endpoint.Path()).Write(w)
		return
	}
	if c.pin != nil {
		if cands = pinned(cands, c.pin); len(cands) == 0 && len(pinned(g.byTarget[c.targets[0]], c.pin)) == 0 {
			c.outcome = "bad_request"
			openai.BadRequest("previous_response_id", "The previous response was stored by a deployment that does not serve '%s': continue it with the model it was created with.", c.req.Model).Write(w)
			return
		}
	}
	if len(cands) == 0 {
		c.outcome = "unavailable"
		errf(http.StatusServiceUnavailable, openai.TypeUnavailable, "upstream_unavailable", "",
			"Every deployment serving '%s' is failing right now (circuit breaker open). Retry shortly.", c.req.Model).Write(w)
		return
	}
	var body []byte // the upstream body, for the upstream model bodyModel
	bodyModel := ""
	var lastErr *apiError
	retries429 := 0
	for len(cands) > 0 {
		// Fall back along the route: the first target's deployments
		// first; a failed deployment is dropped and the next one tried.
		adm, aerr := g.admit(ctx, c, cands[:g.sameTarget(cands)])
		if aerr != nil {
			aerr.Write(w)
			return
		}
		if body == nil || bodyModel != adm.dep.Model {
			var err error
			if body, err = g.upstreamBody(c, adm.dep.Model); err != nil {
				g.refund(adm)
				openai.BadRequest("", "The request body could not be prepared for the provider: %s.", err.Error()).Write(w)
				c.outcome = "bad_request"
				return
			}
			bodyModel = adm.dep.Model
		}
		kept := g.keepReservation(c, adm)
		preq := provider.Request{
			Path:      c.req.Endpoint.Path(),
			Body:      body,
			Header:    upstreamHeader(r, c),
			OwnHeader: true,
			Stream:    c.req.Stream,
			// A provider 429 is retried here, through the shared limiter
			// (which its cooldown now holds back), not by the client.
			NoRetry429: true,
		}
		if c.lease != nil {
			// Each attempt goes out only while the session is ours: a
			// replica paused past its lease must not send a turn that
			// a later one has overtaken.
			preq.BeforeAttempt = func() error { return confirmSession(ctx, c.lease) }
		}
		c.access.upstreamStart = time.Now()
		endUpstream := g.traceUpstream(ctx, c, adm.dep.Name, preq.Header)
		resp, sent, err := g.opt.Upstream.Do(ctx, &adm.dep.Target, preq)
		endUpstream(err)
		if err == nil && resp.StatusCode < 500 {
			// The provider answered: what it said about its limits
			// (Feedback) is in the shared limits now, or it said nothing
			// and waiting longer would not tell more.
			adm.dep.endSlowStart()
		}
		last := len(cands) == 1
		if err != nil {
			kept.stop()
			switch {
			case ctx.Err() != nil && sent.Attempts > len(sent.Retried):
				// Cancelled with its last attempt at the provider.
				settled = true
				g.finishUnanswered(c, adm, res)
				g.cancelled(c, ctx).Write(w)
				return
			case ctx.Err() != nil:
				g.refund(adm)
				g.cancelled(c, ctx).Write(w)
				return
			}
			g.refund(adm)
			switch {
			case errors.Is(err, errSessionLost):
				g.sessionLost(c).Write(w)
				return
			case errors.Is(err, errSessionUnconfirmed):
				c.outcome = "store_unavailable"
				g.log.Warn("session lease could not be confirmed before the upstream call", "request_id", c.id, "err", err)
				errf(http.StatusServiceUnavailable, openai.TypeUnavailable, "store_unavailable", "",
					"The gateway cannot confirm this session's turn right now. Retry shortly.").Write(w)
				return
			}
			lastErr = g.upstreamError(c, adm.dep, err)
			cands = drop(cands, adm.dep)
			continue
		}
		if last && resp.StatusCode == http.StatusTooManyRequests && retries429 < maxRetries429 && g.worthRetrying(ctx, resp) {
			// Wait for the cooldown in the fair queue like everyone else,
			// then try again.
			retries429++
			g.metrics.retries429.Inc()
			drain(resp)
			kept.stop()
			g.settleRefused(adm)
			continue
		}
		if !last && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500) {
			// Another target may answer; this one's answer is dropped.
			g.metrics.fallbacks.WithLabelValues(adm.dep.Name).Inc()
			drain(resp)
			kept.stop()
			if resp.StatusCode == http.StatusTooManyRequests {
				g.settleRefused(adm)
			} else {
				g.refund(adm)
			}
			cands = drop(cands, adm.dep)
			continue
		}
		settled = true
		adm.refused = resp.StatusCode == http.StatusTooManyRequests
		g.relay(ctx, w, c, adm, res, resp)
		kept.stop()
		return
	}
	if lastErr == nil {
		lastErr = errf(http.StatusBadGateway, openai.TypeUpstream, "upstream_error", "", "No deployment could answer the request.")
	}
	lastErr.Write(w)
}

// maxRetries429 bounds how often one request goes back to the queue after a
// provider 429.
const maxRetries429 = 3

// worthRetrying reports whether a provider 429 should be retried: it is not
// a quota exhaustion (no retry will help) and the request's deadline leaves
// room for the provider's retry-after.
func (g *Gateway) worthRetrying(ctx context.Context, resp *http.Response) bool {
	if strings.EqualFold(resp.Header.Get("X-Should-Retry"), "false") {
		return false
	}
	if dl, ok := ctx.Deadline(); ok {
		f := provider.ParseFeedback(resp.StatusCode, resp.Header)
		if f.RetryAfter > 0 && time.Until(dl) < f.RetryAfter {
			return false
		}
	}
	return true
}

// sameTarget returns how many leading candidates share the first one's
// route target (they are its keys).
func (g *Gateway) sameTarget(cands []*deployment) int {
	n := 1
	for n < len(cands) && cands[n].Provider == cands[0].Provider && cands[n].Model == cands[0].Model {
		n++
	}
	return n
}

func drop(cands []*deployment, d *deployment) []*deployment {
	out := cands[:0:0]
	for _, c := range cands {
		if c != d {
			out = append(out, c)
		}
	}
	return out
}

// upstreamBody is the client's body as the deployment must receive it: the
// provider's model name, and usage reporting switched on for streams.
func (g *Gateway) upstreamBody(c *call, model string) ([]byte, error) {
	set := map[string]json.RawMessage{}
	if model != c.req.Model {
		m, _ := json.Marshal(model)
		set["model"] = m
	}
	if c.previousUpstream != "" {
		id, _ := json.Marshal(c.previousUpstream)
		set["previous_response_id"] = id
	}
	if c.req.Stream && !c.req.IncludeUsage && c.req.Endpoint != openai.Embeddings {
		so, err := openai.UsageStreamOptions(c.req.StreamOptions)
		if err != nil {
			return nil, errors.New("stream_options is not an object")
		}
		set["stream_options"] = so
	}
	if len(set) == 0 {
		return c.body, nil
	}
	return openai.Rewrite(c.body, set)
}

// forwardHeaders are the client headers passed to the provider; the rest
// (the client's key above all) stay here.
var forwardHeaders = []string{"Content-Type", "Accept", "Openai-Beta", "Anthropic-Version", "Anthropic-Beta", "Traceparent", "Tracestate"}

func upstreamHeader(r *http.Request, c *call) http.Header {
	h := make(http.Header, len(forwardHeaders)+4) // room for the provider's key and the target's headers
	for _, k := range forwardHeaders {
		if v, ok := r.Header[k]; ok {
			h[k] = v
		}
	}
	if h.Get("Content-Type") == "" {
		h["Content-Type"] = jsonContentType
	}
	h["X-Request-Id"] = c.idHeader // the slice the answer's header has: values are only read
	if c.fence != "" {
		h["X-Fencing-Token"] = []string{c.fence}
	}
	return h
}

// upstreamError maps a failed upstream call to the client's error.
func (g *Gateway) upstreamError(c *call, dep *deployment, err error) *apiError {
	g.log.Warn("upstream call failed", "request_id", c.id, "deployment", dep.Name, "err", err)
	switch {
	case errors.Is(err, provider.ErrBreakerOpen):
		c.outcome = "unavailable"
		return errf(http.StatusServiceUnavailable, openai.TypeUnavailable, "upstream_unavailable", "",
			"The provider of '%s' is failing right now (circuit breaker open). Retry shortly.", c.req.Model)
	case errors.Is(err, provider.ErrTimeout):
		c.outcome = "upstream_timeout"
		return errf(http.StatusGatewayTimeout, openai.TypeTimeout, "upstream_timeout", "",
			"The provider did not answer in time.")
	default:
		c.outcome = "upstream_error"
		return errf(http.StatusBadGateway, openai.TypeUpstream, "upstream_unreachable", "",
			"The provider could not be reached.")
	}
}

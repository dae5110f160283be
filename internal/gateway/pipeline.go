package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/ratelimit"
)

func (g *Gateway) serveChat(w http.ResponseWriter, r *http.Request) {
	g.serve(w, r, openai.ChatCompletions)
}

func (g *Gateway) serveCompletions(w http.ResponseWriter, r *http.Request) {
	g.serve(w, r, openai.Completions)
}

func (g *Gateway) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	g.serve(w, r, openai.Embeddings)
}

func (g *Gateway) serveResponses(w http.ResponseWriter, r *http.Request) {
	g.serve(w, r, openai.Responses)
}

// call is one client request on its way through the pipeline.
type call struct {
	id       string
	idHeader []string // the X-Request-Id header's value: []string{id}
	start    time.Time
	tenant   *Tenant
	req      *openai.Request
	body     []byte
	targets  []string
	priority ratelimit.Priority
	maxWait  time.Duration
	// estimate is the usage reserved before the call.
	promptEstimate, completionEstimate int64
	outcome                            string // metrics label: ok, limited, budget, upstream_error, ...
	// session is the request's session id ("" without one); fence is the
	// session lease's fencing token, sent upstream as x-fencing-token.
	session, fence string
	// lease is the session's lease while the request holds it; nil
	// without a session.
	lease *lock.Lease
	// hash is the body's content hash, once computed.
	hash string
	// usage is the ID the request's budget reservation and usage record
	// go by: made here, never the client's x-request-id, which a client
	// could repeat to have later requests taken for settled ones.
	usage string
	// progress is what the request has used so far, for the keeper's
	// budget renewals.
	progress progress
	// access is what the access log line says (accesslog.go).
	access accessInfo
	// pin is the deployment whose provider key must answer (the one
	// that stored a Responses request's previous response), nil when
	// any may; previousUpstream is that response's id at the provider.
	pin              *deployment
	previousUpstream string
}

func (c *call) tokenEstimate() int64 { return c.promptEstimate + c.completionEstimate }

// usageID returns the request's reservation ID.
func (c *call) usageID() string {
	if c.usage == "" {
		c.usage = budget.NewID()
	}
	return c.usage
}

// priceModel is the model a budget reservation is priced with: the first
// route target's (an alias has no price of its own). Settle prices the
// model that really answered.
func (c *call) priceModel() string {
	t := c.targets[0]
	if i := strings.IndexByte(t, '/'); i >= 0 {
		return t[i+1:]
	}
	return t
}

// serve runs the pipeline for one of the proxied POST endpoints, stage by
// stage, each in its own file:
//
//	prepare      request.go, auth.go  authenticate, read, parse, route, estimate
//	serveCached  cache.go             an answer from the response cache
//	share        share.go             one upstream call for identical requests
//	runLocked    session.go           the session's turn
//	run          upstream.go          budget and limits (admit.go), the call
//	                                  with its fallbacks, kept reservations
//	                                  (keeper.go), the answer (relay.go)
//	finish       settle.go            what was used, charged after the answer
func (g *Gateway) serve(rw http.ResponseWriter, r *http.Request, ep openai.Endpoint) {
	cw := newClientWriter(rw, g.opt.HTTP.WriteTimeout, g.metrics.clientTimeout.WithLabelValues("write").Inc)
	defer cw.release()
	var w http.ResponseWriter = cw
	idHeader := setRequestID(w, r)
	c := &call{id: idHeader[0], idHeader: idHeader, start: time.Now(), outcome: "error"}
	// Usage is recorded after the last byte went out (a stream's, a
	// follower's): counted as pending work until the handler returns, so
	// that Close, called once the client has its answer, waits for it.
	g.pending.Add(1)
	defer g.pending.Done()
	g.running.Add(1)
	defer g.running.Add(-1)
	defer g.record(r, c, ep, cw)
	ctx := r.Context()
	ctx, cancel := context.WithTimeout(ctx, g.opt.HTTP.RequestTimeout)
	defer cancel()
	ctx = g.traceRequest(ctx, r, c, ep)

	cache, fl, aerr := g.prepare(w, r, ep, c)
	g.stageSince(c, "prepare", c.start)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	if c.req.Stream {
		cw.timeout = g.opt.HTTP.StreamWriteTimeout
	}
	// Cache, then de-duplication, then the session, then admission: a hit
	// or a follower costs no session turn, limit or budget.
	if cache != nil && g.serveCached(ctx, w, c, cache) {
		return
	}
	if fl != nil {
		g.share(ctx, w, r, c, fl, cache)
		return
	}
	g.runLocked(ctx, w, r, c, cache)
}

// prepare authenticates, reads, parses and routes the request, and says how
// it is cached and shared. On failure it sets c.outcome and returns the
// client's error.
func (g *Gateway) prepare(w http.ResponseWriter, r *http.Request, ep openai.Endpoint, c *call) (*cacheFill, *flight, *apiError) {
	fail := func(outcome string, e *apiError) (*cacheFill, *flight, *apiError) {
		c.outcome = outcome
		return nil, nil, e
	}
	t, aerr := g.authenticate(r)
	if aerr != nil {
		return fail("unauthorized", aerr)
	}
	c.tenant = t
	if c.body, aerr = g.readBody(w, r); aerr != nil {
		return fail("bad_request", aerr)
	}
	if c.req, aerr = openai.ParseRequest(ep, c.body); aerr != nil {
		return fail("bad_request", aerr)
	}
	model := c.req.Model
	if t.Models != nil && !t.Models[model] {
		return fail("forbidden", errf(http.StatusForbidden, openai.TypePermission, "model_not_allowed", "model",
			"The model '%s' is not allowed for this API key.", model))
	}
	targets, ok := g.opt.Route(model)
	if !ok || len(targets) == 0 {
		return fail("not_found", errf(http.StatusNotFound, openai.TypeInvalidRequest, "model_not_found", "model",
			"The model '%s' does not exist or you do not have access to it.", model))
	}
	c.targets = targets
	if aerr := g.pinPrevious(c); aerr != nil {
		return fail("not_found", aerr)
	}
	if aerr := g.readHints(r, c); aerr != nil {
		return fail("bad_request", aerr)
	}
	g.estimate(c)
	if g.opt.Sessions.Locker != nil {
		if c.session, aerr = g.sessionID(r, c.body); aerr != nil {
			return fail("bad_request", aerr)
		}
	}
	cache, aerr := g.cacheFor(r, c)
	if aerr != nil {
		return fail("bad_request", aerr)
	}
	fl, aerr := g.flightFor(r, c, cache != nil)
	if aerr != nil {
		return fail("bad_request", aerr)
	}
	return cache, fl, nil
}

// record counts and logs a finished request.
func (g *Gateway) record(r *http.Request, c *call, ep openai.Endpoint, cw *clientWriter) {
	model := ""
	if c.req != nil {
		model = c.req.Model
	}
	g.metrics.observeRequest(c, ep, model)
	g.accessLog(r.Context(), c, ep, model, cw.status, cw.Header())
	c.endRequestSpan(model, cw.status, cw.Header().Get("X-Llmgate-Deployment"))
	if g.log.Enabled(r.Context(), slog.LevelDebug) {
		tenant := ""
		if c.tenant != nil {
			tenant = c.tenant.Name
		}
		g.log.Debug("request", "request_id", c.id, "endpoint", ep.String(), "tenant", tenant,
			"outcome", c.outcome, "duration", time.Since(c.start))
	}
}

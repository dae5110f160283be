package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/lock"
)

// maxAnswerBytes bounds a non-streamed upstream answer held in memory.
const maxAnswerBytes = 64 << 20

// settleTimeout bounds the store calls that record a finished request.
const settleTimeout = 10 * time.Second

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
		cands = append(cands, g.available(t)...)
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
		resp, _, err := g.opt.Upstream.Do(ctx, &adm.dep.Target, preq)
		last := len(cands) == 1
		if err != nil {
			kept.stop()
			g.refund(adm)
			switch {
			case ctx.Err() != nil:
				g.cancelled(c, ctx).Write(w)
				return
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

// keepReservation keeps adm's rate-limit reservation alive while its
// request runs (a long generation or stream), so that its concurrency
// permit is not freed under it; a crashed replica's permits still free
// themselves within one hold. It also records adm's deployment as the one
// serving c, for c's budget renewals. The returned func stops it. One
// goroutine does this for every request (see keeper): most end long
// before their first renewal, and a timer each would cost them all.
func (g *Gateway) keepReservation(c *call, adm admitted) keptReservation {
	c.progress.dep.Store(adm.dep)
	if adm.decision.ID == "" {
		return keptReservation{}
	}
	return g.keeper.add(g, keptState{adm: adm})
}

// keepBudget keeps c's budget hold res alive while the request runs, and
// raises it to what the request has used so far (the prompt and the
// chunks streamed up to now): if this replica dies, the hold expires
// within the budget TTL and is charged at least that (budget.Manager.Renew).
func (g *Gateway) keepBudget(c *call, res budget.Reservation) keptReservation {
	if res.Hold == (budget.Amount{}) || res.Unchecked {
		return keptReservation{} // nothing held in the store
	}
	return g.keeper.add(g, keptState{c: c, res: res})
}

// progress is what a running request has used so far, as the keeper
// reports it to the budget.
type progress struct {
	dep      atomic.Pointer[deployment] // the deployment serving it, once admitted
	streamed atomic.Int64               // content chunks streamed so far (about a token each)
}

// keeper renews the rate-limit reservations of requests running longer
// than half a hold, and the budget holds of requests running longer than a
// third of the budget TTL, checking often enough that each is renewed well
// before it expires (rate limits between half and three quarters of a
// hold after the last renewal, budgets between a third and a half of the
// TTL).
type keeper struct {
	mu      sync.Mutex // protects everything below
	live    map[uint64]keptState
	next    uint64
	stop    chan struct{} // closed by Close; nil until the goroutine starts
	stopped bool
}

// keptState is one renewed reservation: a rate-limit one (adm), or a
// budget hold (c and res).
type keptState struct {
	adm     admitted
	c       *call
	res     budget.Reservation
	renewed time.Time // admission, then the last renewal
}

// keptReservation is a reservation the keeper renews until stop is
// called. The zero value is one nothing renews.
type keptReservation struct {
	k  *keeper
	id uint64
}

func (r keptReservation) stop() {
	if r.k == nil {
		return
	}
	r.k.drop(r.id)
}

func (k *keeper) drop(id uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.live, id)
}

func (k *keeper) add(g *Gateway, st keptState) keptReservation {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.live == nil {
		k.live = make(map[uint64]keptState)
	}
	if k.stop == nil && !k.stopped {
		k.stop = make(chan struct{})
		go k.run(g, k.stop)
	}
	k.next++
	st.renewed = time.Now()
	k.live[k.next] = st
	return keptReservation{k, k.next}
}

// close stops the renewals.
func (k *keeper) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stop != nil && !k.stopped {
		close(k.stop)
	}
	k.stopped = true
}

type keptDue struct {
	id uint64
	keptState
}

func (k *keeper) run(g *Gateway, stop <-chan struct{}) {
	hold, ttl := g.opt.ReservationHold, g.opt.Budgets.TTL()
	tick := time.NewTicker(max(min(hold/4, ttl/6), time.Millisecond)) // a positive period, whatever the hold
	defer tick.Stop()
	var due []keptDue
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			due = due[:0]
			k.mu.Lock()
			for id, r := range k.live {
				every := hold / 2
				if r.c != nil {
					every = ttl / 3
				}
				if now.Sub(r.renewed) >= every {
					r.renewed = now
					k.live[id] = r
					due = append(due, keptDue{id, r})
				}
			}
			k.mu.Unlock()
			for _, r := range due {
				if r.c != nil {
					if !g.renewBudget(r.c, r.res) {
						k.drop(r.id)
					}
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), feedbackTimeout)
				err := g.opt.Limiter.Extend(ctx, r.adm.decision.ID, hold)
				cancel()
				if err != nil {
					g.log.Warn("could not extend a long request's rate-limit reservation", "deployment", r.adm.dep.Name, "err", err)
				}
			}
		}
	}
}

// renewBudget renews c's budget hold res with what c has used so far; it
// reports false when the hold is gone, so renewing it again is pointless.
func (g *Gateway) renewBudget(c *call, res budget.Reservation) bool {
	p := budget.Progress{Usage: budget.Usage{PromptTokens: c.promptEstimate, CompletionTokens: c.progress.streamed.Load()}}
	if dep := c.progress.dep.Load(); dep != nil {
		p.Model, p.Deployment = dep.Model, dep.Name
	}
	ctx, cancel := context.WithTimeout(context.Background(), feedbackTimeout)
	ok, err := g.opt.Budgets.Renew(ctx, res, p)
	cancel()
	switch {
	case err != nil:
		g.log.Warn("could not renew a long request's budget hold; if it expires it is charged, and the request's settle corrects it", "request_id", c.id, "err", err)
	case !ok:
		g.log.Warn("a running request's budget hold expired and was charged; the request's settle corrects it", "request_id", c.id)
		return false
	}
	return true
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
var forwardHeaders = []string{"Content-Type", "Accept", "Openai-Beta"}

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

// skipResponseHeaders are upstream headers not relayed: hop-by-hop ones,
// ones the gateway sets itself, and ones that describe the provider account.
var skipResponseHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Content-Length": true, "Set-Cookie": true,
	"X-Request-Id": true, "Openai-Organization": true, "Openai-Project": true,
	"X-Ratelimit-Limit-Requests": true, "X-Ratelimit-Remaining-Requests": true, "X-Ratelimit-Reset-Requests": true,
	"X-Ratelimit-Limit-Tokens": true, "X-Ratelimit-Remaining-Tokens": true, "X-Ratelimit-Reset-Tokens": true,
}

// copyResponseHeader copies the provider's headers that a client may see,
// with every secret redacted (a provider may echo a key back).
func (g *Gateway) copyResponseHeader(dst, src http.Header) {
	for k, v := range src {
		if skipResponseHeaders[k] {
			continue
		}
		dst[k] = v
	}
	g.redact.Header(dst)
	if id := src["X-Request-Id"]; len(id) > 0 {
		dst["X-Upstream-Request-Id"] = id
	}
}

// relay sends the provider's answer to the client and settles the usage.
func (g *Gateway) relay(ctx context.Context, w http.ResponseWriter, c *call, adm admitted, res budget.Reservation, resp *http.Response) {
	defer resp.Body.Close()
	h := w.Header()
	g.copyResponseHeader(h, resp.Header)
	setRateHeaders(h, adm.decision.Limits)
	h["X-Llmgate-Deployment"] = adm.dep.nameHeader
	g.metrics.upstreamAnswer(adm.dep.Name, resp.StatusCode)

	if resp.StatusCode == http.StatusOK && c.req.Stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		g.relayStream(ctx, w, c, adm, res, resp)
		return
	}
	body, err := readAnswer(resp)
	if err != nil || len(body) > maxAnswerBytes {
		g.opt.Upstream.ReportFailure(&adm.dep.Target)
		g.finish(c, adm, res, nil, false)
		if ctx.Err() != nil {
			g.cancelled(c, ctx).Write(w)
			return
		}
		c.outcome = "upstream_error"
		for k := range h {
			if k != "X-Request-Id" {
				delete(h, k)
			}
		}
		errf(http.StatusBadGateway, openai.TypeUpstream, "upstream_error", "",
			"The provider's answer could not be read.").Write(w)
		return
	}
	if c.lease != nil && !sessionHeld(c.lease, time.Now()) {
		// The session may be serving a later request already: this
		// answer would reach the client after it. Charged all the same:
		// the provider did the work.
		for k := range h {
			if k != "X-Request-Id" {
				delete(h, k)
			}
		}
		g.sessionLost(c, "answer", "withheld").Write(w)
		g.finish(c, adm, res, answerUsage(c, resp.StatusCode, body), false)
		return
	}
	body = g.redact.Bytes(body) // error messages quote keys back
	h["Content-Length"] = []string{itoa(int64(len(body)))}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
	// Send the answer now: net/http would only send it once the handler
	// returns, after the accounting below, which the client need not wait for.
	_ = http.NewResponseController(w).Flush()
	if resp.StatusCode/100 == 2 {
		c.outcome = "ok"
	} else {
		c.outcome = "upstream_" + statusClass(resp.StatusCode)
	}
	g.finish(c, adm, res, answerUsage(c, resp.StatusCode, body), false)
}

// answerUsage is what a non-streamed answer with status used: its usage,
// or nil when the provider refused the request.
func answerUsage(c *call, status int, body []byte) *openai.Usage {
	if status/100 != 2 {
		return nil
	}
	if u := openai.ParseUsage(body); u != nil {
		return u
	}
	// No usage in the answer: charge the prompt estimate, the one part
	// known to have been processed.
	return &openai.Usage{PromptTokens: c.promptEstimate}
}

// readAnswer reads a non-streamed answer, up to one byte over
// maxAnswerBytes, into a buffer of the size the provider announced.
func readAnswer(resp *http.Response) ([]byte, error) {
	n := resp.ContentLength
	if n < 0 || n > maxAnswerBytes {
		return io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	}
	buf := make([]byte, n+1) // +1: room to see the end
	got, err := io.ReadFull(resp.Body, buf)
	switch {
	case err == nil: // longer than announced (a transport would not allow it)
		rest, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1-int64(got)))
		return append(buf, rest...), err
	case (err == io.EOF || err == io.ErrUnexpectedEOF) && int64(got) == n:
		return buf[:got], nil
	case err == io.EOF:
		return nil, io.ErrUnexpectedEOF // shorter than announced
	default:
		return nil, err
	}
}

// relayStream passes an SSE answer through event by event, flushing each,
// and settles what the stream used.
func (g *Gateway) relayStream(ctx context.Context, w http.ResponseWriter, c *call, adm admitted, res budget.Reservation, resp *http.Response) {
	rc := http.NewResponseController(w)
	w.WriteHeader(resp.StatusCode)
	_ = rc.Flush()
	c.outcome = "ok"

	// The idle timer cuts an upstream that stops sending.
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	idle := time.AfterFunc(g.opt.IdleTimeout, func() { cancel(errIdle) })
	defer idle.Stop()
	stop := context.AfterFunc(sctx, func() { resp.Body.Close() })
	defer stop()

	var (
		usage    *openai.Usage
		content  int64
		er       = openai.NewEventReader(resp.Body)
		clientOK = true
		sawDone  bool
		lost     bool   // the session lease lapsed before the end
		scratch  []byte // reused by dropNullUsage
	)
	for {
		raw, data, err := er.Next()
		idle.Reset(g.opt.IdleTimeout)
		if data != nil {
			ch := openai.ParseChunk(data)
			switch {
			case ch.Done:
				sawDone = true
			case ch.Usage != nil:
				usage = ch.Usage
			}
			if ch.Content {
				content++
				c.progress.streamed.Store(content)
			}
			if !c.req.IncludeUsage {
				if ch.UsageOnly {
					raw = nil // the client did not ask for the usage chunk
				} else {
					// Nor for the "usage":null every chunk then carries.
					raw = dropNullUsage(raw, &scratch)
				}
			}
		}
		if len(raw) > 0 && c.lease != nil && !sessionHeld(c.lease, time.Now()) {
			// Paused past the lease, or the watchdog found it lost:
			// the session may be serving a later request already, so
			// nothing more of this one goes out.
			lost = true
			cancel(errSessionLost) // closes the upstream body: the provider stops
			break
		}
		raw = g.redact.Bytes(raw)
		if len(raw) > 0 && clientOK && err == nil {
			if _, werr := w.Write(raw); werr != nil || rc.Flush() != nil {
				clientOK = false
				break // the client left: cancelling ctx stops the upstream
			}
		}
		if err != nil {
			break
		}
	}
	complete := (sawDone || usage != nil) && !lost
	if !complete && errors.Is(context.Cause(sctx), lock.ErrLost) {
		lost = true // the watchdog found the lease lost and cancelled the call
	}
	if !complete {
		switch {
		case lost:
			// Cut off: end the client's stream with the error, in-band.
			e := g.sessionLost(c, "stream_chunks", content)
			if clientOK {
				_, _ = w.Write(append(append([]byte("data: "), e.Body()...), '\n'))
				_ = rc.Flush()
			}
		case clientOK && shuttingDown(ctx):
			// Cut at the end of the shutdown grace: tell the client, so
			// that it knows the answer is incomplete and may retry; not
			// the flight's followers or the cache (a follower takes over
			// the flight, see lead).
			c.outcome = "shutdown"
			_, _ = clientOnly(w).Write(append(append([]byte("data: "), errShuttingDown().Body()...), '\n'))
			_ = rc.Flush()
		case !clientOK || (ctx.Err() != nil && !errors.Is(context.Cause(sctx), errIdle)):
			c.outcome = "cancelled"
		default:
			// The provider broke the stream: tell the client in-band, the
			// way OpenAI reports errors inside a stream.
			c.outcome = "upstream_stream_broken"
			g.opt.Upstream.ReportFailure(&adm.dep.Target)
			e := errf(http.StatusBadGateway, openai.TypeUpstream, "stream_interrupted", "", "The provider's stream ended unexpectedly.")
			if clientOK {
				_, _ = w.Write(append(append([]byte("data: "), e.Body()...), '\n'))
				_ = rc.Flush()
			}
		}
	}
	if usage == nil {
		// Charge what is known to have been used: the prompt and the
		// output chunks streamed so far (about one token each).
		usage = &openai.Usage{PromptTokens: c.promptEstimate, CompletionTokens: content}
	}
	g.finish(c, adm, res, usage, true)
}

// nullUsage is the member a provider adds to every chunk of a stream asked
// for with include_usage, as OpenAI writes it.
var nullUsage = []byte(`,"usage":null}`)

// dropNullUsage removes a chunk's trailing "usage":null member, so that a
// client that did not ask for usage gets the chunks it would get without
// the gateway. Events in any other form are left as they are. The result
// may live in *scratch, valid until the next call.
func dropNullUsage(raw []byte, scratch *[]byte) []byte {
	i := bytes.LastIndex(raw, nullUsage)
	if i < 0 || len(bytes.TrimRight(raw[i+len(nullUsage):], "\r\n")) != 0 {
		return raw
	}
	out := append((*scratch)[:0], raw[:i]...)
	out = append(out, '}')
	out = append(out, raw[i+len(nullUsage):]...)
	*scratch = out
	return out
}

var errIdle = errors.New("gateway: upstream stream idle for too long")

// errShuttingDown is what a request cut by Cut is told: as its answer, or
// as an in-band event of its stream.
func errShuttingDown() *apiError {
	return errf(http.StatusServiceUnavailable, openai.TypeUnavailable, "shutting_down", "",
		"The gateway is shutting down and cut this request before it was complete. Retry it.")
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

func statusClass(code int) string {
	switch {
	case code == http.StatusTooManyRequests:
		return "429"
	case code >= 500:
		return "5xx"
	case code >= 400:
		return "4xx"
	default:
		return "2xx"
	}
}

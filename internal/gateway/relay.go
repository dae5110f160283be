package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/lock"
)

// maxAnswerBytes bounds a non-streamed upstream answer held in memory.
const maxAnswerBytes = 64 << 20

// skipResponseHeaders are upstream headers not relayed: hop-by-hop ones,
// ones the gateway sets itself, and ones that describe the provider account.
var skipResponseHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Content-Length": true, "Set-Cookie": true,
	"X-Request-Id": true, "Openai-Organization": true, "Openai-Project": true,
	"X-Ratelimit-Limit-Requests": true, "X-Ratelimit-Remaining-Requests": true, "X-Ratelimit-Reset-Requests": true,
	"X-Ratelimit-Limit-Tokens": true, "X-Ratelimit-Remaining-Tokens": true, "X-Ratelimit-Reset-Tokens": true,
	"Anthropic-Organization-Id": true,
}

// skipResponseHeader reports whether an upstream header is not relayed:
// skipResponseHeaders, and Anthropic's account limits.
func skipResponseHeader(k string) bool {
	return skipResponseHeaders[k] || strings.HasPrefix(k, "Anthropic-Ratelimit-")
}

// copyResponseHeader copies the provider's headers that a client may see,
// with every secret redacted (a provider may echo a key back).
func (g *Gateway) copyResponseHeader(dst, src http.Header) {
	for k, v := range src {
		if skipResponseHeader(k) {
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
	defer g.ops.upstreamDone(adm.dep.Name, c.access.upstreamStart)
	_, endRelay := g.stage(ctx, c, "relay")
	defer endRelay()
	h := w.Header()
	g.copyResponseHeader(h, resp.Header)
	setRateHeaders(h, adm.decision.Limits)
	h["X-Llmgate-Deployment"] = adm.dep.nameHeader
	g.metrics.upstreamAnswer(adm.dep.Name, resp.StatusCode)

	if resp.StatusCode == http.StatusOK && c.req.Stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = g.ops.firstToken(resp.Body, adm.dep.Name, c.access.upstreamStart)
		g.relayStream(ctx, w, c, adm, res, resp)
		return
	}
	body, err := readAnswer(resp)
	if err != nil || len(body) > maxAnswerBytes {
		if ctx.Err() != nil {
			if resp.StatusCode/100 == 2 {
				g.finishUnanswered(c, adm, res)
			} else {
				g.finish(c, adm, res, nil)
			}
			g.cancelled(c, ctx).Write(w)
			return
		}
		g.opt.Upstream.ReportFailure(&adm.dep.Target)
		g.finish(c, adm, res, nil)
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
		g.finish(c, adm, res, answerUsage(c, resp.StatusCode, body))
		return
	}
	if ids := newResponseIDs(c); ids != nil && resp.StatusCode/100 == 2 {
		ids.learn(c, adm.dep, openai.ParseResponseID(body))
		body = ids.rewrite(body)
	}
	usage := answerUsage(c, resp.StatusCode, body)
	g.usageHeaders(h, c, adm.dep.Model, usage)
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
	g.finish(c, adm, res, usage)
}

// answerUsage is what a non-streamed answer with status used: its usage,
// or nil when the provider refused the request.
func answerUsage(c *call, status int, body []byte) *openai.Usage {
	if status/100 != 2 {
		return nil
	}
	parse := openai.ParseUsage
	if c.req.Endpoint == openai.Messages {
		parse = openai.ParseMessagesUsage
	}
	if u := parse(body); u != nil {
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
	idle := time.AfterFunc(g.opt.HTTP.UpstreamIdleTimeout, func() { cancel(errIdle) })
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
		ids      = newResponseIDs(c)
	)
	for {
		raw, data, err := er.Next()
		idle.Reset(g.opt.HTTP.UpstreamIdleTimeout)
		if data != nil && c.req.Endpoint == openai.Messages {
			// Anthropic's events: the prompt in message_start, the
			// output so far in message_delta.
			ev := openai.ParseMessagesEvent(data)
			sawDone = sawDone || ev.Final
			if ev.Usage != nil {
				if usage == nil {
					usage = &openai.Usage{PromptTokens: c.promptEstimate}
				}
				if ev.HasInput {
					usage.PromptTokens, usage.PromptTokensDetails = ev.Usage.PromptTokens, ev.Usage.PromptTokensDetails
				}
				if ev.HasOutput {
					usage.CompletionTokens = ev.Usage.CompletionTokens
				}
			}
			if ev.Content {
				content++
				c.progress.streamed.Store(content)
			}
		} else if data != nil && ids != nil {
			// A Responses stream: typed events, the usage in the last.
			ev := openai.ParseResponseEvent(data)
			ids.learn(c, adm.dep, ev.ResponseID)
			sawDone = sawDone || ev.Final
			if ev.Usage != nil {
				usage = ev.Usage
			}
			if ev.Content {
				content++
				c.progress.streamed.Store(content)
			}
			raw = ids.rewrite(raw)
		} else if data != nil {
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
	// A Messages stream reports usage from its first event on: only
	// message_stop ends it.
	complete := (sawDone || usage != nil && c.req.Endpoint != openai.Messages) && !lost
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
	if usage != nil && !complete {
		usage.CompletionTokens = max(usage.CompletionTokens, content) // reported before the cut, or streamed since
	}
	if usage == nil {
		// Charge what is known to have been used: the prompt and the
		// output chunks streamed so far (about one token each).
		usage = &openai.Usage{PromptTokens: c.promptEstimate, CompletionTokens: content}
	}
	g.finish(c, adm, res, usage)
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

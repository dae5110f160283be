package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/respcache"
)

const (
	maxIdempotencyKeyLen = 256
	// maxRecordBytes bounds an answer kept for the cache.
	maxRecordBytes = 8 << 20
)

// flight says how a request shares its upstream call.
type flight struct {
	key, fingerprint string
	retain           time.Duration
	idempotent       bool
}

// contentHash is the SHA-256 of the endpoint and the canonical JSON of the
// body: key order and whitespace do not change it; the same body sent to
// another endpoint (a body may hold both messages and prompt) does.
func (c *call) contentHash() (string, error) {
	if c.hash != "" {
		return c.hash, nil
	}
	canon, err := respcache.Canonical(c.body)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write([]byte(c.req.Endpoint.String()))
	h.Write([]byte{0})
	h.Write(canon)
	c.hash = hex.EncodeToString(h.Sum(nil))
	return c.hash, nil
}

// flightFor decides whether c shares its call: an Idempotency-Key always
// does; otherwise a request deterministic by configuration (temperature 0,
// or a model or tenant opted in) does, and so does one whose answer may
// come from the cache (cached), so that a miss by many callers at once is
// one upstream call. nil means c runs alone.
func (g *Gateway) flightFor(r *http.Request, c *call, cached bool) (*flight, *apiError) {
	if g.opt.Dedup.Group == nil {
		return nil, nil
	}
	idem := r.Header.Get("Idempotency-Key")
	auto := (g.opt.Dedup.Deterministic && c.req.Temperature != nil && *c.req.Temperature == 0) ||
		g.opt.Dedup.Models[c.req.Model] || c.tenant.Dedup || cached
	if idem == "" && !auto {
		return nil, nil
	}
	hash, err := c.contentHash()
	if err != nil {
		return nil, nil // ParseRequest accepted it; a body Canonical refuses simply is not shared
	}
	if idem != "" {
		if len(idem) > maxIdempotencyKeyLen || strings.ContainsFunc(idem, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return nil, errf(http.StatusBadRequest, openai.TypeInvalidRequest, "invalid_header", "idempotency-key",
				"The Idempotency-Key must be at most %d printable characters.", maxIdempotencyKeyLen)
		}
		return &flight{key: "idem:" + c.tenant.Name + ":" + idem, fingerprint: hash, retain: g.opt.Dedup.IdempotencyTTL, idempotent: true}, nil
	}
	return &flight{key: "auto:" + c.tenant.Name + ":" + hash, fingerprint: hash, retain: g.opt.Dedup.Retain}, nil
}

// share runs c through its flight: as the leader it runs the pipeline and
// publishes the answer; as a follower it relays the leader's. When the store
// cannot coordinate, c runs on its own.
func (g *Gateway) share(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call, fl *flight, cache *cacheFill) {
	var (
		wroteHead bool
		wrote     int // body frames the client already has
	)
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			if !wroteHead {
				g.cancelled(c, ctx).Write(w)
			}
			return
		}
		_, endJoin := g.stage(ctx, c, "dedup.join")
		leader, follower, err := g.opt.Dedup.Group.Join(ctx, fl.key, fl.fingerprint, fl.retain)
		endJoin()
		switch {
		case errors.Is(err, dedup.ErrConflict):
			c.outcome = "conflict"
			errf(http.StatusConflict, openai.TypeInvalidRequest, "idempotency_key_reused", "idempotency-key",
				"This Idempotency-Key was already used with a different request body.").Write(w)
			return
		case err != nil:
			// The store cannot coordinate: serve the request alone
			// rather than fail it.
			g.log.Warn("de-duplication unavailable; request runs alone", "request_id", c.id, "err", err)
			if wroteHead {
				return
			}
			g.runLocked(ctx, w, r, c, cache)
			return
		case leader != nil:
			g.metrics.dedup.WithLabelValues("leader").Inc()
			if !wroteHead {
				w.Header().Set("X-Llmgate-Dedup", "leader")
			}
			g.lead(ctx, w, r, c, leader, cache, wroteHead, wrote)
			return
		}
		g.metrics.dedup.WithLabelValues("follower").Inc()
		_, endFollow := g.stage(ctx, c, "dedup.follow")
		done, err := g.follow(ctx, w, c, follower, &wroteHead, &wrote)
		endFollow()
		follower.Close()
		if done {
			g.recordFree(c, followerDeployment)
			return
		}
		if !errors.Is(err, dedup.ErrLeaderGone) || attempt >= 5 {
			if !wroteHead {
				if ctx.Err() != nil {
					g.cancelled(c, ctx).Write(w)
				} else {
					c.outcome = "upstream_error"
					g.log.Warn("following a shared request failed", "request_id", c.id, "err", err)
					errf(http.StatusBadGateway, openai.TypeUpstream, "dedup_failed", "",
						"The shared request this one waited for failed.").Write(w)
				}
			}
			return
		}
		// The leader died or gave up: join again; this request may lead.
	}
}

// lead runs the pipeline as the flight's leader, publishing the answer.
func (g *Gateway) lead(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call, l *dedup.Leader, cache *cacheFill, skipHead bool, skip int) {
	tee := &teeWriter{
		ResponseWriter: w,
		ctx:            ctx,
		publish:        l.Publish,
		skipHead:       skipHead,
		skipFrames:     skip,
	}
	if cache != nil {
		tee.record = &recording{max: maxRecordBytes}
	}
	g.runLocked(ctx, tee, r, c, nil)
	// The client's answer is complete: send it now, not after the store
	// calls that end the flight (three round trips on Redis, up to
	// settleTimeout if the store stalls).
	if tee.wroteHead {
		_ = http.NewResponseController(w).Flush()
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	// A leader whose client left before the answer was complete, or that
	// the shutdown cut, gives up, so that a follower takes over (skipping
	// what it already relayed);
	// anything else, client errors included, is the shared answer.
	// Transient failures (429, 5xx, a lost session lease) are not the
	// answer either: stored under an idempotency key they would be
	// replayed long after the cause went.
	lostBeforeHead := c.outcome == "session_lost" && tee.status == http.StatusConflict
	if !tee.wroteHead || tee.pubErr != nil || c.outcome == "cancelled" || c.outcome == "shutdown" || lostBeforeHead || tee.status == http.StatusTooManyRequests || tee.status >= 500 {
		if err := l.Abort(fctx); err != nil {
			g.log.Warn("could not abort a shared request", "request_id", c.id, "err", err)
		}
	} else if err := l.FinishFor(fctx, retainOf(c, l)); err != nil {
		g.log.Warn("could not finish a shared request", "request_id", c.id, "err", err)
	}
	if cache != nil && tee.record != nil {
		g.fillCache(c, cache, tee.record)
	}
}

// brokenRetain is how long a stream cut short (by the provider, or by a
// lost session lease) stays readable after its flight ends: long enough
// for followers still relaying it to read to its end, too short for a
// client's retry (the same Idempotency-Key a second later) to get the
// broken answer again instead of a new call.
var brokenRetain = time.Second

// retainOf is how long the result of the flight c led stays readable.
func retainOf(c *call, l *dedup.Leader) time.Duration {
	if c.outcome == "upstream_stream_broken" || c.outcome == "session_lost" {
		return min(brokenRetain, l.Retain())
	}
	return l.Retain()
}

// follow relays a flight's frames to the client. It reports whether the
// answer is complete; on ErrLeaderGone the caller joins again, skipping
// what was already written.
func (g *Gateway) follow(ctx context.Context, w http.ResponseWriter, c *call, f *dedup.Follower, wroteHead *bool, wrote *int) (bool, error) {
	rc := http.NewResponseController(w)
	headSeen, body := false, 0
	for {
		frame, err := f.Next(ctx)
		if err == io.EOF {
			if !*wroteHead {
				return false, errors.New("gateway: shared answer had no head")
			}
			if c.outcome == "error" {
				c.outcome = "ok"
			}
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if len(frame) == 0 {
			continue
		}
		switch frame[0] {
		case frameHead:
			if headSeen {
				continue
			}
			headSeen = true
			if *wroteHead {
				continue
			}
			var hf headFrame
			if json.Unmarshal(frame[1:], &hf) != nil || hf.Status < 100 || hf.Status > 999 {
				return false, errors.New("gateway: unreadable shared answer")
			}
			h := w.Header()
			for k, v := range hf.Header {
				h[k] = v
			}
			h.Set("X-Llmgate-Dedup", "follower")
			w.WriteHeader(hf.Status)
			*wroteHead = true
			c.outcome = "ok"
			if hf.Status >= 400 {
				c.outcome = "upstream_" + statusClass(hf.Status)
			}
		case frameBody:
			if !headSeen {
				// Every generation starts with its head: this is not
				// an answer the gateway wrote.
				return false, errors.New("gateway: unreadable shared answer")
			}
			body++
			if body <= *wrote {
				continue // the client has it from an earlier leader
			}
			if _, err := w.Write(frame[1:]); err != nil {
				return true, nil // the client left
			}
			_ = rc.Flush()
			*wrote = body
		}
	}
}

// The deployments of the usage rows of requests answered without an
// upstream call of their own.
const (
	followerDeployment = "dedup-follower" // another request's call
	cacheDeployment    = "cache-hit"      // the response cache
)

// recordFree counts a request answered without an upstream call of its own
// in the tenant's usage, as a request with no tokens and no cost under
// deployment, so the usage API shows what de-duplication and the cache
// saved.
func (g *Gateway) recordFree(c *call, deployment string) {
	b := c.tenant.accountingBudget()
	win, err := b.Window(time.Now())
	if err != nil {
		return
	}
	res := budget.Reservation{ID: c.usageID(), Tenant: c.tenant.Name, Window: win, Model: c.priceModel()}
	g.usage.add(res, budget.Record{Model: c.priceModel(), Deployment: deployment})
}

package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/lock"
)

// maxSessionIDLen bounds a session id.
const maxSessionIDLen = 256

// Errors of a request whose session lease lapsed, as the upstream call's
// BeforeAttempt check returns them.
var (
	// errSessionLost: the store says another request holds the session
	// now; nothing more may be sent for this one.
	errSessionLost = errors.New("gateway: session lease lost")
	// errSessionUnconfirmed: the lease's validity ran low and the store
	// could not be asked whether it is still ours.
	errSessionUnconfirmed = errors.New("gateway: session lease not confirmed")
)

// sessionID returns the request's session id ("" when none) or a 400: the
// session header's value or, with "x-llmgate-session: user" and no session
// header, the body's user field.
func (g *Gateway) sessionID(r *http.Request, body []byte) (string, *apiError) {
	id, param, code := r.Header.Get(g.opt.Sessions.Header), g.opt.Sessions.Header, "invalid_header"
	switch v := strings.ToLower(strings.TrimSpace(r.Header.Get("X-Llmgate-Session"))); v {
	case "":
	case "user":
		if id != "" {
			break // the session header wins
		}
		param, code = "user", "" // a body field, as ParseRequest reports them
		if raw := openai.Member(body, "user"); raw != nil && json.Unmarshal(raw, &id) != nil {
			return "", openai.BadRequest(param, "Invalid type for 'user': expected a string.")
		}
		if id == "" {
			return "", errf(http.StatusBadRequest, openai.TypeInvalidRequest, "invalid_header", "x-llmgate-session",
				"x-llmgate-session: user takes the session id from the request's 'user' field, which is missing or empty.")
		}
	default:
		return "", errf(http.StatusBadRequest, openai.TypeInvalidRequest, "invalid_header", "x-llmgate-session",
			"Invalid x-llmgate-session %q: the only value is 'user' (the session id is the request's 'user' field).", v)
	}
	if id == "" {
		return "", nil
	}
	if len(id) > maxSessionIDLen {
		return "", errf(http.StatusBadRequest, openai.TypeInvalidRequest, code, param,
			"The session id is longer than %d bytes.", maxSessionIDLen)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return "", errf(http.StatusBadRequest, openai.TypeInvalidRequest, code, param,
				"The session id may only hold printable ASCII without spaces.")
		}
	}
	return id, nil
}

// lockSession waits, in arrival order across every replica, until the
// session's previous request is done, then holds the session for this one.
// The lease is renewed while the request runs; if the replica dies it frees
// itself within the session TTL. A client that leaves while waiting leaves
// the queue (ctx).
func (g *Gateway) lockSession(ctx context.Context, c *call, id string) (*lock.Lease, *apiError) {
	key := "session:" + c.tenant.Name + ":" + id
	_, end := g.stage(ctx, c, "session.wait")
	defer end()
	start := time.Now()
	lease, err := g.opt.Sessions.Locker.Acquire(ctx, key, lock.Options{TTL: g.opt.Sessions.TTL, Fair: true})
	c.access.sessionWait = time.Since(start)
	g.metrics.sessionWait.Observe(c.access.sessionWait.Seconds())
	if err != nil {
		if ctx.Err() != nil {
			return nil, g.cancelled(c, ctx)
		}
		if errors.Is(err, lock.ErrNotObtained) {
			c.outcome = "session_busy"
			return nil, errf(http.StatusConflict, openai.TypeInvalidRequest, "session_busy", g.opt.Sessions.Header,
				"The session's earlier requests did not finish in time.")
		}
		c.outcome = "store_unavailable"
		g.log.Error("session lock failed", "request_id", c.id, "err", err)
		return nil, errf(http.StatusServiceUnavailable, openai.TypeUnavailable, "store_unavailable", "",
			"The gateway cannot order this session's requests right now. Retry shortly.")
	}
	lease.Keepalive()
	c.fence = strconv.FormatUint(lease.Fence, 10)
	c.lease = lease
	return lease, nil
}

// sessionHeld reports whether lease is certainly still held at now: not
// ended, and within the validity the store last confirmed, measured on the
// monotonic clock from the start of that confirmation. A replica that was
// paused past its lease finds it lapsed here as soon as it runs again,
// before its watchdog had a chance to notice.
func sessionHeld(lease *lock.Lease, now time.Time) bool {
	return lease.Err() == nil && now.Before(lease.ValidUntil())
}

// confirmSession is the check right before each upstream attempt of a
// session request: the lease must be valid for at least a quarter of the
// session TTL more (the time the request takes to reach the provider, with
// room to spare). The watchdog renews every third of the TTL, so a holder
// that runs normally always passes without a store call; one that was
// paused, starved or cut off from the store asks the store (an Extend,
// which fails if the lease is no longer ours) and sends only if the store
// confirms it.
func confirmSession(ctx context.Context, lease *lock.Lease) error {
	if lease.Err() != nil {
		return errSessionLost
	}
	margin := lease.TTL / 4
	if time.Until(lease.ValidUntil()) > margin {
		return nil
	}
	ectx, cancel := context.WithTimeout(ctx, margin)
	err := lease.Extend(ectx, 0)
	cancel()
	switch {
	case errors.Is(err, lock.ErrNotHeld) || lease.Err() != nil:
		return errSessionLost
	case err != nil:
		return fmt.Errorf("%w: %w", errSessionUnconfirmed, err)
	case time.Until(lease.ValidUntil()) <= 0:
		return fmt.Errorf("%w: the store took longer than the lease to answer", errSessionUnconfirmed)
	}
	return nil
}

// sessionLost is the answer to a request whose session lease ended before
// its answer did: this replica was paused, starved or cut off from the
// store past the session TTL, and the session may have moved on to a
// later request. Nothing more is sent upstream for it, and it is not
// retried automatically (x-should-retry: false): a retry would come after
// the later request. attrs are added to the log line.
func (g *Gateway) sessionLost(c *call, attrs ...any) *apiError {
	c.outcome = "session_lost"
	g.metrics.sessionsLost.Inc()
	g.log.Warn("session lease lost; request stopped", append([]any{"request_id", c.id, "tenant", c.tenant.Name,
		"session", sessionTag(c), "fence", c.fence}, attrs...)...)
	e := errf(http.StatusConflict, openai.TypeInvalidRequest, "session_lost", "",
		"The session moved on to a later request: the gateway replica serving this one lost the session's lease "+
			"(it was paused or cut off from the store for longer than the session TTL), so this request was stopped. "+
			"You may retry it; it will then come after the session's later requests.")
	return withHeaders(e, func(h http.Header) { h.Set("X-Should-Retry", "false") })
}

// sessionTag names c's session in logs without showing its id, which a
// client chooses and may fill with anything (an e-mail address, a token):
// the first 12 hex digits of the SHA-256 of the session's lock key.
func sessionTag(c *call) string {
	sum := sha256.Sum256([]byte("session:" + c.tenant.Name + ":" + c.session))
	return hex.EncodeToString(sum[:6])
}

// unlockSession releases the session after the answer was sent.
func (g *Gateway) unlockSession(c *call, lease *lock.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if err := lease.Release(ctx); err != nil && !errors.Is(err, lock.ErrNotHeld) && !errors.Is(err, lock.ErrReleased) {
		g.log.Warn("session release failed; the lease expires by itself", "request_id", c.id, "err", err)
	}
}

// runLocked is the rest of the pipeline: the session lock, then run.
func (g *Gateway) runLocked(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call, cache *cacheFill) {
	if c.session != "" {
		lease, aerr := g.lockSession(ctx, c, c.session)
		if aerr != nil {
			aerr.Write(w)
			return
		}
		defer g.unlockSession(c, lease)
		// Losing the lease cancels the request at once, upstream call
		// included: the session may be serving a later request now.
		var stop context.CancelFunc
		ctx, stop = lease.Context(ctx)
		defer stop()
	}
	if cache == nil {
		g.run(ctx, w, r, c)
		return
	}
	tee := &teeWriter{ResponseWriter: w, ctx: ctx, record: &recording{max: maxRecordBytes}}
	g.run(ctx, tee, r, c)
	if tee.record != nil {
		g.fillCache(c, cache, tee.record)
	}
}

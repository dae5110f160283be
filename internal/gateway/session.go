package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/lock"
)

// Session defaults.
const (
	DefaultSessionHeader = "X-Session-Id"
	DefaultSessionTTL    = 10 * time.Second
	maxSessionIDLen      = 256
)

// sessionID returns the request's session id ("" when none) or a 400: the
// session header's value or, with "x-llmgate-session: user" and no session
// header, the body's user field.
func (g *Gateway) sessionID(r *http.Request, body []byte) (string, *apiError) {
	id, param, code := r.Header.Get(g.opt.SessionHeader), g.opt.SessionHeader, "invalid_header"
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
	start := time.Now()
	lease, err := g.opt.Locker.Acquire(ctx, key, lock.Options{TTL: g.opt.SessionTTL, Fair: true})
	g.metrics.sessionWait.Observe(time.Since(start).Seconds())
	if err != nil {
		if ctx.Err() != nil {
			return nil, g.cancelled(c, ctx)
		}
		if errors.Is(err, lock.ErrNotObtained) {
			c.outcome = "session_busy"
			return nil, errf(http.StatusConflict, openai.TypeInvalidRequest, "session_busy", g.opt.SessionHeader,
				"The session's earlier requests did not finish in time.")
		}
		c.outcome = "store_unavailable"
		g.log.Error("session lock failed", "request_id", c.id, "err", err)
		return nil, errf(http.StatusServiceUnavailable, openai.TypeUnavailable, "store_unavailable", "",
			"The gateway cannot order this session's requests right now. Retry shortly.")
	}
	lease.Keepalive()
	c.fence = strconv.FormatUint(lease.Fence, 10)
	return lease, nil
}

// unlockSession releases the session after the answer was sent.
func (g *Gateway) unlockSession(c *call, lease *lock.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if err := lease.Release(ctx); err != nil && !errors.Is(err, lock.ErrNotHeld) && !errors.Is(err, lock.ErrReleased) {
		g.log.Warn("session release failed; the lease expires by itself", "request_id", c.id, "err", err)
	}
}

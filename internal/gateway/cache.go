package gateway

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/respcache"
)

// cacheFill is where and for how long a request's answer is cached.
type cacheFill struct {
	tenant, key string
	ttl         time.Duration
}

// cacheFor decides whether c's answer is looked up in and stored to the
// cache: the tenant opted in (for this model), or the request asked with
// x-llmgate-cache-ttl; never with x-llmgate-cache: skip.
func (g *Gateway) cacheFor(r *http.Request, c *call) (*cacheFill, *apiError) {
	if g.cache == nil {
		return nil, nil
	}
	switch v := strings.ToLower(strings.TrimSpace(r.Header.Get("X-Llmgate-Cache"))); v {
	case "":
	case "skip", "no-store", "off":
		return nil, nil
	default:
		return nil, errf(http.StatusBadRequest, openai.TypeInvalidRequest, "invalid_header", "x-llmgate-cache",
			"Invalid x-llmgate-cache %q: the only value is 'skip'.", v)
	}
	var ttl time.Duration
	if tc := c.tenant.Cache; tc != nil && (tc.Models == nil || tc.Models[c.req.Model]) {
		ttl = tc.TTL
	}
	if v := r.Header.Get("X-Llmgate-Cache-Ttl"); v != "" {
		d, err := parseTTL(v, g.opt.Cache.MaxTTL)
		if err != nil {
			return nil, errf(http.StatusBadRequest, openai.TypeInvalidRequest, "invalid_header", "x-llmgate-cache-ttl",
				"Invalid x-llmgate-cache-ttl %q: give seconds (\"300\") or a duration (\"10m\"), above 0.", v)
		}
		ttl = d
	}
	if ttl <= 0 {
		return nil, nil
	}
	// The scope is the tenant and the endpoint: a body may hold both
	// messages and prompt, and a chat answer is no answer to /v1/completions.
	key, err := respcache.Key(c.tenant.Name+":"+c.req.Endpoint.String(), c.req.Model, c.body, c.req.Stream)
	if err != nil {
		return nil, nil
	}
	return &cacheFill{tenant: c.tenant.Name, key: key, ttl: ttl}, nil
}

// parseTTL reads an x-llmgate-cache-ttl: seconds or a Go duration, above
// 0; a TTL above limit is limit (capped, not refused).
func parseTTL(v string, limit time.Duration) (time.Duration, error) {
	v = strings.TrimSpace(v)
	var d time.Duration
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if !(f > 0) { // also NaN
			return 0, errors.New("not above 0")
		}
		if f >= limit.Seconds() {
			return limit, nil
		}
		d = time.Duration(f * float64(time.Second))
	} else if d, err = time.ParseDuration(v); err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, errors.New("not above 0")
	}
	return min(d, limit), nil
}

// serveCached answers from the cache; false on a miss (or a store error,
// which is logged and turns the cache off for a while: the request then
// goes upstream).
func (g *Gateway) serveCached(ctx context.Context, w http.ResponseWriter, c *call, cf *cacheFill) bool {
	ctx, end := g.stage(ctx, c, "cache")
	defer end()
	gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	e, ok, err := g.cache.Get(gctx, cf.tenant, cf.key)
	if err != nil && !errors.Is(err, respcache.ErrUnavailable) {
		g.log.Warn("cache lookup failed; going upstream, and the cache is off for a while", "request_id", c.id, "err", err)
	}
	if !ok || e == nil {
		g.metrics.cache.WithLabelValues("miss").Inc()
		w.Header().Set("X-Llmgate-Cache", "miss")
		return false
	}
	g.metrics.cache.WithLabelValues("hit").Inc()
	c.outcome = "cache_hit"
	g.recordFree(c, cacheDeployment)
	h := w.Header()
	for k, v := range e.Header {
		h[k] = v
	}
	h.Set("X-Llmgate-Cache", "hit")
	if e.Events == nil {
		h.Set("Content-Length", itoa(int64(len(e.Body))))
	}
	w.WriteHeader(e.Status)
	if e.Events == nil {
		_, _ = w.Write(e.Body)
		return true
	}
	rc := http.NewResponseController(w)
	for _, ev := range e.Events {
		if _, err := w.Write(ev); err != nil {
			return true
		}
		_ = rc.Flush()
	}
	return true
}

// fillCache stores a recorded answer if it may be cached.
func (g *Gateway) fillCache(c *call, cf *cacheFill, rec *recording) {
	if rec.status/100 != 2 {
		return
	}
	e := &respcache.Entry{Status: rec.status, Header: cacheHeader(rec.header), Created: time.Now()}
	if c.req.Stream {
		e.Events = rec.frames
	} else {
		e.Body = bytes.Join(rec.frames, nil)
	}
	if !respcache.Cacheable(e, g.opt.Cache.Length) {
		return
	}
	g.workers.run(settleTimeout, func(ctx context.Context) {
		err := g.cache.Put(ctx, cf.tenant, cf.key, e, cf.ttl)
		if err != nil && !errors.Is(err, respcache.ErrUnavailable) && !errors.Is(err, respcache.ErrTooLarge) {
			g.log.Warn("cache store failed", "request_id", c.id, "err", err)
		}
	})
}

// cacheHeader keeps what a replay should repeat: the content type and the
// provider's descriptive headers, not per-response ones.
func cacheHeader(h http.Header) http.Header {
	out := http.Header{}
	for k, v := range h {
		switch {
		case k == "Content-Type", k == "X-Llmgate-Deployment", strings.HasPrefix(k, "Openai-"):
			out[k] = v
		}
	}
	return out
}

package gateway

import (
	"context"
	"net/http"
	"time"
)

func (g *Gateway) serveHealth(w http.ResponseWriter, r *http.Request) {
	setRequestID(w, r)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte("{\"status\":\"ok\"}\n"))
}

func (g *Gateway) serveReady(w http.ResponseWriter, r *http.Request) {
	setRequestID(w, r)
	if g.Draining() {
		errf(http.StatusServiceUnavailable, "service_unavailable", "shutting_down", "",
			"This gateway is shutting down: it still finishes the requests it has, but send new ones to another replica.").Write(w)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := g.opt.Ready(ctx); err != nil {
		g.log.Warn("readiness check failed", "err", err)
		errf(http.StatusServiceUnavailable, "service_unavailable", "store_unavailable", "",
			"The coordination store is not reachable.").Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	// A cache turned off by its store's failures is reported, never waited
	// for: without it the gateway serves every request, uncached.
	if g.cache != nil && g.cache.Off() {
		_, _ = w.Write([]byte("{\"status\":\"ready\",\"cache\":\"off\"}\n"))
		return
	}
	_, _ = w.Write([]byte("{\"status\":\"ready\"}\n"))
}

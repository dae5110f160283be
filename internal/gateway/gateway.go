// Package gateway is llmgate's OpenAI-compatible HTTP front: it
// authenticates tenants, routes models to deployments, admits requests
// through the shared rate limits and budgets, calls the provider and settles
// what was really used.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/internal/redact"
	"github.com/llmgate/llmgate/internal/respcache"
)

// Gateway serves the OpenAI-compatible API. Create it with New.
type Gateway struct {
	opt      Options
	log      *slog.Logger
	mux      *http.ServeMux
	metrics  *metrics
	ops      *opsMetrics
	registry *prometheus.Registry
	redact   *redact.Redactor // the secrets kept from clients
	// byTarget maps "provider/model" to its deployments (one per key).
	byTarget map[string][]*deployment
	deps     []*deployment
	byName   map[string]*deployment
	// pending counts the requests being served and the background work
	// they leave; Close waits for it.
	pending pendingWork
	// estimates learns completion sizes for requests without max_tokens.
	estimates completionEstimates
	// keeper renews the rate-limit reservations of long requests.
	keeper keeper
	// workers run the background work; Close stops them.
	workers workers
	// usage batches the usage records of tenants without a budget cap.
	usage usageBatch
	// tenants are the tenants in force (SetTenants).
	tenants atomic.Pointer[tenantIndex]
	// cache is Options.Cache.Store behind a breaker: nil without a cache.
	cache *respcache.Breaker
	// lastWindow caches a budget window (see window).
	lastWindow atomic.Pointer[lastWindow]
	// draining is set by Drain: /readyz then fails.
	draining atomic.Bool
	// running counts the proxied requests being served (Running).
	running atomic.Int64
	// base is the context of every request served through an
	// http.Server whose BaseContext is g.BaseContext; cut (Cut) cancels
	// it with ErrShuttingDown.
	base context.Context
	cut  context.CancelCauseFunc
}

// ErrShuttingDown is the cause of the cancellation of the requests that Cut
// stops.
var ErrShuttingDown = errors.New("gateway: shutting down")

// New returns a Gateway, or an error naming what is missing.
func New(opt Options) (*Gateway, error) {
	switch {
	case opt.Limiter == nil:
		return nil, errors.New("gateway: Options.Limiter is required")
	case opt.Budgets == nil:
		return nil, errors.New("gateway: Options.Budgets is required")
	case opt.Upstream == nil:
		return nil, errors.New("gateway: Options.Upstream is required")
	case opt.Route == nil:
		return nil, errors.New("gateway: Options.Route is required")
	}
	opt = opt.withDefaults()
	reg := opt.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	g := &Gateway{
		opt:      opt,
		redact:   redact.New(opt.Secrets...),
		log:      opt.Logger,
		registry: reg,
		byTarget: make(map[string][]*deployment),
		byName:   make(map[string]*deployment),
	}
	if opt.Cache.Store != nil {
		g.cache = respcache.NewBreaker(opt.Cache.Store, opt.Cache.CoolOff, nil)
	}
	g.base, g.cut = context.WithCancelCause(context.Background())
	g.SetTenants(opt.Tenants)
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	g.metrics = m
	if g.ops, err = newOpsMetrics(reg); err != nil {
		return nil, err
	}
	if err := reg.Register(newOpsCollector(g)); err != nil {
		return nil, err
	}
	if err := reg.Register(newAdmissionCollector(opt.Limiter)); err != nil {
		return nil, err
	}
	if err := reg.Register(newStoreCollector(opt, g.cache)); err != nil {
		return nil, err
	}
	g.usage.g = g
	g.workers.pending = &g.pending
	seen := make(map[string]bool)
	for i := range opt.Deployments {
		d := &opt.Deployments[i]
		if d.Name == "" || d.Provider == "" || d.Model == "" {
			return nil, fmt.Errorf("gateway: deployment %d needs Name, Provider and Model", i)
		}
		if seen[d.Name] {
			return nil, fmt.Errorf("gateway: two deployments are named %q", d.Name)
		}
		seen[d.Name] = true
		dep := newDeployment(d, opt.Admission.SlowStart)
		g.deps = append(g.deps, dep)
		g.byName[d.Name] = dep
		key := d.Provider + "/" + d.Model
		g.byTarget[key] = append(g.byTarget[key], dep)
	}
	g.routes()
	return g, nil
}

// Handler returns the gateway's HTTP handler.
func (g *Gateway) Handler() http.Handler { return g.mux }

// BaseContext is the context the requests' contexts must derive from for
// Cut to reach them: set it as the http.Server's BaseContext.
func (g *Gateway) BaseContext(net.Listener) context.Context { return g.base }

// Drain marks the gateway as shutting down: from now on /readyz answers
// 503 shutting_down, so that load balancers stop sending to it, while
// every request is still served.
func (g *Gateway) Drain() { g.draining.Store(true) }

// Draining reports whether Drain was called.
func (g *Gateway) Draining() bool { return g.draining.Load() }

// Running is the number of proxied requests being served now.
func (g *Gateway) Running() int { return int(g.running.Load()) }

// Cut cancels every request still running, with ErrShuttingDown as the
// cause (their contexts must derive from BaseContext). They end the way
// requests whose client left do, and are settled the same way: a stream is
// charged the prompt estimate plus one token per chunk streamed, and told
// in-band that it was cut; a request not yet answered gets 503
// shutting_down and gives back its reservations. Close waits for them.
func (g *Gateway) Cut() { g.cut(ErrShuttingDown) }

// shuttingDown reports whether ctx was cancelled by Cut.
func shuttingDown(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrShuttingDown)
}

func (g *Gateway) routes() {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", g.serveChat)
	mux.HandleFunc("POST /v1/completions", g.serveCompletions)
	mux.HandleFunc("POST /v1/embeddings", g.serveEmbeddings)
	mux.HandleFunc("POST /v1/messages", g.serveMessages)
	mux.HandleFunc("POST /v1/messages/count_tokens", g.serveCountTokens)
	mux.HandleFunc("POST /v1/responses", g.serveResponses)
	mux.HandleFunc("GET /v1/responses/{id}", g.serveResponseByID)
	mux.HandleFunc("DELETE /v1/responses/{id}", g.serveResponseByID)
	mux.HandleFunc("GET /v1/responses/{id}/input_items", g.serveResponseByID)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", g.serveResponseByID)
	mux.HandleFunc("GET /v1/models", g.serveModels)
	mux.HandleFunc("GET /v1/models/{model...}", g.serveModel)
	mux.HandleFunc("GET /healthz", g.serveHealth)
	mux.HandleFunc("GET /readyz", g.serveReady)
	mux.Handle("GET /metrics", g.metricsHandler())
	mux.HandleFunc("GET /admin/usage", g.admin(g.serveAdminUsage))
	mux.HandleFunc("GET /admin/deployments", g.admin(g.serveAdminDeployments))
	g.routeDashboard(mux)
	if h := g.opt.TenantAdmin; h != nil {
		mux.HandleFunc("/admin/tenants", g.admin(h.ServeHTTP))
		mux.HandleFunc("/admin/tenants/", g.admin(h.ServeHTTP))
	}
	g.passRoutes(mux)
	mux.HandleFunc("/", g.serveUnknown)
	g.mux = mux
}

func (g *Gateway) serveNotFound(w http.ResponseWriter, r *http.Request) {
	setRequestID(w, r)
	errf(http.StatusNotFound, "invalid_request_error", "unknown_url", "",
		"Unknown request URL: %s %s. Please check the URL for typos, or see the docs at docs/gateway.md.", r.Method, r.URL.Path).Write(w)
}

// Package gateway is llmgate's OpenAI-compatible HTTP front: it
// authenticates tenants, routes models to deployments, admits requests
// through the shared rate limits and budgets, calls the provider and settles
// what was really used.
package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/redact"
	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/ratelimit"
)

// Limits is a quota; 0 means no limit of that kind.
type Limits struct {
	RPM, TPM, Concurrency int64
}

func (l Limits) any() bool { return l.count() > 0 }

// count is how many of the limits are set.
func (l Limits) count() int {
	n := 0
	for _, v := range [3]int64{l.RPM, l.TPM, l.Concurrency} {
		if v > 0 {
			n++
		}
	}
	return n
}

// Deployment is one provider key serving one model.
type Deployment struct {
	// Name labels the deployment in limits, metrics and usage, e.g.
	// "openai#2/gpt-4.1".
	Name string
	// Provider and Model address it as a route target "provider/model".
	Provider, Model string
	// Target is how to call it (base URL and key).
	Target provider.Target
	// Limits is the provider's quota for this key and model.
	Limits Limits
}

// Tenant is a caller identified by its API key.
type Tenant struct {
	Name string
	// Models lists the model names the tenant may ask for; nil means all.
	Models map[string]bool
	// Limits apply to everything the tenant sends; ModelLimits to each
	// model name it asks for.
	Limits      Limits
	ModelLimits map[string]Limits
	// Budget caps the tenant's spend; nil means usage is only accounted.
	Budget *budget.Budget
	// Priority is the default queue class of the tenant's requests.
	Priority ratelimit.Priority
	// MaxWait overrides Options.MaxWait when not nil.
	MaxWait *time.Duration
	// Cache opts the tenant into the response cache; nil means off.
	Cache *TenantCache
	// Dedup de-duplicates all of the tenant's requests (opt-in).
	Dedup bool
}

// capped reports whether t's spend is limited (a budget with a token or
// money cap): its usage must then be recorded request by request.
func (t *Tenant) capped() bool {
	b := t.accountingBudget()
	return b.Tokens != 0 || b.MicroUSD != 0
}

// accountingBudget is the budget t's usage is recorded under: its own, or
// for a tenant without one an uncapped monthly one (usage is still
// accounted).
func (t *Tenant) accountingBudget() budget.Budget {
	if t.Budget != nil {
		return *t.Budget
	}
	return budget.Budget{Tenant: t.Name, Period: accountingPeriod}
}

// Model is an entry of GET /v1/models.
type Model struct {
	ID      string
	OwnedBy string
}

// Options configures a Gateway. Limiter, Budgets and Upstream are required.
type Options struct {
	Deployments []Deployment
	// Route returns the ordered route targets ("provider/model") for a
	// model name a client sends; false when the model is unknown. The
	// gateway never modifies the slice (it may be shared).
	Route func(model string) ([]string, bool)
	// Models is what GET /v1/models lists (filtered per tenant).
	Models []Model
	// Tenants maps the lowercase hex SHA-256 of an API key to its tenant.
	// Empty means open access: every request runs as tenant "anonymous".
	Tenants map[string]*Tenant

	Limiter  *ratelimit.Limiter
	Budgets  *budget.Manager
	Upstream *provider.Client
	// Ready reports whether the coordination store answers (GET /readyz).
	Ready func(ctx context.Context) error

	// MaxBodyBytes bounds request bodies (413 above). Default 8 MiB.
	MaxBodyBytes int64
	// MaxWait is how long a request may wait for rate-limit capacity
	// before it is answered 429. Default 30s.
	MaxWait time.Duration
	// RequestTimeout bounds a whole request: waiting, retries and the
	// answer. Default 10m.
	RequestTimeout time.Duration
	// IdleTimeout is the longest gap between two events of an upstream
	// stream. Default 2m.
	IdleTimeout time.Duration
	// CompletionEstimate is the completion tokens reserved for a chat
	// request that does not set max_tokens, until the gateway has seen
	// enough such requests of its tenant and model to use the largest
	// completion among the recent ones instead. Default 256.
	CompletionEstimate int64
	// Locker orders the requests of one session (see SessionHeader); nil
	// disables session ordering.
	Locker *lock.Locker
	// SessionHeader names the request header carrying a session id.
	// Default DefaultSessionHeader.
	SessionHeader string
	// SessionTTL is the session lease: how long a dead replica can hold a
	// session. Default DefaultSessionTTL.
	SessionTTL time.Duration

	// Dedup shares one upstream call among identical requests across
	// replicas; nil disables de-duplication.
	Dedup *dedup.Group
	// DedupDeterministic de-duplicates requests with temperature 0
	// automatically; DedupModels does so for these models whatever the
	// temperature. Requests with an Idempotency-Key always share.
	DedupDeterministic bool
	DedupModels        map[string]bool
	// DedupRetain is how long a finished automatic flight is still shared
	// with late arrivals. Default DefaultDedupRetain.
	DedupRetain time.Duration
	// IdempotencyTTL is how long an Idempotency-Key's answer is kept for
	// retries. Default DefaultIdempotencyTTL.
	IdempotencyTTL time.Duration
	// Cache stores completed answers; nil disables caching.
	Cache respcache.Store
	// CacheMaxTTL caps x-llmgate-cache-ttl. Default DefaultCacheMaxTTL.
	CacheMaxTTL time.Duration
	// CacheLength also caches answers cut by finish_reason "length".
	CacheLength bool

	// ReservationHold is how long a rate-limit reservation (and its
	// concurrency permit) lives without news from this replica; running
	// requests renew it every half hold, so it bounds only how long a
	// crashed replica pins capacity. Default DefaultReservationHold.
	ReservationHold time.Duration
	// UsageFlushInterval is how long the usage of tenants without a budget
	// cap collects before it is recorded: one store call per tenant,
	// window, model and deployment per interval instead of one per request
	// (tenants with a cap are settled request by request). It bounds what a
	// replica killed with -9 loses of such usage; Close records it all.
	// Default DefaultUsageFlushInterval.
	UsageFlushInterval time.Duration

	// InProcessLimiter says Limiter's store is in this process (the memory
	// store): a finished request's limits are then settled on its own
	// goroutine once its answer is out, which costs less than handing the
	// work to a background worker. Budget settles stay in the background
	// (the memory budget store waits for the disk).
	InProcessLimiter bool

	// RateLimitFailClosed refuses requests (503) when the rate-limit store
	// cannot be reached; the default admits them unchecked.
	RateLimitFailClosed bool
	// AdminTokenSHA256 is the hex SHA-256 of the admin API token; empty
	// disables /admin/.
	AdminTokenSHA256 string
	// MetricsTokenSHA256 is the hex SHA-256 of the token /metrics asks
	// for; empty leaves /metrics open.
	MetricsTokenSHA256 string
	// Secrets are removed from everything relayed from a provider to a
	// client (headers, bodies, stream events): providers echo keys back in
	// error messages. The provider keys and the admin and metrics tokens,
	// in practice.
	Secrets []string

	// BodyTimeout bounds the reading of a request body (408 past it).
	// Default DefaultBodyTimeout.
	BodyTimeout time.Duration
	// WriteTimeout bounds each write of a non-streamed answer to the
	// client, and StreamWriteTimeout each event of a stream: a client
	// that does not read is cut. Defaults DefaultWriteTimeout and
	// DefaultStreamWriteTimeout.
	WriteTimeout       time.Duration
	StreamWriteTimeout time.Duration

	Logger *slog.Logger
	// Registry receives the gateway's Prometheus metrics; nil means a new
	// registry, served on /metrics.
	Registry *prometheus.Registry
}

// Default values of Options.
const (
	DefaultMaxBodyBytes       = 8 << 20
	DefaultMaxWait            = 30 * time.Second
	DefaultRequestTimeout     = 10 * time.Minute
	DefaultBodyTimeout        = 60 * time.Second
	DefaultWriteTimeout       = 60 * time.Second
	DefaultStreamWriteTimeout = 60 * time.Second
	DefaultIdleTimeout        = 2 * time.Minute
	DefaultCompletionEstimate = 256
	DefaultReservationHold    = 10 * time.Second
)

// anonymous is the tenant of open access (no tenants configured).
var anonymous = &Tenant{Name: "anonymous"}

// Gateway serves the OpenAI-compatible API. Create it with New.
type Gateway struct {
	opt      Options
	log      *slog.Logger
	mux      *http.ServeMux
	metrics  *metrics
	registry *prometheus.Registry
	redact   *redact.Redactor // the secrets kept from clients
	// byTarget maps "provider/model" to its deployments (one per key).
	byTarget map[string][]*deployment
	deps     []*deployment
	byName   map[string]*deployment
	// pending counts background settles; Close waits for them.
	pending pendingWork
	// estimates learns completion sizes for requests without max_tokens.
	estimates completionEstimates
	// keeper renews the rate-limit reservations of long requests.
	keeper keeper
	// bgMu protects the background workers' queue (made on first use)
	// and stop channel; Close stops them.
	bgMu      sync.Mutex
	jobs      chan backgroundJob
	stopJobs  chan struct{}
	bgStopped bool
	// usage batches the usage records of tenants without a budget cap.
	usage usageBatch
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
	positive(&opt.MaxBodyBytes, DefaultMaxBodyBytes)
	positive(&opt.RequestTimeout, DefaultRequestTimeout)
	positive(&opt.IdleTimeout, DefaultIdleTimeout)
	positive(&opt.CompletionEstimate, DefaultCompletionEstimate)
	positive(&opt.ReservationHold, DefaultReservationHold)
	positive(&opt.UsageFlushInterval, DefaultUsageFlushInterval)
	positive(&opt.DedupRetain, DefaultDedupRetain)
	positive(&opt.IdempotencyTTL, DefaultIdempotencyTTL)
	positive(&opt.CacheMaxTTL, DefaultCacheMaxTTL)
	positive(&opt.SessionTTL, DefaultSessionTTL)
	positive(&opt.BodyTimeout, DefaultBodyTimeout)
	positive(&opt.WriteTimeout, DefaultWriteTimeout)
	positive(&opt.StreamWriteTimeout, DefaultStreamWriteTimeout)
	if opt.MaxWait < 0 {
		opt.MaxWait = 0
	} else if opt.MaxWait == 0 {
		opt.MaxWait = DefaultMaxWait
	}
	if opt.SessionHeader == "" {
		opt.SessionHeader = DefaultSessionHeader
	}
	opt.SessionHeader = http.CanonicalHeaderKey(opt.SessionHeader)
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.Ready == nil {
		opt.Ready = func(context.Context) error { return nil }
	}
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
	g.base, g.cut = context.WithCancelCause(context.Background())
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	g.metrics = m
	if err := reg.Register(newAdmissionCollector(opt.Limiter)); err != nil {
		return nil, err
	}
	if err := reg.Register(newStoreCollector(opt.Ready, opt.Limiter, opt.Budgets)); err != nil {
		return nil, err
	}
	g.usage.g = g
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
		dep := newDeployment(d)
		g.deps = append(g.deps, dep)
		g.byName[d.Name] = dep
		key := d.Provider + "/" + d.Model
		g.byTarget[key] = append(g.byTarget[key], dep)
	}
	g.routes()
	return g, nil
}

// positive sets *p to def unless it is above zero.
func positive[T int64 | time.Duration](p *T, def T) {
	if *p <= 0 {
		*p = def
	}
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
	mux.HandleFunc("GET /v1/models", g.serveModels)
	mux.HandleFunc("GET /v1/models/{model...}", g.serveModel)
	mux.HandleFunc("GET /healthz", g.serveHealth)
	mux.HandleFunc("GET /readyz", g.serveReady)
	mux.Handle("GET /metrics", g.metricsHandler())
	mux.HandleFunc("GET /admin/usage", g.admin(g.serveAdminUsage))
	mux.HandleFunc("GET /admin/deployments", g.admin(g.serveAdminDeployments))
	mux.HandleFunc("/", g.serveNotFound)
	g.mux = mux
}

// authenticate returns the request's tenant, or a 401.
func (g *Gateway) authenticate(r *http.Request) (*Tenant, *apiError) {
	key, ok := bearer(r)
	if len(g.opt.Tenants) == 0 {
		return anonymous, nil
	}
	if !ok {
		return nil, errf(http.StatusUnauthorized, "authentication_error", "missing_api_key", "",
			"You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY'.")
	}
	sum := sha256.Sum256([]byte(key))
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	t := g.opt.Tenants[string(hx[:])] // indexed in place: no string is made
	if t == nil {
		return nil, errf(http.StatusUnauthorized, "authentication_error", "invalid_api_key", "",
			"Incorrect API key provided. Ask your llmgate operator for a valid key.")
	}
	return t, nil
}

// bearer returns the token of an "Authorization: Bearer" header (also
// accepting OpenAI's "api-key" header used by Azure SDKs).
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		tok := strings.TrimSpace(h[7:])
		return tok, tok != ""
	}
	if k := strings.TrimSpace(r.Header.Get("Api-Key")); k != "" {
		return k, true
	}
	return "", false
}

// admin wraps an admin handler with the admin token check.
func (g *Gateway) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		setRequestID(w, r)
		if g.opt.AdminTokenSHA256 == "" {
			errf(http.StatusNotFound, "not_found_error", "admin_disabled", "",
				"The admin API is disabled: set the admin token (admin_token_env) to enable it.").Write(w)
			return
		}
		if !tokenMatches(r, g.opt.AdminTokenSHA256) {
			errf(http.StatusUnauthorized, "authentication_error", "invalid_admin_token", "",
				"The admin API needs the admin token as 'Authorization: Bearer TOKEN'.").Write(w)
			return
		}
		h(w, r)
	}
}

// tokenMatches reports whether r carries the bearer token whose hex
// SHA-256 is wantSHA256, compared in constant time.
func tokenMatches(r *http.Request, wantSHA256 string) bool {
	tok, _ := bearer(r)
	sum := sha256.Sum256([]byte(tok))
	want, err := hex.DecodeString(wantSHA256)
	return err == nil && tok != "" && subtle.ConstantTimeCompare(sum[:], want) == 1
}

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
	_, _ = w.Write([]byte("{\"status\":\"ready\"}\n"))
}

func (g *Gateway) serveNotFound(w http.ResponseWriter, r *http.Request) {
	setRequestID(w, r)
	errf(http.StatusNotFound, "invalid_request_error", "unknown_url", "",
		"Unknown request URL: %s %s. Please check the URL for typos, or see the docs at docs/gateway.md.", r.Method, r.URL.Path).Write(w)
}

package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/internal/dashboard"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Limits is a quota; 0 means no limit of that kind.
type Limits struct {
	RPM, TPM, Concurrency int64
	// ITPM and OTPM are input and output tokens per minute (Anthropic's
	// limits), for deployments only: each is a tokens limit on a scope of
	// its own (the limiter holds one tokens limit per window and scope),
	// charged the prompt estimate and the completion bound, settled with
	// the prompt and completion tokens used.
	ITPM, OTPM int64
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

// TenantCache opts a tenant into the response cache.
type TenantCache struct {
	TTL time.Duration
	// Models limits caching to these model names; nil means all.
	Models map[string]bool
}

// Options configures a Gateway. Limiter, Budgets, Upstream and Route are
// required; every duration or size left at zero takes its default.
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
	// These are the tenants at the start; SetTenants replaces them.
	Tenants map[string]*Tenant

	Limiter  *ratelimit.Limiter
	Budgets  *budget.Manager
	Upstream *provider.Client
	// Ready reports whether the coordination store answers (GET /readyz).
	Ready func(ctx context.Context) error

	Admission AdmissionOptions
	HTTP      HTTPOptions
	Sessions  SessionOptions
	Dedup     DedupOptions
	Cache     CacheOptions
	// PassThrough says where the routes without a model go (files,
	// batches, and unknown /v1/ routes).
	PassThrough PassThroughOptions

	// TenantAdmin serves /admin/tenants (behind the admin token); nil
	// leaves it out. SetTenants changes the tenants in force.
	TenantAdmin http.Handler

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

	// ReplicaName names this replica (on the dashboard). Default
	// hostname:pid.
	ReplicaName string
	// Replicas lists the replicas that shared the store lately, for the
	// dashboard; nil shows none.
	Replicas func(ctx context.Context) ([]dashboard.Replica, error)

	Logger *slog.Logger
	// AccessLog logs one line per request at info (accesslog.go).
	AccessLog bool
	// Tracer, when set, traces every request: a span per request (a child
	// of the client's W3C traceparent) and per stage, the upstream call's
	// context sent to the provider as traceparent. Nil: off.
	Tracer trace.Tracer
	// Registry receives the gateway's Prometheus metrics; nil means a new
	// registry, served on /metrics.
	Registry *prometheus.Registry
}

// PassThroughOptions configure the routes passed to a provider as they
// are (see passthrough.go).
type PassThroughOptions struct {
	// Provider names the provider whose first deployment takes the routes
	// without a model (files, batches, unknown routes); "" means the
	// first deployment of type openai.
	Provider string
	// Unknown passes /v1/ routes the gateway does not know to that
	// deployment; false answers them 404 unknown_url.
	Unknown bool
}

// AdmissionOptions say how requests wait for and hold rate-limit capacity,
// and how their usage is recorded.
type AdmissionOptions struct {
	// MaxWait is how long a request may wait for rate-limit capacity
	// before it is answered 429; negative means not at all. Default
	// DefaultMaxWait.
	MaxWait time.Duration
	// CompletionEstimate is the completion tokens reserved for a chat
	// request that does not set max_tokens, until the gateway has seen
	// enough such requests of its tenant and model to use the largest
	// completion among the recent ones instead. Default
	// DefaultCompletionEstimate.
	CompletionEstimate int64
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
	// FailClosed refuses requests (503) when the rate-limit store cannot
	// be reached; the default admits them unchecked.
	FailClosed bool
	// SlowStart is how many requests each deployment may have in flight,
	// across replicas, until its provider has reported its limits (in
	// x-ratelimit-* headers or a 429): a configured limit above the real
	// one then costs no burst of 429s. Each success that reports nothing
	// lets one more in (the window doubles every round trip) until 64.
	// Negative turns slow start off. Default DefaultSlowStart.
	SlowStart int64
}

// HTTPOptions bound what a client, and an upstream stream, may take.
type HTTPOptions struct {
	// MaxBodyBytes bounds request bodies (413 above). Default
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// BodyTimeout bounds the reading of a request body (408 past it).
	// Default DefaultBodyTimeout.
	BodyTimeout time.Duration
	// RequestTimeout bounds a whole request: waiting, retries and the
	// answer. Default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// WriteTimeout bounds each write of a non-streamed answer to the
	// client, and StreamWriteTimeout each event of a stream: a client
	// that does not read is cut. Defaults DefaultWriteTimeout and
	// DefaultStreamWriteTimeout.
	WriteTimeout       time.Duration
	StreamWriteTimeout time.Duration
	// UpstreamIdleTimeout is the longest gap between two events of an
	// upstream stream. Default DefaultUpstreamIdleTimeout.
	UpstreamIdleTimeout time.Duration
}

// SessionOptions order the requests of one session.
type SessionOptions struct {
	// Locker holds each session's turn; nil disables session ordering.
	Locker *lock.Locker
	// Header names the request header carrying a session id. Default
	// DefaultSessionHeader.
	Header string
	// TTL is the session lease: how long a dead replica can hold a
	// session. Default DefaultSessionTTL.
	TTL time.Duration
}

// DedupOptions share one upstream call among identical requests across
// replicas.
type DedupOptions struct {
	// Group runs the shared calls; nil disables de-duplication.
	Group *dedup.Group
	// Deterministic de-duplicates requests with temperature 0
	// automatically; Models does so for these models whatever the
	// temperature. Requests with an Idempotency-Key always share.
	Deterministic bool
	Models        map[string]bool
	// Retain is how long a finished automatic flight is still shared with
	// late arrivals. Default DefaultDedupRetain.
	Retain time.Duration
	// IdempotencyTTL is how long an Idempotency-Key's answer is kept for
	// retries. Default DefaultIdempotencyTTL.
	IdempotencyTTL time.Duration
}

// CacheOptions configure the response cache (tenants opt in, see
// TenantCache).
type CacheOptions struct {
	// Store keeps completed answers; nil disables caching. While it
	// fails, the cache is off (lookups are misses) for CoolOff at a time:
	// it never fails a request.
	Store respcache.Store
	// Ping reports whether Store's own Redis answers, when the cache has
	// one apart from the coordination store: /readyz and /metrics report
	// it (label store="cache"). Nil when the cache shares the coordination
	// store or lives in this process.
	Ping func(ctx context.Context) error
	// CoolOff is how long the cache stays off after its store failed.
	// Default respcache.DefaultCoolOff.
	CoolOff time.Duration
	// MaxTTL caps x-llmgate-cache-ttl. Default DefaultCacheMaxTTL.
	MaxTTL time.Duration
	// Length also caches answers cut by finish_reason "length".
	Length bool
}

// Default values of Options.
const (
	DefaultMaxWait            = 30 * time.Second
	DefaultCompletionEstimate = 256
	DefaultReservationHold    = 10 * time.Second
	DefaultUsageFlushInterval = 100 * time.Millisecond
	DefaultSlowStart          = 4

	DefaultMaxBodyBytes        = 8 << 20
	DefaultBodyTimeout         = 60 * time.Second
	DefaultRequestTimeout      = 10 * time.Minute
	DefaultWriteTimeout        = 60 * time.Second
	DefaultStreamWriteTimeout  = 60 * time.Second
	DefaultUpstreamIdleTimeout = 2 * time.Minute

	DefaultSessionHeader = "X-Session-Id"
	DefaultSessionTTL    = 10 * time.Second

	DefaultDedupRetain    = 10 * time.Second
	DefaultIdempotencyTTL = 24 * time.Hour
	DefaultCacheMaxTTL    = 24 * time.Hour
)

// withDefaults returns o with every unset duration, size and name at its
// default.
func (o Options) withDefaults() Options {
	positive(&o.Admission.CompletionEstimate, DefaultCompletionEstimate)
	positive(&o.Admission.ReservationHold, DefaultReservationHold)
	positive(&o.Admission.UsageFlushInterval, DefaultUsageFlushInterval)
	if o.Admission.SlowStart == 0 {
		o.Admission.SlowStart = DefaultSlowStart
	}
	switch {
	case o.Admission.MaxWait < 0:
		o.Admission.MaxWait = 0
	case o.Admission.MaxWait == 0:
		o.Admission.MaxWait = DefaultMaxWait
	}
	positive(&o.HTTP.MaxBodyBytes, DefaultMaxBodyBytes)
	positive(&o.HTTP.BodyTimeout, DefaultBodyTimeout)
	positive(&o.HTTP.RequestTimeout, DefaultRequestTimeout)
	positive(&o.HTTP.WriteTimeout, DefaultWriteTimeout)
	positive(&o.HTTP.StreamWriteTimeout, DefaultStreamWriteTimeout)
	positive(&o.HTTP.UpstreamIdleTimeout, DefaultUpstreamIdleTimeout)
	if o.Sessions.Header == "" {
		o.Sessions.Header = DefaultSessionHeader
	}
	o.Sessions.Header = http.CanonicalHeaderKey(o.Sessions.Header)
	positive(&o.Sessions.TTL, DefaultSessionTTL)
	positive(&o.Dedup.Retain, DefaultDedupRetain)
	positive(&o.Dedup.IdempotencyTTL, DefaultIdempotencyTTL)
	positive(&o.Cache.MaxTTL, DefaultCacheMaxTTL)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ReplicaName == "" {
		host, _ := os.Hostname()
		o.ReplicaName = host + ":" + strconv.Itoa(os.Getpid())
	}
	if o.Ready == nil {
		o.Ready = func(context.Context) error { return nil }
	}
	return o
}

// positive sets *p to def unless it is above zero.
func positive[T int64 | time.Duration](p *T, def T) {
	if *p <= 0 {
		*p = def
	}
}

package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/prometheus/client_golang/prometheus"
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

// TenantCache opts a tenant into the response cache.
type TenantCache struct {
	TTL time.Duration
	// Models limits caching to these model names; nil means all.
	Models map[string]bool
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

// positive sets *p to def unless it is above zero.
func positive[T int64 | time.Duration](p *T, def T) {
	if *p <= 0 {
		*p = def
	}
}

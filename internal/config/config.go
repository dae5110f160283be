// Package config loads, defaults and validates llmgate's gateway configuration.
package config

import (
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/ratelimit"
)

// Errors returned by this package.
var (
	// ErrSyntax is matched by errors about YAML that cannot be read into a
	// Config: bad syntax, a value of the wrong type, an unknown or repeated
	// key. Their messages carry line numbers.
	ErrSyntax = errors.New("config: cannot parse")
	// ErrInvalid is matched by every problem Validate reports (each a
	// *FieldError).
	ErrInvalid = errors.New("config: invalid")
	// ErrSecret wraps failures to resolve a provider key, a tenant key or a
	// header reference from the environment or a file. Messages name the
	// variable or file, never its content.
	ErrSecret = errors.New("config: cannot resolve secret")
)

// HTTPServerNetHTTP is the one value http_server may have: net/http's
// server serves every request. "lean", the hand-written server of earlier
// versions, is gone and Validate says so.
const HTTPServerNetHTTP = "net/http"

// Defaults, applied by SetDefaults to every field left unset (see
// docs/config.md).
const (
	DefaultListen            = "127.0.0.1:8080"
	DefaultHTTPServer        = HTTPServerNetHTTP
	DefaultStore             = "memory"
	DefaultAdminTokenEnv     = "LLMGATE_ADMIN_TOKEN"
	DefaultMaxBodyBytes      = 8 * MiB
	DefaultMaxWait           = 30 * time.Second
	DefaultRequestTimeout    = 10 * time.Minute
	DefaultLogLevel          = "info"
	DefaultLogFormat         = "text"
	DefaultMaxAttempts       = 3
	DefaultBackoffBase       = 200 * time.Millisecond
	DefaultBackoffMax        = 10 * time.Second
	DefaultBreakerFailures   = 5
	DefaultBreakerOpenFor    = 30 * time.Second
	DefaultTimeoutFloor      = 10 * time.Second
	DefaultTimeoutCeiling    = 300 * time.Second
	DefaultTimeoutMultiplier = 4.0
	DefaultIdleTimeout       = 120 * time.Second
	// The client-facing server's bounds (server:).
	DefaultReadHeaderTimeout  = 10 * time.Second
	DefaultBodyTimeout        = 60 * time.Second
	DefaultWriteTimeout       = 60 * time.Second
	DefaultStreamWriteTimeout = 60 * time.Second
	DefaultServerIdleTimeout  = 2 * time.Minute
	DefaultMaxConnections     = 4096
	// Shutdown (server:): how long /readyz fails before the listener
	// closes, then how long requests in flight may finish.
	DefaultDrainDelay    = 5 * time.Second
	DefaultShutdownGrace = 30 * time.Second
	// The upstream transport's bounds (upstream:).
	DefaultMaxConnsPerHost        = 1024
	DefaultMaxResponseHeaderBytes = 10 * MiB
	DefaultDialTimeout            = 30 * time.Second
	DefaultTLSHandshakeTimeout    = 10 * time.Second
	// DefaultReservationTTL is short because running requests renew their
	// holds (every third of it): a crashed replica's holds are charged
	// within it.
	DefaultReservationTTL = 30 * time.Second
	// DefaultOpenAIBaseURL is the base URL of the provider Default builds
	// when OPENAI_API_KEY is set.
	DefaultOpenAIBaseURL = "https://api.openai.com/v1"
)

// Bounds on what a configuration may hold.
const (
	// MaxFileBytes bounds a configuration file: a larger one is certainly
	// not a configuration, and refusing it early keeps memory bounded.
	MaxFileBytes = 4 << 20
	// MaxAttempts bounds upstream.max_attempts: more attempts against a
	// failing provider only multiply its load.
	MaxAttempts = 10
	// MaxNameLen bounds provider and tenant names (they become metric
	// labels and store keys).
	MaxNameLen = 64
	// MaxLimit bounds every limit: the stores compute in double precision,
	// exact up to this value (ratelimit.MaxAmount).
	MaxLimit = ratelimit.MaxAmount
	// MaxDrainDelay and MaxShutdownGrace bound the shutdown's waits: a
	// load balancer notices a failing /readyz within seconds, and an
	// orchestrator kills a process that takes longer than its own grace
	// (Kubernetes: terminationGracePeriodSeconds).
	MaxDrainDelay    = 5 * time.Minute
	MaxShutdownGrace = time.Hour
)

// Environment variables that override the file (see docs/config.md).
const (
	EnvListen     = "LLMGATE_LISTEN"
	EnvHTTPServer = "LLMGATE_HTTP_SERVER"
	EnvStore      = "LLMGATE_STORE"
	EnvCacheStore = "LLMGATE_CACHE_STORE"
	EnvStateDir   = "LLMGATE_STATE_DIR"
	EnvMaxWait    = "LLMGATE_MAX_WAIT"
	EnvLogLevel   = "LLMGATE_LOG_LEVEL"
	// EnvOpenAIKey selects Default's provider.
	EnvOpenAIKey = "OPENAI_API_KEY"
)

// Values of Config.Source for a configuration built by Default.
const (
	// SourceDefaultOpenAI: no file; OPENAI_API_KEY is set, so one provider
	// "openai" reaches api.openai.com with it.
	SourceDefaultOpenAI = "default:openai"
	// SourceDefaultSimulated: no file and no OPENAI_API_KEY, so one
	// in-process simulated provider "sim" serves the simulator's models.
	SourceDefaultSimulated = "default:simulated"
)

// Provider types.
const (
	// TypeOpenAI is any OpenAI-compatible HTTP API.
	TypeOpenAI = "openai"
	// TypeSimulated is the built-in simulated provider (internal/sim), run
	// in-process.
	TypeSimulated = "simulated"
	// TypeAnthropic is Anthropic's API: x-api-key, anthropic-version,
	// POST /v1/messages.
	TypeAnthropic = "anthropic"
	// TypeAzure is Azure OpenAI: api-key, deployment URLs, api-version.
	TypeAzure = "azure"
)

// DefaultAnthropicBaseURL is the base_url of a type anthropic provider
// that sets none.
const DefaultAnthropicBaseURL = "https://api.anthropic.com/v1"

// DefaultAnthropicVersion is the anthropic-version sent when the client
// sends none and api_version is not set.
const DefaultAnthropicVersion = "2023-06-01"

// Tenant priorities.
const (
	PriorityInteractive = "interactive"
	PriorityBatch       = "batch"
)

// Config is the gateway's configuration. Get one from Load, Parse or
// Default, which fill defaults and validate; a Config built in Go should go
// through SetDefaults and Validate before use.
type Config struct {
	// Listen is the gateway's host:port. Default "127.0.0.1:8080"; env
	// LLMGATE_LISTEN.
	Listen string `yaml:"listen"`
	// HTTPServer may only be "net/http" (the default), kept so that older
	// files still load. Env LLMGATE_HTTP_SERVER.
	HTTPServer string `yaml:"http_server"`
	// Server bounds what one client connection may hold: time, and the
	// number of connections. It also turns on TLS.
	Server Server `yaml:"server"`
	// Store is "memory" (default: one process) or a redis://, rediss:// or
	// unix:// URL shared by every replica; env LLMGATE_STORE.
	Store string `yaml:"store"`
	// StateDir is where the memory store persists budgets and usage.
	// Default $XDG_STATE_HOME/llmgate, else ~/.local/state/llmgate; env
	// LLMGATE_STATE_DIR. A relative path in a file loaded by Load is
	// relative to the file's directory.
	StateDir string `yaml:"state_dir"`
	// AdminTokenEnv names the environment variable holding the admin API
	// token. Default "LLMGATE_ADMIN_TOKEN"; the admin API is off when that
	// variable is empty.
	AdminTokenEnv string `yaml:"admin_token_env"`
	// MetricsTokenEnv names the environment variable holding the token
	// that GET /metrics requires as a bearer token. Empty (the default):
	// /metrics is open to anyone who reaches the listener.
	MetricsTokenEnv string `yaml:"metrics_token_env"`
	// MaxBodyBytes is the largest request body accepted. Default 8 MiB.
	MaxBodyBytes Size `yaml:"max_body_bytes"`
	// MaxWait is how long a request may wait for admission before it gets
	// a 429. Default 30s; 0 means never wait. Env LLMGATE_MAX_WAIT.
	MaxWait time.Duration `yaml:"max_wait"`
	// RequestTimeout is the overall deadline of one request, waiting and
	// retries included. Default 10m.
	RequestTimeout time.Duration `yaml:"request_timeout"`
	// Log configures the gateway's logs.
	Log Log `yaml:"log"`
	// Upstream configures calls to providers.
	Upstream Upstream `yaml:"upstream"`
	// Providers are the upstream APIs. At least one is required.
	Providers []Provider `yaml:"providers"`
	// Models are aliases: names clients send that route to a list of
	// provider/model targets.
	Models []Alias `yaml:"models"`
	// Tenants are the clients allowed in, each with its own key. None
	// means open access, which is only allowed on a loopback Listen.
	Tenants []Tenant `yaml:"tenants"`
	// Prices is the price table, per model. After loading it holds the
	// configured prices merged over budget.DefaultPrices().
	Prices map[string]budget.Price `yaml:"prices"`
	// Budget configures how budgets behave when the store fails.
	Budget BudgetStore `yaml:"budget"`
	// RateLimit configures how rate limits behave when the store fails.
	RateLimit RateLimitStore `yaml:"ratelimit"`
	// Sessions configures conversation ordering.
	Sessions Sessions `yaml:"sessions"`
	// Dedup configures de-duplication of identical requests.
	Dedup Dedup `yaml:"dedup"`
	// Cache configures the response cache (tenants opt in).
	Cache Cache `yaml:"cache"`
	// Tracing exports OpenTelemetry spans over OTLP; off by default.
	Tracing Tracing `yaml:"tracing"`
	// PassThrough says where the routes without a model go.
	PassThrough PassThrough `yaml:"passthrough"`

	// Source says where the configuration came from: the file's path or
	// name for Load and Parse, SourceDefaultOpenAI or
	// SourceDefaultSimulated for Default.
	Source string `yaml:"-"`

	// envProblems are environment overrides that could not be applied;
	// Validate reports them.
	envProblems []error
	// fromEnv maps the YAML path of a setting taken from the environment
	// to the variable's name, so that messages point at the right place.
	fromEnv map[string]string
}

// Log configures logging.
type Log struct {
	// Level is debug, info (default), warn or error. Env LLMGATE_LOG_LEVEL.
	Level string `yaml:"level"`
	// Format is text (default) or json.
	Format string `yaml:"format"`
	// Access logs one line per request at info (tenant, model,
	// deployment, status, tokens, cost, waits). Default true.
	Access *bool `yaml:"access"`
}

// Tracing configures OpenTelemetry tracing.
type Tracing struct {
	// OTLPEndpoint is the OTLP/HTTP collector's base URL, e.g.
	// http://otel-collector:4318 (spans go to /v1/traces). Empty: off.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// SampleRatio is the fraction of requests traced that did not come
	// with a sampling decision (a client's traceparent is followed).
	// Default 1.
	SampleRatio *float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name of the spans. Default llmgate.
	ServiceName string `yaml:"service_name"`
}

// On reports whether spans are exported.
func (t Tracing) On() bool { return t.OTLPEndpoint != "" }

// Ratio is SampleRatio or its default.
func (t Tracing) Ratio() float64 {
	if t.SampleRatio == nil {
		return 1
	}
	return *t.SampleRatio
}

// AccessOn reports whether requests are logged one line each.
func (l Log) AccessOn() bool { return l.Access == nil || *l.Access }

// SlogLevel returns Level as a slog.Level (info for an unknown level;
// Validate rejects those).
func (l Log) SlogLevel() slog.Level {
	switch l.Level {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Upstream configures calls to providers: retries, circuit breaker and
// timeouts.
type Upstream struct {
	// MaxAttempts is the number of attempts per target. Default 3; 1 means
	// no retry.
	MaxAttempts int `yaml:"max_attempts"`
	// BackoffBase is the first retry's backoff ceiling; it doubles per
	// attempt (full jitter). Default 200ms.
	BackoffBase time.Duration `yaml:"backoff_base"`
	// BackoffMax caps the backoff. Default 10s.
	BackoffMax time.Duration `yaml:"backoff_max"`
	// Breaker is the per-deployment circuit breaker.
	Breaker Breaker `yaml:"breaker"`
	// Timeout bounds the wait for response headers.
	Timeout Timeout `yaml:"timeout"`
	// IdleTimeout is the longest gap allowed between two bytes of a
	// response body (stream). Default 120s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConnsPerHost bounds the connections to one provider host, idle or
	// busy: a burst waits for a free connection instead of opening one TLS
	// handshake per request. HTTP/2 carries many requests per connection.
	// Default 1024.
	MaxConnsPerHost int `yaml:"max_conns_per_host"`
	// MaxResponseHeaderBytes bounds a provider answer's headers, 1xx
	// answers included; more is a 502. Default 10MiB, as net/http's.
	MaxResponseHeaderBytes Size `yaml:"max_response_header_bytes"`
	// DialTimeout and TLSHandshakeTimeout bound opening a connection to a
	// provider. Defaults 30s and 10s.
	DialTimeout         time.Duration `yaml:"dial_timeout"`
	TLSHandshakeTimeout time.Duration `yaml:"tls_handshake_timeout"`
}

// Server configures the client-facing HTTP server (net/http's).
type Server struct {
	// TLSCertFile and TLSKeyFile are a PEM certificate chain and its key.
	// With both set the listener serves HTTPS, with HTTP/2; without, plain
	// HTTP/1.1.
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// ReadHeaderTimeout bounds the reading of a request's headers.
	// Default 10s.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// BodyTimeout bounds the reading of a request's body, from the moment
	// the gateway starts to read it. Default 60s.
	BodyTimeout time.Duration `yaml:"body_timeout"`
	// WriteTimeout bounds the writing of a non-streamed answer to a client
	// that does not read it. Default 60s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// StreamWriteTimeout bounds the writing of one event of a stream: a
	// client that takes nothing for this long is cut. Default 60s.
	StreamWriteTimeout time.Duration `yaml:"stream_write_timeout"`
	// IdleTimeout closes a keep-alive connection that sends no request for
	// this long. Default 2m.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConnections bounds the open client connections; one more is
	// answered 503 and closed (closed at once over TLS). Default 4096.
	MaxConnections int `yaml:"max_connections"`
	// DrainDelay is how long, after SIGTERM, /readyz answers 503 while the
	// listener still accepts requests, so that load balancers stop
	// sending before it closes. 0: close at once. Default 5s.
	DrainDelay time.Duration `yaml:"drain_delay"`
	// ShutdownGrace is how long requests in flight may finish once the
	// listener is closed; those still running are then cut and charged
	// what they used. 0: cut at once. Default 30s.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
}

// TLS reports whether the server is configured for HTTPS.
func (s Server) TLS() bool { return s.TLSCertFile != "" || s.TLSKeyFile != "" }

// Breaker is a circuit breaker per deployment.
type Breaker struct {
	// Failures is the number of consecutive failures that opens the
	// breaker. Default 5.
	Failures int `yaml:"failures"`
	// OpenFor is how long an open breaker refuses calls before it lets one
	// probe through. Default 30s.
	OpenFor time.Duration `yaml:"open_for"`
}

// Timeout is the adaptive time-to-headers timeout: clamp(Multiplier × the
// deployment's recent p95, Floor, Ceiling).
type Timeout struct {
	// Floor is the shortest timeout. Default 10s.
	Floor time.Duration `yaml:"floor"`
	// Ceiling is the longest timeout, used while there is no latency
	// history. Default 300s.
	Ceiling time.Duration `yaml:"ceiling"`
	// Multiplier scales the recent p95 latency. Default 4.
	Multiplier float64 `yaml:"multiplier"`
}

// Provider is one upstream API and the models it serves.
type Provider struct {
	// Name identifies the provider: lowercase letters, digits, '.', '_' and
	// '-'. Required, unique.
	Name string `yaml:"name"`
	// Type is TypeOpenAI (default), TypeAnthropic, TypeAzure or
	// TypeSimulated.
	Type string `yaml:"type"`
	// BaseURL is the API's base, e.g. https://api.openai.com/v1 (trailing
	// slashes removed). Required for type openai; not allowed for
	// simulated.
	BaseURL string `yaml:"base_url"`
	// APIKeyEnv names the environment variable holding the API key.
	APIKeyEnv string `yaml:"api_key_env"`
	// APIKeyEnvs names several variables, one key each: every key gets its
	// own deployment of every model (its own quota).
	APIKeyEnvs []string `yaml:"api_key_envs"`
	// APIKeyFile is a file holding the key (surrounding white space
	// trimmed). A relative path in a file loaded by Load is relative to
	// the file's directory.
	APIKeyFile string `yaml:"api_key_file"`
	// Models are the model ids the provider serves, as it names them.
	// Required.
	Models []string `yaml:"models"`
	// Limits is the provider's quota for one key, applied to each model
	// separately (as OpenAI does).
	Limits Limits `yaml:"limits"`
	// ModelLimits overrides Limits per model: the fields written there
	// replace those of Limits.
	ModelLimits map[string]Limits `yaml:"model_limits"`
	// Headers are extra headers sent upstream (e.g. OpenAI-Organization).
	// "${NAME}" in a value is replaced by the environment variable NAME.
	Headers map[string]string `yaml:"headers"`
	// APIVersion is the anthropic-version header for type anthropic
	// (default DefaultAnthropicVersion; a client's own wins), and the
	// api-version query parameter for type azure (required).
	APIVersion string `yaml:"api_version"`
	// Deployments maps a model to its Azure deployment name (type azure);
	// a model not listed is deployed under its own name.
	Deployments map[string]string `yaml:"deployments"`
	// Simulated configures a TypeSimulated provider.
	Simulated SimulatedProvider `yaml:"simulated"`
}

// AzureDeployment is the Azure deployment name model is served under.
func (p *Provider) AzureDeployment(model string) string {
	if d := p.Deployments[model]; d != "" {
		return d
	}
	return model
}

// SimulatedProvider is what the in-process simulated provider enforces and
// how it behaves (see internal/sim.Config and docs/mock.md). These are the
// simulated upstream's own limits, distinct from Provider.Limits, which is
// what the gateway believes the quota to be.
type SimulatedProvider struct {
	RPM         int64         `yaml:"rpm"`         // per (key, model); 0 = no limit
	TPM         int64         `yaml:"tpm"`         // per (key, model); 0 = no limit
	Concurrency int64         `yaml:"concurrency"` // per key; 0 = no limit
	ITPM        int64         `yaml:"itpm"`        // input tokens per (key, model) on /v1/messages; 0 = no limit
	OTPM        int64         `yaml:"otpm"`        // output tokens per (key, model) on /v1/messages; 0 = no limit
	TTFT        time.Duration `yaml:"ttft"`        // time to first token
	TokenDelay  time.Duration `yaml:"token_delay"` // between completion tokens
	Jitter      float64       `yaml:"jitter"`      // delays scaled by a random factor in [1-j, 1+j]
	ErrorRate   float64       `yaml:"error_rate"`  // fraction of requests answered 500/503
	DropRate    float64       `yaml:"drop_rate"`   // fraction of streams cut halfway
	Seed        uint64        `yaml:"seed"`        // 0 = random
}

// SimConfig returns the internal/sim configuration of a TypeSimulated
// provider: its models (ids containing "embedding" served on
// /v1/embeddings, the others on /v1/chat/completions) and its simulated
// settings. Any API key is accepted.
func (p *Provider) SimConfig() sim.Config {
	var chat, emb []string
	for _, m := range p.Models {
		if strings.Contains(m, "embedding") {
			emb = append(emb, m)
		} else {
			chat = append(chat, m)
		}
	}
	s := p.Simulated
	return sim.Config{
		Models: chat, EmbeddingModels: emb,
		RPM: s.RPM, TPM: s.TPM, Concurrency: s.Concurrency, ITPM: s.ITPM, OTPM: s.OTPM,
		TTFT: s.TTFT, TokenDelay: s.TokenDelay, Jitter: s.Jitter,
		ErrorRate: s.ErrorRate, DropRate: s.DropRate, Seed: s.Seed,
	}
}

// PassThrough configures the routes passed to a provider as they are
// (files, batches, and unknown /v1/ routes, which carry no model).
type PassThrough struct {
	// Provider names the provider (type openai or simulated) whose first
	// deployment takes them. Default: the first such provider.
	Provider string `yaml:"provider"`
	// UnknownRoutes is UnknownNotFound (default: a 404 in OpenAI's shape)
	// or UnknownPass (passed to that provider).
	UnknownRoutes string `yaml:"unknown_routes"`
}

// PassThrough.UnknownRoutes values.
const (
	UnknownNotFound = "not_found"
	UnknownPass     = "pass"
)

// Alias is a model name clients send that routes to provider/model targets.
type Alias struct {
	// Name is what clients send as "model".
	Name string `yaml:"name"`
	// Targets are "provider/model" strings (the model must be in that
	// provider's models), tried in order: later ones are fallbacks.
	Targets []string `yaml:"targets"`
}

// Tenant is one client of the gateway, known by its key.
type Tenant struct {
	// Name identifies the tenant in limits, budgets, logs and metrics.
	Name string `yaml:"name"`
	// APIKeyEnv names the environment variable holding the tenant's key.
	// Exactly one of APIKeyEnv and APIKeySHA256 is required.
	APIKeyEnv string `yaml:"api_key_env"`
	// APIKeySHA256 is the hex SHA-256 of the tenant's key, so that the
	// file holds no secret.
	APIKeySHA256 string `yaml:"api_key_sha256"`
	// Models are the model names (aliases, models, provider/model) the
	// tenant may use; empty means all.
	Models []string `yaml:"models"`
	// Limits apply to all of the tenant's requests together.
	Limits Limits `yaml:"limits"`
	// ModelLimits apply to the tenant's requests for one model name (as
	// the client sends it), in addition to Limits.
	ModelLimits map[string]Limits `yaml:"model_limits"`
	// Budget caps the tenant's spend per period; nil means none.
	Budget *TenantBudget `yaml:"budget"`
	// Priority is interactive (default) or batch: batch requests wait
	// behind interactive ones.
	Priority string `yaml:"priority"`
	// MaxWait overrides Config.MaxWait for this tenant.
	MaxWait *time.Duration `yaml:"max_wait"`
	// Cache opts the tenant into the response cache; nil means off.
	Cache *TenantCache `yaml:"cache"`
	// Dedup de-duplicates all of the tenant's requests, whatever their
	// temperature (opt-in: identical requests then get identical answers).
	Dedup bool `yaml:"dedup"`
}

// TenantCache opts a tenant into the response cache.
type TenantCache struct {
	// TTL is how long answers are kept. Required (> 0).
	TTL time.Duration `yaml:"ttl"`
	// Models limits caching to these model names; empty means all.
	Models []string `yaml:"models"`
}

// TenantBudget is a tenant's spending cap per calendar period.
type TenantBudget struct {
	// Period is day or month. Required.
	Period string `yaml:"period"`
	// USD caps cost per period, in US dollars; 0 = no money cap.
	USD float64 `yaml:"usd"`
	// Tokens caps prompt plus completion tokens per period; 0 = no token
	// cap.
	Tokens int64 `yaml:"tokens"`
	// Timezone is the IANA zone periods start in (midnight, the 1st).
	// Default UTC.
	Timezone string `yaml:"timezone"`
}

// BudgetStore is how budgets behave when the store cannot be reached.
type BudgetStore struct {
	// FailOpen admits requests without a budget check while the store is
	// down. Default false: refuse them (fail-closed).
	FailOpen bool `yaml:"fail_open"`
	// ReservationTTL is how long a reservation lives without renewal:
	// running requests renew their holds every third of it, so an expired
	// hold is one whose replica crashed (or lost the store for that long),
	// and it is charged, not freed (see docs/budget.md). Default 30s; at
	// least 1s.
	ReservationTTL time.Duration `yaml:"reservation_ttl"`
	// AckReplicas makes every budget write on a Redis store wait until
	// this many replicas have it (WAIT), and fail closed when they do
	// not: spend a failover would lose is refused instead (see
	// docs/failover.md). Default 0: do not wait. Set it to the number of
	// replicas of each master.
	AckReplicas int `yaml:"ack_replicas"`
}

// RateLimitStore is how rate limits behave when the store cannot be reached.
type RateLimitStore struct {
	// FailClosed refuses requests while the store is down. Default false:
	// admit them without a limit check (fail-open).
	FailClosed bool `yaml:"fail_closed"`
	// ReservationHold is how long an admitted request's reservation and
	// concurrency permit live without renewal (running requests renew
	// them): how long a crashed replica can pin capacity. Default
	// DefaultReservationHold.
	ReservationHold time.Duration `yaml:"reservation_hold"`
	// LocalQuota lets each replica admit most requests from blocks of
	// capacity reserved in a Redis store ahead of time, without a store
	// round trip per request (ratelimit.WithLocalQuota). Default true;
	// ignored with the memory store.
	LocalQuota *bool `yaml:"local_quota"`
	// LocalWindow is how long a block admits requests before its unused
	// part goes back: how long another replica's cooldown can go unnoticed.
	// Default DefaultLocalWindow.
	LocalWindow time.Duration `yaml:"local_window"`
	// SlowStart is how many requests each deployment may have in flight,
	// across replicas, until its provider has reported its limits (see
	// gateway.AdmissionOptions.SlowStart); 0 turns slow start off. Default
	// DefaultSlowStart.
	SlowStart *int64 `yaml:"slow_start"`
}

// SlowStartWindow is the slow-start window (0: off).
func (r RateLimitStore) SlowStartWindow() int64 {
	if r.SlowStart == nil {
		return DefaultSlowStart
	}
	return *r.SlowStart
}

// LocalQuotaOn reports whether local quota blocks are on (the default).
func (r RateLimitStore) LocalQuotaOn() bool { return r.LocalQuota == nil || *r.LocalQuota }

// Defaults of the ratelimit section.
const (
	DefaultReservationHold = 10 * time.Second
	DefaultLocalWindow     = 100 * time.Millisecond
	DefaultSlowStart       = 4
)

// Sessions configures conversation ordering: requests carrying the same
// session id are served one at a time, in arrival order, across replicas.
type Sessions struct {
	// Header names the request header with the session id. Default
	// DefaultSessionHeader.
	Header string `yaml:"header"`
	// TTL is the session lease, renewed while a request runs: the longest a
	// dead replica can hold a session. Default DefaultSessionTTL.
	TTL time.Duration `yaml:"ttl"`
}

// Dedup configures de-duplication: identical requests in flight at once,
// on any replica, make one upstream call.
type Dedup struct {
	// Deterministic de-duplicates requests with temperature 0
	// automatically. Default true.
	Deterministic *bool `yaml:"deterministic"`
	// Models are de-duplicated whatever their temperature (opt-in).
	Models []string `yaml:"models"`
	// LeaseTTL is the leader's lease: how long followers wait for a dead
	// leader before one of them takes over. Default DefaultDedupLeaseTTL.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Retain is how long a finished automatic flight still answers late
	// arrivals. Default DefaultDedupRetain.
	Retain time.Duration `yaml:"retain"`
	// IdempotencyTTL is how long the answer to an Idempotency-Key is kept
	// for retries. Default DefaultIdempotencyTTL.
	IdempotencyTTL time.Duration `yaml:"idempotency_ttl"`
}

// DeterministicOn reports whether temperature-0 requests are de-duplicated.
func (d Dedup) DeterministicOn() bool { return d.Deterministic == nil || *d.Deterministic }

// Cache configures the response cache.
type Cache struct {
	// Store is where answers are kept: memory (each process its own) or
	// a Redis URL in the forms of the top-level store, a Redis of the
	// cache's own. Empty: the top-level store. Env LLMGATE_CACHE_STORE.
	Store string `yaml:"store"`
	// MaxBytes bounds the memory store's cache (least recently used
	// answers go first). Default DefaultCacheMaxBytes.
	MaxBytes Size `yaml:"max_bytes"`
	// MaxBytesPerTenant bounds one tenant's answers, in either store: its
	// least recently used (memory) or closest to expiry (Redis) go first.
	// Default DefaultCacheMaxBytesPerTenant.
	MaxBytesPerTenant Size `yaml:"max_bytes_per_tenant"`
	// MaxTTL caps the TTL a request may ask for with x-llmgate-cache-ttl.
	// Default DefaultCacheMaxTTL.
	MaxTTL time.Duration `yaml:"max_ttl"`
	// CacheLength also caches answers cut by finish_reason "length".
	CacheLength bool `yaml:"cache_length"`
}

// CacheSharesStore reports whether the response cache is kept on the
// top-level store: cache.store is empty or names the same store.
func (c *Config) CacheSharesStore() bool {
	return c.Cache.Store == "" || c.Cache.Store == c.Store || (storeurl.IsMemory(c.Cache.Store) && storeurl.IsMemory(c.Store))
}

// Dedup and cache defaults.
const (
	DefaultDedupLeaseTTL  = 10 * time.Second
	DefaultDedupRetain    = 10 * time.Second
	DefaultIdempotencyTTL = 24 * time.Hour
	DefaultCacheMaxBytes  = 256 << 20
	// DefaultCacheMaxBytesPerTenant is respcache.DefaultTenantBytes: a
	// tenant's largest answer is then 8 MiB, the Redis store's entry bound.
	DefaultCacheMaxBytesPerTenant = 64 << 20
	DefaultCacheMaxTTL            = 24 * time.Hour
)

// Session defaults.
const (
	DefaultSessionHeader = "x-session-id"
	DefaultSessionTTL    = 10 * time.Second
)

// Default returns the configuration used when no file is given, with the
// environment overrides applied and defaults filled. If OPENAI_API_KEY is
// set it has one provider "openai" (api.openai.com, that key, common models,
// no limits); otherwise one simulated provider "sim" serving the
// simulator's default models. Source says which. Call Validate: an
// override such as a non-loopback LLMGATE_LISTEN can make it invalid.
func Default(getenv func(string) string) *Config {
	getenv = orNoEnv(getenv)
	c := newConfig("")
	if getenv(EnvOpenAIKey) != "" {
		c.Source = SourceDefaultOpenAI
		c.Providers = []Provider{{
			Name:      "openai",
			Type:      TypeOpenAI,
			BaseURL:   DefaultOpenAIBaseURL,
			APIKeyEnv: EnvOpenAIKey,
			Models:    []string{"gpt-4.1", "gpt-4.1-mini", "gpt-4o", "gpt-4o-mini", "text-embedding-3-small"},
		}}
	} else {
		c.Source = SourceDefaultSimulated
		models := append(append([]string(nil), sim.DefaultModels...), sim.DefaultEmbeddingModels...)
		c.Providers = []Provider{{Name: "sim", Type: TypeSimulated, Models: models}}
	}
	c.applyEnv(getenv)
	c.SetDefaults(getenv)
	return c
}

// newConfig is an empty configuration with the defaults of the durations
// whose zero means something in place: MaxWait (never wait),
// Server.DrainDelay and Server.ShutdownGrace (do not wait). Decoding a
// file over it keeps them unless the file writes them.
func newConfig(source string) *Config {
	return &Config{
		MaxWait: DefaultMaxWait, Source: source,
		Server: Server{DrainDelay: DefaultDrainDelay, ShutdownGrace: DefaultShutdownGrace},
	}
}

// SetDefaults fills every unset field with its default; fields set to a
// value that Validate rejects are left alone. Zero means unset, except for
// MaxWait, Server.DrainDelay and Server.ShutdownGrace (zero means do not
// wait; Parse and Default start them at their defaults) and the booleans
// (false is their default). Prices becomes
// the configured prices merged over budget.DefaultPrices(). getenv (nil:
// none) supplies XDG_STATE_HOME and HOME for StateDir.
func (c *Config) SetDefaults(getenv func(string) string) {
	getenv = orNoEnv(getenv)
	setString(&c.Listen, DefaultListen)
	setString(&c.HTTPServer, DefaultHTTPServer)
	setString(&c.Store, DefaultStore)
	setString(&c.StateDir, defaultStateDir(getenv))
	setString(&c.AdminTokenEnv, DefaultAdminTokenEnv)
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	setDuration(&c.RequestTimeout, DefaultRequestTimeout)
	setString(&c.Log.Level, DefaultLogLevel)
	setString(&c.Log.Format, DefaultLogFormat)

	u := &c.Upstream
	if u.MaxAttempts == 0 {
		u.MaxAttempts = DefaultMaxAttempts
	}
	setDuration(&u.BackoffBase, DefaultBackoffBase)
	setDuration(&u.BackoffMax, DefaultBackoffMax)
	if u.Breaker.Failures == 0 {
		u.Breaker.Failures = DefaultBreakerFailures
	}
	setDuration(&u.Breaker.OpenFor, DefaultBreakerOpenFor)
	setDuration(&u.Timeout.Floor, DefaultTimeoutFloor)
	setDuration(&u.Timeout.Ceiling, DefaultTimeoutCeiling)
	if u.Timeout.Multiplier == 0 {
		u.Timeout.Multiplier = DefaultTimeoutMultiplier
	}
	setDuration(&u.IdleTimeout, DefaultIdleTimeout)
	if u.MaxConnsPerHost == 0 {
		u.MaxConnsPerHost = DefaultMaxConnsPerHost
	}
	if u.MaxResponseHeaderBytes == 0 {
		u.MaxResponseHeaderBytes = DefaultMaxResponseHeaderBytes
	}
	setDuration(&u.DialTimeout, DefaultDialTimeout)
	setDuration(&u.TLSHandshakeTimeout, DefaultTLSHandshakeTimeout)
	sv := &c.Server
	setDuration(&sv.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	setDuration(&sv.BodyTimeout, DefaultBodyTimeout)
	setDuration(&sv.WriteTimeout, DefaultWriteTimeout)
	setDuration(&sv.StreamWriteTimeout, DefaultStreamWriteTimeout)
	setDuration(&sv.IdleTimeout, DefaultServerIdleTimeout)
	if sv.MaxConnections == 0 {
		sv.MaxConnections = DefaultMaxConnections
	}
	setDuration(&c.Budget.ReservationTTL, DefaultReservationTTL)
	setString(&c.Sessions.Header, DefaultSessionHeader)
	setDuration(&c.RateLimit.ReservationHold, DefaultReservationHold)
	setDuration(&c.RateLimit.LocalWindow, DefaultLocalWindow)
	setDuration(&c.Dedup.LeaseTTL, DefaultDedupLeaseTTL)
	setDuration(&c.Dedup.Retain, DefaultDedupRetain)
	setDuration(&c.Dedup.IdempotencyTTL, DefaultIdempotencyTTL)
	if c.Cache.MaxBytes == 0 {
		c.Cache.MaxBytes = DefaultCacheMaxBytes
	}
	if c.Cache.MaxBytesPerTenant == 0 {
		c.Cache.MaxBytesPerTenant = DefaultCacheMaxBytesPerTenant
	}
	setDuration(&c.Cache.MaxTTL, DefaultCacheMaxTTL)
	setDuration(&c.Sessions.TTL, DefaultSessionTTL)
	setString(&c.PassThrough.UnknownRoutes, UnknownNotFound)

	for i := range c.Providers {
		p := &c.Providers[i]
		setString(&p.Type, TypeOpenAI)
		if p.Type == TypeAnthropic {
			setString(&p.BaseURL, DefaultAnthropicBaseURL)
			setString(&p.APIVersion, DefaultAnthropicVersion)
		}
		// The gateway appends "/chat/completions" and the like.
		p.BaseURL = strings.TrimRight(p.BaseURL, "/")
	}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		setString(&t.Priority, PriorityInteractive)
		// Hashes are compared in lowercase.
		t.APIKeySHA256 = strings.ToLower(t.APIKeySHA256)
		if t.Budget != nil {
			setString(&t.Budget.Timezone, "UTC")
		}
	}
	c.Prices = budget.DefaultPrices().Merge(c.Prices)
}

func setString(p *string, def string) {
	if *p == "" {
		*p = def
	}
}

func setDuration(p *time.Duration, def time.Duration) {
	if *p == 0 {
		*p = def
	}
}

// defaultStateDir follows the XDG base directory specification, which
// ignores a relative XDG_STATE_HOME. It returns "" when no home is known.
func defaultStateDir(getenv func(string) string) string {
	if d := getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "llmgate")
	}
	home := getenv("HOME")
	if home == "" {
		// HOME is unset under some service managers; os.UserHomeDir also
		// knows the Windows variable.
		home, _ = os.UserHomeDir()
	}
	if home == "" {
		return ""
	}
	return filepath.Join(home, ".local", "state", "llmgate")
}

// applyEnv applies the LLMGATE_* overrides. A value that cannot be used is
// kept in envProblems for Validate.
func (c *Config) applyEnv(getenv func(string) string) {
	for _, o := range []struct {
		env, path string
		dst       *string
	}{
		{EnvListen, "listen", &c.Listen},
		{EnvHTTPServer, "http_server", &c.HTTPServer},
		{EnvStore, "store", &c.Store},
		{EnvCacheStore, "cache.store", &c.Cache.Store},
		{EnvStateDir, "state_dir", &c.StateDir},
		{EnvLogLevel, "log.level", &c.Log.Level},
	} {
		if v := strings.TrimSpace(getenv(o.env)); v != "" {
			*o.dst = v
			c.noteEnv(o.path, o.env)
		}
	}
	if v := strings.TrimSpace(getenv(EnvMaxWait)); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			c.envProblems = append(c.envProblems, &FieldError{Path: EnvMaxWait,
				Msg: "is " + quote(v) + ", not a duration; write it like 30s or 1m, or 0 to answer 429 at once"})
		} else {
			c.MaxWait = d
			c.noteEnv("max_wait", EnvMaxWait)
		}
	}
}

func (c *Config) noteEnv(path, env string) {
	if c.fromEnv == nil {
		c.fromEnv = map[string]string{}
	}
	c.fromEnv[path] = env
}

// MaxWaitOr returns the tenant's MaxWait if it has one, else def (the
// gateway's Config.MaxWait).
func (t *Tenant) MaxWaitOr(def time.Duration) time.Duration {
	if t.MaxWait != nil {
		return *t.MaxWait
	}
	return def
}

// Allows reports whether the tenant may use model, a name as the client
// sends it (no Models means every model).
func (t *Tenant) Allows(model string) bool {
	if len(t.Models) == 0 {
		return true
	}
	for _, m := range t.Models {
		if m == model {
			return true
		}
	}
	return false
}

// RatePriority returns the tenant's priority for the rate limiter's queue.
func (t *Tenant) RatePriority() ratelimit.Priority {
	if t.Priority == PriorityBatch {
		return ratelimit.Batch
	}
	return ratelimit.Interactive
}

// Budget returns the budget.Budget of tenant for b, ready for
// budget.Manager.
func (b *TenantBudget) Budget(tenant string) (budget.Budget, error) {
	p, err := budget.ParsePeriod(b.Period)
	if err != nil {
		return budget.Budget{}, err
	}
	loc, err := loadLocation(b.Timezone)
	if err != nil {
		return budget.Budget{}, err
	}
	out := budget.Budget{Tenant: tenant, Period: p, Location: loc, Tokens: b.Tokens, MicroUSD: usdToMicro(b.USD)}
	return out, out.Validate()
}

// usdToMicro converts dollars to micro-dollars, saturating where Validate
// would reject the amount anyway.
func usdToMicro(usd float64) int64 {
	switch {
	case math.IsNaN(usd) || usd <= 0:
		return 0
	case usd >= float64(budget.MaxAmount)/1e6:
		return budget.MaxAmount + 1
	}
	return int64(math.Round(usd * 1e6))
}

// loadLocation is time.LoadLocation without "Local", whose meaning depends
// on each host: replicas must agree on when a period starts.
func loadLocation(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	if name == "Local" {
		return nil, errors.New(`"Local" depends on each host's setting; name the zone, e.g. Europe/Paris`)
	}
	return time.LoadLocation(name)
}

// orNoEnv lets callers pass a nil getenv for an empty environment.
func orNoEnv(getenv func(string) string) func(string) string {
	if getenv == nil {
		return func(string) string { return "" }
	}
	return getenv
}

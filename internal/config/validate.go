package config

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // budget time zones must load in minimal containers without /usr/share/zoneinfo
	"unicode"
	"unicode/utf8"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/storeurl"
)

// FieldError is one problem Validate found: the setting, by its YAML path,
// and what is wrong with it and what to do. It matches ErrInvalid.
type FieldError struct {
	// Path is the setting, e.g. "providers[1].limits.rpm", followed by
	// "(from LLMGATE_X)" when an environment variable set it; for an
	// override that could not be read, the variable's name.
	Path string
	// Msg says what is wrong and what to do.
	Msg string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

// Is makes every FieldError match ErrInvalid.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

var (
	reProviderName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	reTenantName   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]*$`)
	reEnvName      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	reSHA256       = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

// notEnvName is the message for a bad variable name. The value is not
// quoted: a common mistake is to paste the key itself there.
const notEnvName = "is not an environment variable name (letters, digits and _, not starting with a digit); write the variable's name, not its value"

// maxModelLen bounds model and alias names (budget.MaxNameLen: they key
// budget usage rows).
const maxModelLen = budget.MaxNameLen

// reservedHeaders may not be set in providers[].headers: llmgate sets them,
// or Go's HTTP client manages them.
var reservedHeaders = map[string]string{
	"authorization":       "set by llmgate from the provider's key; use api_key_env, api_key_envs or api_key_file",
	"host":                "taken from base_url; remove it",
	"content-length":      "set by the HTTP client; remove it",
	"content-type":        "set by llmgate; remove it",
	"transfer-encoding":   "set by the HTTP client; remove it",
	"connection":          "a hop-by-hop header managed by the HTTP client; remove it",
	"keep-alive":          "a hop-by-hop header managed by the HTTP client; remove it",
	"proxy-connection":    "a hop-by-hop header managed by the HTTP client; remove it",
	"proxy-authorization": "a hop-by-hop header managed by the HTTP client; remove it",
	"te":                  "a hop-by-hop header managed by the HTTP client; remove it",
	"trailer":             "a hop-by-hop header managed by the HTTP client; remove it",
	"upgrade":             "a hop-by-hop header managed by the HTTP client; remove it",
	"accept-encoding":     "managed by the HTTP client (it decompresses answers); remove it",
}

// Validate reports every problem at once (errors.Join of *FieldError), each
// naming the setting's YAML path and what to do. Call it after SetDefaults.
// When getenv is not nil, keys found in the environment are checked too:
// two tenants with one key, the admin token equal to a tenant key, a
// provider key with spaces inside. Variables that are not set are only
// warnings (Explain): check-config may run where the secrets are not.
func (c *Config) Validate(getenv func(string) string) error {
	if c == nil {
		return &FieldError{Path: "config", Msg: "is nil"}
	}
	v := &validator{c: c}
	v.errs = append(v.errs, c.envProblems...)
	v.top()
	v.upstream()
	v.providers()
	v.aliases()
	v.tenants()
	v.prices()
	v.tracing()
	v.passThrough()
	if getenv != nil {
		v.secrets(getenv)
	}
	return errors.Join(v.errs...)
}

type validator struct {
	c    *Config
	errs []error
}

func (v *validator) add(path, format string, args ...any) {
	if env := v.c.fromEnv[path]; env != "" {
		path += " (from " + env + ")"
	}
	for i, a := range args {
		if d, ok := a.(time.Duration); ok {
			args[i] = durationString(d) // "10m", as the file would say it
		}
	}
	v.errs = append(v.errs, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// redisURL checks the store URL at path, which is not memory.
func (v *validator) redisURL(path, s string) {
	// The URL may hold a password: only its redacted form is shown.
	_, err := storeurl.RedisOption(s)
	switch {
	case errors.Is(err, storeurl.ErrBadConnections):
		v.add(path, "%s: %v", quote(storeurl.Redact(s)), storeurl.ErrBadConnections)
	case errors.Is(err, storeurl.ErrSentinelAuth):
		v.add(path, "%s: %v", quote(storeurl.Redact(s)), storeurl.ErrSentinelAuth)
	case err != nil:
		v.add(path, "%s is neither memory nor a redis URL; write it like redis://[user:password@]host:6379[/db], rediss://... (TLS) or unix:///path/to/redis.sock", quote(storeurl.Redact(s)))
	}
}

func (v *validator) top() {
	c := v.c
	if host, port, err := net.SplitHostPort(c.Listen); err != nil || strings.ContainsAny(host, " /") {
		v.add("listen", "%s is not host:port; write it like 127.0.0.1:8080, or :8080 for every interface", quote(c.Listen))
	} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		v.add("listen", "port %s is not a number from 0 to 65535", quote(port))
	} else if len(c.Tenants) == 0 && !isLoopbackHost(host) {
		v.add("tenants", "none, and listen %s is not a loopback address: anyone who can reach it could spend your provider keys; add tenants (docs/config.md) or listen on 127.0.0.1", quote(c.Listen))
	}

	switch c.HTTPServer {
	case HTTPServerNetHTTP:
	case "lean":
		v.add("http_server", "lean, llmgate's own HTTP/1.1 server, was removed: net/http's serves every request now; delete the setting")
	default:
		v.add("http_server", "%s is not a server; net/http is the only one (delete the setting)", quote(c.HTTPServer))
	}
	v.server()

	switch {
	case c.Store == "":
		v.add("store", "is empty; use memory (one process) or a redis:// URL shared by every replica")
	case storeurl.IsMemory(c.Store):
		switch {
		case c.StateDir == "":
			v.add("state_dir", "has no default here (XDG_STATE_HOME and HOME are unset); set state_dir or %s to a directory where budgets and usage persist", EnvStateDir)
		case strings.HasPrefix(c.StateDir, "~"):
			v.add("state_dir", "%s starts with ~, which is not expanded here; write the full path", quote(c.StateDir))
		}
	default:
		v.redisURL("store", c.Store)
	}
	if s := c.Cache.Store; s != "" && !storeurl.IsMemory(s) {
		v.redisURL("cache.store", s)
	}
	if !reEnvName.MatchString(c.AdminTokenEnv) {
		v.add("admin_token_env", "%s", notEnvName)
	}
	if c.MaxBodyBytes <= 0 {
		v.add("max_body_bytes", "is %d; must be a positive size such as 8MiB", int64(c.MaxBodyBytes))
	}
	if c.MaxWait < 0 {
		v.add("max_wait", "is %v; must be >= 0 (0 = answer 429 at once instead of waiting)", c.MaxWait)
	}
	if c.RequestTimeout <= 0 {
		v.add("request_timeout", "is %v; must be > 0, e.g. 10m", c.RequestTimeout)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		v.add("log.level", "%s is not a level; use debug, info, warn or error", quote(c.Log.Level))
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		v.add("log.format", "%s is not a format; use text or json", quote(c.Log.Format))
	}
	if d := c.RateLimit.ReservationHold; d < 2*time.Second {
		v.add("ratelimit.reservation_hold", "is %v; must be at least 2s (running requests renew it every half), e.g. 10s", d)
	}
	if d := c.RateLimit.LocalWindow; d < 10*time.Millisecond || d > 10*time.Second {
		v.add("ratelimit.local_window", "is %v; must be between 10ms and 10s, e.g. 100ms", d)
	}
	if w := c.RateLimit.SlowStartWindow(); w < 0 || w > 1000 {
		v.add("ratelimit.slow_start", "is %d; must be between 0 (off) and 1000, e.g. 4", w)
	}
	if ttl := c.Sessions.TTL; ttl < time.Second {
		v.add("sessions.ttl", "is %v; must be at least 1s (the lease is renewed every third of it), e.g. 10s", ttl)
	}
	if h := c.Sessions.Header; !validHeaderName(h) {
		v.add("sessions.header", "%s is not a valid HTTP header name", quote(h))
	}
	if d := c.Dedup.LeaseTTL; d < time.Second {
		v.add("dedup.lease_ttl", "is %v; must be at least 1s, e.g. 10s", d)
	}
	if d := c.Dedup.Retain; d < 0 {
		v.add("dedup.retain", "is %v; must be >= 0", d)
	}
	if d := c.Dedup.IdempotencyTTL; d < time.Second {
		v.add("dedup.idempotency_ttl", "is %v; must be at least 1s, e.g. 24h", d)
	}
	if c.Cache.MaxBytes < 0 {
		v.add("cache.max_bytes", "must be >= 0")
	}
	if c.Cache.MaxBytesPerTenant < 0 {
		v.add("cache.max_bytes_per_tenant", "must be >= 0 (0: the default, %v)", Size(DefaultCacheMaxBytesPerTenant))
	}
	if d := c.Cache.MaxTTL; d < time.Second {
		v.add("cache.max_ttl", "is %v; must be at least 1s, e.g. 24h", d)
	}
	// No relation to request_timeout is needed: running requests renew
	// their holds, and a hold that expires anyway is charged, not freed,
	// so it never lets others overspend.
	if ttl := c.Budget.ReservationTTL; ttl < time.Second {
		v.add("budget.reservation_ttl", "is %v; must be at least 1s (running requests renew their holds every third of it), e.g. 30s", ttl)
	}
	switch n := c.Budget.AckReplicas; {
	case n < 0:
		v.add("budget.ack_replicas", "is %d; must be >= 0 (0: do not wait for replicas)", n)
	case n > 0 && storeurl.IsMemory(c.Store):
		v.add("budget.ack_replicas", "is %d, but the memory store has no replicas; use a redis store or remove it", n)
	}
}

func (v *validator) upstream() {
	u := v.c.Upstream
	if u.MaxAttempts < 1 || u.MaxAttempts > MaxAttempts {
		v.add("upstream.max_attempts", "is %d; must be from 1 (no retry) to %d", u.MaxAttempts, MaxAttempts)
	}
	if u.BackoffBase <= 0 {
		v.add("upstream.backoff_base", "is %v; must be > 0, e.g. 200ms", u.BackoffBase)
	}
	if u.BackoffMax < u.BackoffBase {
		v.add("upstream.backoff_max", "%v is less than upstream.backoff_base %v; raise it", u.BackoffMax, u.BackoffBase)
	}
	if u.Breaker.Failures < 1 {
		v.add("upstream.breaker.failures", "is %d; must be >= 1 (consecutive failures that open the breaker)", u.Breaker.Failures)
	}
	if u.Breaker.OpenFor <= 0 {
		v.add("upstream.breaker.open_for", "is %v; must be > 0, e.g. 30s", u.Breaker.OpenFor)
	}
	if u.Timeout.Floor <= 0 {
		v.add("upstream.timeout.floor", "is %v; must be > 0, e.g. 10s", u.Timeout.Floor)
	}
	if u.Timeout.Ceiling < u.Timeout.Floor {
		v.add("upstream.timeout.ceiling", "%v is less than upstream.timeout.floor %v; raise it", u.Timeout.Ceiling, u.Timeout.Floor)
	}
	if m := u.Timeout.Multiplier; !(m > 0 && m <= 100) { // also NaN
		v.add("upstream.timeout.multiplier", "is %v; must be a number above 0 and at most 100, e.g. 4", m)
	}
	if u.IdleTimeout <= 0 {
		v.add("upstream.idle_timeout", "is %v; must be > 0, e.g. 2m", u.IdleTimeout)
	}
	if u.MaxConnsPerHost < 0 {
		v.add("upstream.max_conns_per_host", "is %d; must be > 0, e.g. %d", u.MaxConnsPerHost, DefaultMaxConnsPerHost)
	}
	if u.MaxResponseHeaderBytes < 4*KiB || u.MaxResponseHeaderBytes > 1*GiB {
		v.add("upstream.max_response_header_bytes", "is %d bytes; use 4KiB to 1GiB, e.g. 10MiB", int64(u.MaxResponseHeaderBytes))
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"upstream.dial_timeout", u.DialTimeout}, {"upstream.tls_handshake_timeout", u.TLSHandshakeTimeout}} {
		if d.v < 0 {
			v.add(d.key, "is %v; must be > 0, e.g. 10s", d.v)
		}
	}
}

// server checks the client-facing server's settings.
func (v *validator) server() {
	s := v.c.Server
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"server.read_header_timeout", s.ReadHeaderTimeout}, {"server.body_timeout", s.BodyTimeout},
		{"server.write_timeout", s.WriteTimeout}, {"server.stream_write_timeout", s.StreamWriteTimeout},
		{"server.idle_timeout", s.IdleTimeout},
	} {
		if d.v < 0 {
			v.add(d.key, "is %v; must be > 0, e.g. 60s", d.v)
		}
	}
	if s.MaxConnections < 0 {
		v.add("server.max_connections", "is %d; must be > 0, e.g. %d", s.MaxConnections, DefaultMaxConnections)
	}
	for _, d := range []struct {
		key      string
		v, most  time.Duration
		zero, eg string
	}{
		{"server.drain_delay", s.DrainDelay, MaxDrainDelay, "close the listener at once", "5s"},
		{"server.shutdown_grace", s.ShutdownGrace, MaxShutdownGrace, "cut requests in flight at once", "30s"},
	} {
		if d.v < 0 || d.v > d.most {
			v.add(d.key, "is %v; use 0 (%s) to %v, e.g. %s", d.v, d.zero, d.most, d.eg)
		}
	}
	if (s.TLSCertFile == "") != (s.TLSKeyFile == "") {
		v.add("server.tls_cert_file", "and server.tls_key_file go together: set both for HTTPS, or neither")
	} else if s.TLS() {
		if _, err := tls.LoadX509KeyPair(s.TLSCertFile, s.TLSKeyFile); err != nil {
			v.add("server.tls_cert_file", "cannot be loaded with its key: %s", tlsProblem(err))
		}
	}
}

// tlsProblem says what is wrong with a certificate and key pair without
// quoting their content.
func tlsProblem(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + " " + pe.Path + ": " + pe.Err.Error()
	}
	return "the files are not a PEM certificate and its matching private key"
}

func (v *validator) providers() {
	c := v.c
	if len(c.Providers) == 0 {
		v.add("providers", "none; add at least one (docs/config.md), or start without a configuration file for the built-in default")
		return
	}
	byName := map[string]int{}
	for i := range c.Providers {
		p := &c.Providers[i]
		at := fmt.Sprintf("providers[%d]", i)
		v.name(at, "providers", i, p.Name, reProviderName, byName,
			"a short name such as openai, used in targets (openai/gpt-4o), limits and metrics",
			"lowercase letters, digits, '.', '_' or '-', starting with a letter or digit")
		switch p.Type {
		case TypeOpenAI, TypeAnthropic, TypeAzure:
			v.baseURL(at+".base_url", p.BaseURL)
			if p.Simulated != (SimulatedProvider{}) {
				v.add(at+".simulated", "only for type simulated; remove it, or set type: simulated")
			}
		case TypeSimulated:
			if p.BaseURL != "" {
				v.add(at+".base_url", "not used by type simulated, which runs inside the gateway; remove it")
			}
			v.simulated(at+".simulated", p.Simulated)
		default:
			v.add(at+".type", "%s is not a provider type; use openai (any OpenAI-compatible API), anthropic, azure (Azure OpenAI) or simulated (the built-in simulator)", quote(p.Type))
		}
		switch {
		case p.Type == TypeAzure && p.APIVersion == "":
			v.add(at+".api_version", "required for type azure: the api-version of your Azure OpenAI resource, e.g. 2024-10-21")
		case p.Type != TypeAzure && p.Type != TypeAnthropic && p.APIVersion != "":
			v.add(at+".api_version", "only for types anthropic and azure; remove it")
		case strings.ContainsAny(p.APIVersion, "\r\n\x00&#?/ "):
			v.add(at+".api_version", "%s is not a version (e.g. 2024-10-21)", quote(p.APIVersion))
		}
		if len(p.Deployments) > 0 && p.Type != TypeAzure {
			v.add(at+".deployments", "only for type azure; remove it")
		}
		for _, m := range slices.Sorted(maps.Keys(p.Deployments)) {
			if !slices.Contains(p.Models, m) {
				v.add(at+".deployments."+m, "%s is not in %s.models; add it there or remove this entry", quote(m), at)
			}
			if d := p.Deployments[m]; d == "" || strings.ContainsAny(d, "/?#\r\n\x00") {
				v.add(at+".deployments."+m, "%s is not an Azure deployment name", quote(d))
			}
		}
		v.providerKeys(at, p)

		if len(p.Models) == 0 {
			v.add(at+".models", "required: list the model ids this provider serves, as it names them (e.g. gpt-4o)")
		}
		models := map[string]int{}
		for j, m := range p.Models {
			mp := fmt.Sprintf("%s.models[%d]", at, j)
			if msg := checkModelName(m); msg != "" {
				v.add(mp, "%s", msg)
			} else if k, dup := models[m]; dup {
				v.add(mp, "%s is already models[%d]; list each model once", quote(m), k)
			} else {
				models[m] = j
			}
		}
		v.limits(at+".limits", p.Limits)
		for _, m := range slices.Sorted(maps.Keys(p.ModelLimits)) {
			mp := at + ".model_limits." + m
			if _, ok := models[m]; !ok {
				v.add(mp, "%s is not in %s.models; add it there or remove this entry", quote(m), at)
			}
			v.limits(mp, p.ModelLimits[m])
		}
		for _, h := range slices.Sorted(maps.Keys(p.Headers)) {
			hp := at + ".headers." + h
			val := p.Headers[h]
			switch {
			case !validHeaderName(h):
				v.add(hp, "%s is not a valid header name (letters, digits and !#$%%&'*+-.^_`|~)", quote(h))
			case reservedHeaders[strings.ToLower(h)] != "":
				v.add(hp, "%s", reservedHeaders[strings.ToLower(h)])
			}
			if strings.ContainsAny(val, "\r\n\x00") {
				v.add(hp, "contains a line break or NUL; a header value is one line")
			}
			if _, err := headerRefs(val); err != nil {
				v.add(hp, "%v", err)
			}
		}
	}
}

func (v *validator) tracing() {
	t := v.c.Tracing
	if t.OTLPEndpoint != "" {
		u, err := url.Parse(t.OTLPEndpoint)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "":
			v.add("tracing.otlp_endpoint", "%s is not an http:// or https:// URL; write it like http://otel-collector:4318", quote(storeurl.Redact(t.OTLPEndpoint)))
		case u.User != nil:
			v.add("tracing.otlp_endpoint", "holds a user name or password; remove it")
		case u.RawQuery != "" || u.Fragment != "":
			v.add("tracing.otlp_endpoint", "has a query or fragment; give only the scheme, host and path")
		}
	}
	if r := t.SampleRatio; r != nil && !(*r >= 0 && *r <= 1) {
		v.add("tracing.sample_ratio", "is %v; want a fraction from 0 to 1", *r)
	}
	if len(t.ServiceName) > 100 {
		v.add("tracing.service_name", "is %d characters long; at most 100", len(t.ServiceName))
	}
}

func (v *validator) baseURL(path, s string) {
	if s == "" {
		v.add(path, "required for type openai: the API's base URL, e.g. https://api.openai.com/v1")
		return
	}
	u, err := url.Parse(s)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "":
		// Redact: a URL with a password in it must not reach the logs.
		v.add(path, "%s is not an http:// or https:// URL; write it like https://api.openai.com/v1", quote(storeurl.Redact(s)))
	case u.User != nil:
		v.add(path, "holds a user name or password; remove it and give the key with api_key_env, api_key_envs or api_key_file")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		v.add(path, "has a query or fragment; give only the scheme, host and path, e.g. https://api.openai.com/v1")
	}
}

func (v *validator) simulated(path string, s SimulatedProvider) {
	for _, f := range []struct {
		key string
		n   int64
	}{{"rpm", s.RPM}, {"tpm", s.TPM}, {"concurrency", s.Concurrency}, {"itpm", s.ITPM}, {"otpm", s.OTPM}} {
		if f.n < 0 {
			v.add(path+"."+f.key, "is %d; must be >= 0 (0 = no limit)", f.n)
		}
	}
	if s.TTFT < 0 {
		v.add(path+".ttft", "is %v; must be >= 0", s.TTFT)
	}
	if s.TokenDelay < 0 {
		v.add(path+".token_delay", "is %v; must be >= 0", s.TokenDelay)
	}
	for _, f := range []struct {
		key string
		x   float64
	}{{"jitter", s.Jitter}, {"error_rate", s.ErrorRate}, {"drop_rate", s.DropRate}} {
		if !(f.x >= 0 && f.x <= 1) { // also NaN
			v.add(path+"."+f.key, "is %v; must be a fraction from 0 to 1 (0.05 = 5%%)", f.x)
		}
	}
}

func (v *validator) providerKeys(at string, p *Provider) {
	n := 0
	for _, set := range []bool{p.APIKeyEnv != "", len(p.APIKeyEnvs) > 0, p.APIKeyFile != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		v.add(at, "set only one of api_key_env, api_key_envs and api_key_file")
	}
	if p.APIKeyEnv != "" && !reEnvName.MatchString(p.APIKeyEnv) {
		v.add(at+".api_key_env", "%s", notEnvName)
	}
	seen := map[string]int{}
	for j, e := range p.APIKeyEnvs {
		ep := fmt.Sprintf("%s.api_key_envs[%d]", at, j)
		if !reEnvName.MatchString(e) {
			v.add(ep, "%s", notEnvName)
		} else if k, dup := seen[e]; dup {
			v.add(ep, "%s is already api_key_envs[%d]; each key is listed once", quote(e), k)
		} else {
			seen[e] = j
		}
	}
	if strings.HasPrefix(p.APIKeyFile, "~") {
		v.add(at+".api_key_file", "%s starts with ~, which is not expanded here; write the full path", quote(p.APIKeyFile))
	}
}

func (v *validator) limits(path string, l Limits) {
	for _, k := range limitKeys {
		switch n := *k.get(&l); {
		case n < 0:
			v.add(path+"."+k.key, "is %d; must be >= 0 (0 = no limit)", n)
		case n > MaxLimit:
			v.add(path+"."+k.key, "is %d, above the maximum %d", n, int64(MaxLimit))
		}
	}
}

func (v *validator) passThrough() {
	pt := v.c.PassThrough
	switch pt.UnknownRoutes {
	case UnknownNotFound, UnknownPass:
	default:
		v.add("passthrough.unknown_routes", "%s: use not_found (a 404 in OpenAI's shape) or pass (to passthrough.provider)", quote(pt.UnknownRoutes))
	}
	if pt.Provider == "" {
		return
	}
	for _, p := range v.c.Providers {
		if p.Name == pt.Provider {
			if p.Type != TypeOpenAI && p.Type != TypeSimulated {
				v.add("passthrough.provider", "%s is of type %s; routes without a model go to a provider of type openai or simulated", quote(p.Name), p.Type)
			}
			return
		}
	}
	v.add("passthrough.provider", "there is no provider named %s", quote(pt.Provider))
}

// providerOnly refuses the limits only a provider's quota has: a tenant's
// tokens are limited with tpm.
func (v *validator) providerOnly(path string, l Limits) {
	if l.ITPM != 0 {
		v.add(path+".itpm", "only for providers (Anthropic's input tokens per minute); limit a tenant's tokens with tpm")
	}
	if l.OTPM != 0 {
		v.add(path+".otpm", "only for providers (Anthropic's output tokens per minute); limit a tenant's tokens with tpm")
	}
}

func (v *validator) aliases() {
	c := v.c
	byName := map[string]int{}
	for i, a := range c.Models {
		at := fmt.Sprintf("models[%d]", i)
		if msg := checkModelName(a.Name); msg != "" {
			v.add(at+".name", "%s", msg)
		} else if j, dup := byName[a.Name]; dup {
			v.add(at+".name", "%s is already models[%d]; alias names must be unique", quote(a.Name), j)
		} else {
			byName[a.Name] = i
			if prov, _, ok := strings.Cut(a.Name, "/"); ok && c.providerIndex(prov) >= 0 {
				v.add(at+".name", "%s starts with the provider name %s/ and would hide direct provider/model targets; choose another name", quote(a.Name), prov)
			}
		}
		if len(a.Targets) == 0 {
			v.add(at+".targets", "required: list provider/model targets, tried in order, e.g. [openai/gpt-4o, backup/gpt-4o]")
		}
		seen := map[string]int{}
		for j, t := range a.Targets {
			tp := fmt.Sprintf("%s.targets[%d]", at, j)
			if msg := c.checkTarget(t); msg != "" {
				v.add(tp, "%s", msg)
			} else if k, dup := seen[t]; dup {
				v.add(tp, "%s is already targets[%d]; list each target once", quote(t), k)
			} else {
				seen[t] = j
			}
		}
	}
}

// checkTarget says what is wrong with a "provider/model" target.
func (c *Config) checkTarget(t string) string {
	prov, model, ok := strings.Cut(t, "/")
	if !ok || prov == "" || model == "" {
		return quote(t) + " is not provider/model; write it like openai/gpt-4o"
	}
	i := c.providerIndex(prov)
	if i < 0 {
		return fmt.Sprintf("%s: there is no provider named %s", quote(t), quote(prov))
	}
	if !slices.Contains(c.Providers[i].Models, model) {
		return fmt.Sprintf("%s: %s is not in providers[%d].models; add it there or fix the target", quote(t), quote(model), i)
	}
	return ""
}

func (v *validator) tenants() {
	c := v.c
	byName := map[string]int{}
	byEnv := map[string]int{}
	byHash := map[string]int{}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		at := fmt.Sprintf("tenants[%d]", i)
		v.name(at, "tenants", i, t.Name, reTenantName, byName,
			"the tenant's name in limits, budgets, logs and metrics",
			"letters, digits, '.', '_', '@' or '-', starting with a letter or digit")

		switch {
		case t.APIKeyEnv == "" && t.APIKeySHA256 == "":
			v.add(at, "set api_key_env (the environment variable holding the tenant's key) or api_key_sha256 (the key's hex SHA-256, so that the file holds no secret)")
		case t.APIKeyEnv != "" && t.APIKeySHA256 != "":
			v.add(at, "set only one of api_key_env and api_key_sha256")
		case t.APIKeyEnv != "":
			if !reEnvName.MatchString(t.APIKeyEnv) {
				v.add(at+".api_key_env", "%s", notEnvName)
			} else if j, dup := byEnv[t.APIKeyEnv]; dup {
				v.add(at+".api_key_env", "%s is already the key of tenants[%d]; every tenant needs its own key", t.APIKeyEnv, j)
			} else {
				byEnv[t.APIKeyEnv] = i
			}
		default:
			h := strings.ToLower(t.APIKeySHA256)
			if !reSHA256.MatchString(h) {
				v.add(at+".api_key_sha256", `want the 64 hexadecimal characters of the key's SHA-256, e.g. from: printf %%s "$KEY" | sha256sum`)
			} else if j, dup := byHash[h]; dup {
				v.add(at+".api_key_sha256", "is the same key as tenants[%d]; every tenant needs its own key", j)
			} else {
				byHash[h] = i
			}
		}

		seen := map[string]int{}
		for j, m := range t.Models {
			mp := fmt.Sprintf("%s.models[%d]", at, j)
			if _, ok := c.Targets(m); !ok {
				v.add(mp, "%s is not an alias (models:), a model a provider serves, or a provider/model target", quote(m))
			} else if k, dup := seen[m]; dup {
				v.add(mp, "%s is already models[%d]; list each model once", quote(m), k)
			} else {
				seen[m] = j
			}
		}
		v.limits(at+".limits", t.Limits)
		v.providerOnly(at+".limits", t.Limits)
		for _, m := range slices.Sorted(maps.Keys(t.ModelLimits)) {
			mp := at + ".model_limits." + m
			if _, ok := c.Targets(m); !ok {
				v.add(mp, "%s is not an alias (models:), a model a provider serves, or a provider/model target", quote(m))
			} else if !t.Allows(m) {
				v.add(mp, "%s is not in %s.models, so this limit would never apply; add it there or remove this entry", quote(m), at)
			}
			v.limits(mp, t.ModelLimits[m])
			v.providerOnly(mp, t.ModelLimits[m])
		}
		if t.Budget != nil {
			v.budget(at+".budget", t.Budget)
		}
		switch t.Priority {
		case PriorityInteractive, PriorityBatch:
		default:
			v.add(at+".priority", "%s is not a priority; use interactive or batch", quote(t.Priority))
		}
		if t.MaxWait != nil && *t.MaxWait < 0 {
			v.add(at+".max_wait", "is %v; must be >= 0 (0 = answer 429 at once instead of waiting)", *t.MaxWait)
		}
		if tc := t.Cache; tc != nil {
			if tc.TTL <= 0 {
				v.add(at+".cache.ttl", "is %v; required and > 0, e.g. 10m", tc.TTL)
			} else if tc.TTL > c.Cache.MaxTTL {
				v.add(at+".cache.ttl", "%v is above cache.max_ttl %v; lower it or raise cache.max_ttl", tc.TTL, c.Cache.MaxTTL)
			}
			for j, m := range tc.Models {
				if _, ok := c.Targets(m); !ok {
					v.add(fmt.Sprintf("%s.cache.models[%d]", at, j), "%s is not an alias (models:), a model a provider serves, or a provider/model target", quote(m))
				}
			}
		}
	}
	for j, m := range c.Dedup.Models {
		if _, ok := c.Targets(m); !ok {
			v.add(fmt.Sprintf("dedup.models[%d]", j), "%s is not an alias (models:), a model a provider serves, or a provider/model target", quote(m))
		}
	}
}

func (v *validator) budget(at string, b *TenantBudget) {
	if b.Period == "" {
		v.add(at+".period", "required: day or month")
	} else if _, err := budget.ParsePeriod(b.Period); err != nil {
		v.add(at+".period", "%s is not a period; use day or month", quote(b.Period))
	}
	switch maxUSD := float64(budget.MaxAmount) / 1e6; {
	case !(b.USD >= 0): // also NaN
		v.add(at+".usd", "is %v; must be >= 0 US dollars (0 = no money cap)", b.USD)
	case b.USD >= maxUSD:
		v.add(at+".usd", "is %v, above the maximum %.0f", b.USD, maxUSD)
	}
	switch {
	case b.Tokens < 0:
		v.add(at+".tokens", "is %d; must be >= 0 (0 = no token cap)", b.Tokens)
	case b.Tokens > budget.MaxAmount:
		v.add(at+".tokens", "is %d, above the maximum %d", b.Tokens, int64(budget.MaxAmount))
	}
	if b.Timezone == "Local" {
		v.add(at+".timezone", `"Local" depends on each host's setting, and replicas must agree on when a period starts; name the zone, e.g. Europe/Paris`)
	} else if _, err := loadLocation(b.Timezone); err != nil {
		v.add(at+".timezone", "%s is not a known time zone; use an IANA name such as Europe/Paris or America/New_York, or UTC", quote(b.Timezone))
	}
}

// priceKeys renames budget.Price's Go fields, in its messages, to their
// YAML keys.
var priceKeys = strings.NewReplacer("CachedInputPerMTok", "cached_input_per_mtok", "InputPerMTok", "input_per_mtok", "OutputPerMTok", "output_per_mtok")

func (v *validator) prices() {
	for _, m := range slices.Sorted(maps.Keys(v.c.Prices)) {
		if m == "" {
			v.add("prices", "has an entry with an empty model name")
			continue
		}
		if err := v.c.Prices[m].Validate(); err != nil {
			v.add("prices."+m, "%s", priceKeys.Replace(strings.TrimPrefix(err.Error(), budget.ErrInvalid.Error()+": ")))
		}
	}
}

// secrets checks the keys present in the environment, without ever showing
// one.
func (v *validator) secrets(getenv func(string) string) {
	c := v.c
	owner := map[string]int{} // key hash -> tenant index
	for i, t := range c.Tenants {
		if t.APIKeyEnv == "" && reSHA256.MatchString(t.APIKeySHA256) {
			owner[strings.ToLower(t.APIKeySHA256)] = i
		}
	}
	for i, t := range c.Tenants {
		if t.APIKeyEnv == "" || t.APIKeySHA256 != "" {
			continue
		}
		key := strings.TrimSpace(getenv(t.APIKeyEnv))
		if key == "" {
			continue
		}
		h := HashKey(key)
		if j, dup := owner[h]; dup && j != i {
			v.add(fmt.Sprintf("tenants[%d].api_key_env", i), "$%s holds the same key as tenants[%d]; every tenant needs its own key", t.APIKeyEnv, j)
		} else {
			owner[h] = i
		}
	}
	if reEnvName.MatchString(c.AdminTokenEnv) {
		if tok := strings.TrimSpace(getenv(c.AdminTokenEnv)); tok != "" {
			if j, ok := owner[HashKey(tok)]; ok {
				v.add("admin_token_env", "$%s holds the same key as tenants[%d]; the admin token must differ from every tenant key", c.AdminTokenEnv, j)
			}
		}
	}
	for i := range c.Providers {
		for _, r := range c.Providers[i].keyRefs(i) {
			if r.env == "" {
				continue
			}
			if key := strings.TrimSpace(getenv(r.env)); key != "" && !cleanSecret(key) {
				v.add(r.path, "$%s contains spaces or control characters; check its value", r.env)
			}
		}
	}
}

// Warnings returns what is allowed but probably not intended, one sentence
// each, in configuration order. Explain adds those that depend on the
// environment.
func (c *Config) Warnings() []string {
	var w []string
	if len(c.Tenants) == 0 {
		w = append(w, fmt.Sprintf("no tenants: anyone who can connect to %s uses the gateway without a key (allowed only on a loopback address)", c.Listen))
	}
	if c.CacheSharesStore() && !storeurl.IsMemory(c.Store) && slices.ContainsFunc(c.Tenants, func(t Tenant) bool { return t.Budget != nil }) {
		w = append(w, "cache: answers are kept on the Redis that holds the budgets (cache.store is empty or the same URL): a cache filling its memory makes that Redis evict keys or refuse writes, budgets and locks included, depending on its maxmemory-policy; give the cache a Redis of its own in cache.store (docs/cache.md)")
	}
	for i := range c.Providers {
		p := &c.Providers[i]
		if p.Type == TypeSimulated {
			continue
		}
		u, err := url.Parse(p.BaseURL)
		if err != nil || u.Host == "" {
			continue
		}
		if u.Scheme == "http" && !isLoopbackHost(u.Hostname()) {
			w = append(w, fmt.Sprintf("providers[%d] (%s): base_url is plain http to %s, not a loopback address: keys and prompts cross the network unencrypted; use https", i, p.Name, u.Hostname()))
		}
		if p.APIKeyEnv == "" && len(p.APIKeyEnvs) == 0 && p.APIKeyFile == "" && !isLoopbackHost(u.Hostname()) {
			w = append(w, fmt.Sprintf("providers[%d] (%s): no api_key_env, api_key_envs or api_key_file: requests reach %s without a key", i, p.Name, u.Hostname()))
		}
	}
	for i, a := range c.Models {
		var servedBy []string
		for _, p := range c.Providers {
			if slices.Contains(p.Models, a.Name) {
				servedBy = append(servedBy, p.Name)
			}
		}
		if len(servedBy) == 0 || slices.ContainsFunc(a.Targets, func(t string) bool { _, m, _ := strings.Cut(t, "/"); return m == a.Name }) {
			continue
		}
		w = append(w, fmt.Sprintf("models[%d]: alias %s hides the model of that name served by %s: clients asking for it get %s instead",
			i, quote(a.Name), strings.Join(servedBy, ", "), strings.Join(a.Targets, ", ")))
	}
	prices := budget.PriceTable(c.Prices)
	for i := range c.Tenants {
		t := &c.Tenants[i]
		if t.Budget == nil || !(t.Budget.USD > 0) {
			continue
		}
		var unpriced []string
		for _, m := range c.upstreamModels(t) {
			if _, ok := prices.Lookup(m); !ok {
				unpriced = append(unpriced, m)
			}
		}
		if len(unpriced) > 0 {
			w = append(w, fmt.Sprintf("tenants[%d] (%s) has a usd budget, but %s %s no price: requests for them cannot be admitted under a money cap; add them under prices",
				i, t.Name, strings.Join(unpriced, ", "), map[bool]string{true: "has", false: "have"}[len(unpriced) == 1]))
		}
	}
	if c.RequestTimeout > 0 && c.MaxWait >= c.RequestTimeout {
		w = append(w, fmt.Sprintf("max_wait %s is not shorter than request_timeout %s: a request can spend its whole deadline waiting", durationString(c.MaxWait), durationString(c.RequestTimeout)))
	}
	for i, t := range c.Tenants {
		if t.MaxWait != nil && c.RequestTimeout > 0 && *t.MaxWait >= c.RequestTimeout {
			w = append(w, fmt.Sprintf("tenants[%d] (%s): max_wait %s is not shorter than request_timeout %s: a request can spend its whole deadline waiting", i, t.Name, durationString(*t.MaxWait), durationString(c.RequestTimeout)))
		}
	}
	return w
}

// upstreamModels lists, without repeats and in configuration order, the
// provider model ids the tenant's requests can reach: what gets priced.
func (c *Config) upstreamModels(t *Tenant) []string {
	var out []string
	add := func(target string) {
		if _, m, ok := strings.Cut(target, "/"); ok && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	if len(t.Models) == 0 {
		for _, p := range c.Providers {
			for _, m := range p.Models {
				add(p.Name + "/" + m)
			}
		}
		return out
	}
	for _, name := range t.Models {
		targets, _ := c.Targets(name)
		for _, tg := range targets {
			add(tg)
		}
	}
	return out
}

func (c *Config) providerIndex(name string) int {
	for i := range c.Providers {
		if c.Providers[i].Name == name {
			return i
		}
	}
	return -1
}

// checkModelName says what is wrong with a model or alias name ("" if
// nothing): it must be printable, without spaces, as it travels in JSON
// bodies, metric labels and store keys.
func checkModelName(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > maxModelLen:
		return fmt.Sprintf("is %d bytes long; at most %d are allowed", len(s), maxModelLen)
	case !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }):
		return quote(s) + " contains spaces or control characters"
	}
	return ""
}

// isLoopbackHost reports whether host (a listen or URL host, without port)
// is certainly this machine. An empty host means every interface.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && ip.IsLoopback()
}

// validHeaderName reports whether s is an HTTP token (RFC 9110).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0) {
			return false
		}
	}
	return true
}

// cleanSecret reports whether a key is one token of printable ASCII, as
// an Authorization header needs.
func cleanSecret(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// name checks the required, unique name of list[i] (at): what says what the
// name is for, allowed which characters re accepts; seen maps names to the
// index that took them.
func (v *validator) name(at, list string, i int, name string, re *regexp.Regexp, seen map[string]int, what, allowed string) {
	switch {
	case name == "":
		v.add(at+".name", "required: %s", what)
	case len(name) > MaxNameLen || !re.MatchString(name):
		v.add(at+".name", "%s: use 1 to %d %s", quote(name), MaxNameLen, allowed)
	default:
		if j, dup := seen[name]; dup {
			v.add(at+".name", "%s is already the name of %s[%d]; names must be unique", quote(name), list, j)
		} else {
			seen[name] = i
		}
	}
}

package config

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/storeurl"
)

// Explain writes a human summary of the configuration, for `llmgate
// check-config`: the settings that matter, each provider's deployments with
// their effective limits, the model names clients can send and where they
// go, the tenants (how they authenticate, never their key), and warnings
// (Warnings plus variables and files that are missing, then extra). It reads no secret:
// it only checks that variables are set and files exist. Write errors are
// ignored: this is a report for a terminal.
func (c *Config) Explain(w io.Writer, getenv func(string) string, extra ...string) {
	getenv = orNoEnv(getenv)
	out := &errWriter{w: w}
	p := out.printf
	row := func(key, format string, args ...any) {
		p("  %-16s %s\n", key, fmt.Sprintf(format, args...))
	}

	p("Configuration: %s\n", c.describeSource())
	row("listen", "%s%s", c.Listen, c.envNote("listen"))
	sv := c.Server
	scheme := "HTTP/1.1"
	if sv.TLS() {
		scheme = "HTTPS with HTTP/2, certificate " + sv.TLSCertFile
	}
	row("http server", "net/http, %s; at most %d connections", scheme, sv.MaxConnections)
	row("client bounds", "headers %s, body %s, answer write %s, stream event write %s, idle %s",
		durationString(sv.ReadHeaderTimeout), durationString(sv.BodyTimeout), durationString(sv.WriteTimeout),
		durationString(sv.StreamWriteTimeout), durationString(sv.IdleTimeout))
	row("shutdown", "on SIGTERM /readyz fails for %s before the listener closes, then requests in flight have %s to finish; the rest are cut and charged what they used",
		durationString(sv.DrainDelay), durationString(sv.ShutdownGrace))
	if storeurl.IsMemory(c.Store) {
		row("store", "%s%s: one process; budgets and usage persist in %s%s", c.Store, c.envNote("store"), c.StateDir, c.envNote("state_dir"))
	} else {
		row("store", "%s%s: shared by every replica", storeurl.Redact(c.Store), c.envNote("store"))
	}
	if getenv(c.AdminTokenEnv) == "" {
		row("admin API", "off ($%s is empty)", c.AdminTokenEnv)
	} else {
		row("admin API", "on (token in $%s)", c.AdminTokenEnv)
	}
	row("max body", "%v", c.MaxBodyBytes)
	if c.MaxWait == 0 {
		row("max wait", "0: no waiting, 429 at once%s", c.envNote("max_wait"))
	} else {
		row("max wait", "%s for admission, then 429%s", durationString(c.MaxWait), c.envNote("max_wait"))
	}
	row("request timeout", "%s, waiting and retries included", durationString(c.RequestTimeout))
	row("log", "%s, %s%s", c.Log.Level, c.Log.Format, c.envNote("log.level"))
	u := c.Upstream
	row("retries", "%d attempts per target, backoff from %s doubling up to %s", u.MaxAttempts, durationString(u.BackoffBase), durationString(u.BackoffMax))
	row("breaker", "opens after %d consecutive failures, for %s", u.Breaker.Failures, durationString(u.Breaker.OpenFor))
	row("timeouts", "headers within %s x recent p95, clamped to [%s, %s]; at most %s between body bytes",
		strconv.FormatFloat(u.Timeout.Multiplier, 'g', -1, 64), durationString(u.Timeout.Floor), durationString(u.Timeout.Ceiling), durationString(u.IdleTimeout))
	row("store down", "budgets %s, rate limits %s", map[bool]string{false: "fail closed (requests refused)", true: "fail open (no budget check)"}[c.Budget.FailOpen],
		map[bool]string{false: "fail open (no limit check)", true: "fail closed (requests refused)"}[c.RateLimit.FailClosed])
	if n := c.Budget.AckReplicas; n > 0 {
		row("budget writes", "each waits until %d replica(s) have it, and fails closed when they do not", n)
	}
	row("reservations", "budget holds are charged, not freed, %s after their replica stops renewing them; rate-limit reservations and permits free after %s without renewal",
		durationString(c.Budget.ReservationTTL), durationString(c.RateLimit.ReservationHold))
	if c.RateLimit.LocalQuotaOn() {
		row("local quota", "on: far from a limit, each replica admits from blocks reserved in the store, each admitting for %s",
			durationString(c.RateLimit.LocalWindow))
	} else {
		row("local quota", "off: every admission is a store round trip")
	}
	if w := c.RateLimit.SlowStartWindow(); w > 0 {
		row("slow start", "until a provider reports its limits, at most %d requests in flight per deployment across replicas, one more per success", w)
	} else {
		row("slow start", "off: the configured limits apply from the first request")
	}
	dd := "off for temperature 0"
	if c.Dedup.DeterministicOn() {
		dd = "temperature-0 requests"
	}
	if len(c.Dedup.Models) > 0 {
		dd += ", and every request to " + strings.Join(c.Dedup.Models, ", ")
	}
	row("de-duplication", "%s and Idempotency-Key requests share one upstream call; leader lease %s, idempotent answers kept %s",
		dd, durationString(c.Dedup.LeaseTTL), durationString(c.Dedup.IdempotencyTTL))
	row("cache", "tenants opt in (tenants[].cache) or requests ask (x-llmgate-cache-ttl, at most %s); %s",
		durationString(c.Cache.MaxTTL), c.cacheWhere())
	row("sessions", "requests with the same %s header are served one at a time in arrival order; lease %s", c.Sessions.Header, durationString(c.Sessions.TTL))

	deployments, _ := c.deployments(getenv, false)
	p("\nProviders (%d):\n", len(c.Providers))
	for i := range c.Providers {
		prov := &c.Providers[i]
		switch prov.Type {
		case TypeSimulated:
			p("  %s: simulated, in-process%s\n", prov.Name, describeSim(prov.Simulated))
		case TypeAnthropic:
			p("  %s: Anthropic API at %s (anthropic-version %s)\n", prov.Name, storeurl.Redact(prov.BaseURL), prov.APIVersion)
		case TypeAzure:
			p("  %s: Azure OpenAI at %s (api-version %s)\n", prov.Name, storeurl.Redact(prov.BaseURL), prov.APIVersion)
		default:
			p("  %s: OpenAI-compatible API at %s\n", prov.Name, storeurl.Redact(prov.BaseURL))
		}
		var keys []string
		for j, r := range prov.keyRefs(i) {
			switch {
			case r.env != "":
				keys = append(keys, fmt.Sprintf("#%d $%s (%s)", j+1, r.env, map[bool]string{true: "set", false: "NOT SET"}[getenv(r.env) != ""]))
			case r.file != "":
				_, err := os.Stat(r.file)
				keys = append(keys, fmt.Sprintf("#%d %s (%s)", j+1, r.label, map[bool]string{true: "present", false: "MISSING"}[err == nil]))
			}
		}
		if len(keys) == 0 {
			keys = []string{"none"}
		}
		p("    keys: %s\n", strings.Join(keys, ", "))
		if len(prov.Headers) > 0 {
			p("    extra headers: %s\n", strings.Join(slices.Sorted(maps.Keys(prov.Headers)), ", "))
		}
		width := 0
		for _, d := range deployments {
			if d.Provider == prov {
				width = max(width, len(d.Name))
			}
		}
		for _, d := range deployments {
			if d.Provider == prov {
				p("    %-*s  %s\n", width, d.Name, describeLimits(d.Limits))
			}
		}
	}

	p("\nModel names clients can send:\n")
	for _, a := range c.Models {
		p("  %s -> %s (alias)\n", a.Name, strings.Join(a.Targets, ", "))
	}
	var served []string
	for _, prov := range c.Providers {
		for _, m := range prov.Models {
			if !slices.Contains(served, m) {
				served = append(served, m)
			}
		}
	}
	for _, m := range served {
		if slices.ContainsFunc(c.Models, func(a Alias) bool { return a.Name == m }) {
			continue // the alias above decides
		}
		targets, _ := c.Targets(m)
		p("  %s -> %s\n", m, strings.Join(targets, ", "))
	}
	p("  and provider/model (e.g. %s/%s) to address one provider\n", firstOr(c.Providers, "openai"), firstModel(c.Providers))

	if len(c.Tenants) == 0 {
		p("\nTenants: none (open access: requests need no key)\n")
	} else {
		p("\nTenants (%d):\n", len(c.Tenants))
	}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		if t.APIKeyEnv != "" {
			p("  %s: key in $%s (%s)\n", t.Name, t.APIKeyEnv, map[bool]string{true: "set", false: "NOT SET"}[getenv(t.APIKeyEnv) != ""])
		} else {
			p("  %s: key by SHA-256 %s\n", t.Name, shortHash(t.APIKeySHA256))
		}
		if len(t.Models) == 0 {
			p("    models: all\n")
		} else {
			p("    models: %s\n", strings.Join(t.Models, ", "))
		}
		p("    limits: %s\n", describeLimits(t.Limits))
		for _, m := range slices.Sorted(maps.Keys(t.ModelLimits)) {
			p("    limits for %s: %s\n", m, describeLimits(t.ModelLimits[m]))
		}
		p("    budget: %s\n", describeBudget(t.Budget))
		p("    priority: %s; max wait %s\n", t.Priority, durationString(t.MaxWaitOr(c.MaxWait)))
		if t.Cache != nil {
			models := "all models"
			if len(t.Cache.Models) > 0 {
				models = strings.Join(t.Cache.Models, ", ")
			}
			p("    cache: answers kept %s (%s)\n", durationString(t.Cache.TTL), models)
		}
		if t.Dedup {
			p("    dedup: every request shares identical requests' upstream call\n")
		}
	}

	defaults := budget.DefaultPrices()
	configured := 0
	for m, pr := range c.Prices {
		if d, ok := defaults[m]; !ok || d != pr {
			configured++
		}
	}
	p("\nPrices: %d models (the built-in table, %d added or changed)\n", len(c.Prices), configured)

	warnings := append(append(c.Warnings(), c.envWarnings(getenv)...), extra...)
	if len(warnings) == 0 {
		p("\nWarnings: none\n")
		return
	}
	p("\nWarnings (%d):\n", len(warnings))
	for _, w := range warnings {
		p("  - %s\n", w)
	}
}

// cacheWhere says where the cache keeps answers and how much.
func (c *Config) cacheWhere() string {
	perTenant := fmt.Sprintf("at most %s per tenant", c.Cache.MaxBytesPerTenant)
	switch {
	case c.CacheSharesStore() && storeurl.IsMemory(c.Store), storeurl.IsMemory(c.Cache.Store):
		return fmt.Sprintf("in each process%s, at most %s, %s", c.envNote("cache.store"), c.Cache.MaxBytes, perTenant)
	case c.CacheSharesStore():
		return fmt.Sprintf("on the store%s, %s, the rest bounded by its maxmemory", c.envNote("cache.store"), perTenant)
	default:
		return fmt.Sprintf("on a Redis of its own, %s%s, %s; while it is down answers are not cached, requests are served",
			storeurl.Redact(c.Cache.Store), c.envNote("cache.store"), perTenant)
	}
}

// envWarnings are the warnings that depend on the environment: secrets
// that are not there (the gateway will refuse to start) and a weak admin
// token.
func (c *Config) envWarnings(getenv func(string) string) []string {
	var w []string
	const notSet = "is not set: the gateway will not start until it is"
	for i := range c.Providers {
		p := &c.Providers[i]
		for _, r := range p.keyRefs(i) {
			switch {
			case r.env != "" && getenv(r.env) == "":
				w = append(w, fmt.Sprintf("%s: $%s %s", r.path, r.env, notSet))
			case r.file != "":
				if _, err := os.Stat(r.file); err != nil {
					w = append(w, fmt.Sprintf("%s: %v", r.path, err))
				}
			}
		}
		for _, h := range slices.Sorted(maps.Keys(p.Headers)) {
			names, _ := headerRefs(p.Headers[h])
			for _, n := range names {
				if getenv(n) == "" {
					w = append(w, fmt.Sprintf("providers[%d].headers.%s: $%s %s", i, h, n, notSet))
				}
			}
		}
	}
	for i, t := range c.Tenants {
		if t.APIKeyEnv != "" && getenv(t.APIKeyEnv) == "" {
			w = append(w, fmt.Sprintf("tenants[%d].api_key_env: $%s %s", i, t.APIKeyEnv, notSet))
		}
	}
	if tok := strings.TrimSpace(getenv(c.AdminTokenEnv)); tok != "" && len(tok) < 16 {
		w = append(w, fmt.Sprintf("admin_token_env: $%s is shorter than 16 characters; use a long random token, e.g. from: openssl rand -hex 32", c.AdminTokenEnv))
	}
	return w
}

func (c *Config) describeSource() string {
	switch c.Source {
	case SourceDefaultOpenAI:
		return "built-in default (no file; OPENAI_API_KEY is set)"
	case SourceDefaultSimulated:
		return "built-in default (no file, no OPENAI_API_KEY: the simulated provider)"
	case "":
		return "(built in code)"
	}
	return c.Source
}

func (c *Config) envNote(path string) string {
	if env := c.fromEnv[path]; env != "" {
		return " (from " + env + ")"
	}
	return ""
}

func describeLimits(l Limits) string {
	var parts []string
	for _, k := range limitKeys {
		if n := *k.get(&l); n != 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k.key, n))
		}
	}
	if len(parts) == 0 {
		return "no limits"
	}
	return strings.Join(parts, ", ")
}

func describeBudget(b *TenantBudget) string {
	if b == nil {
		return "none"
	}
	var caps []string
	if b.USD > 0 {
		caps = append(caps, "$"+strconv.FormatFloat(b.USD, 'f', -1, 64))
	}
	if b.Tokens > 0 {
		caps = append(caps, fmt.Sprintf("%d tokens", b.Tokens))
	}
	what := strings.Join(caps, " and ")
	if what == "" {
		what = "no cap (usage is only accounted)"
	}
	return fmt.Sprintf("%s per %s, periods start at midnight %s", what, b.Period, b.Timezone)
}

func describeSim(s SimulatedProvider) string {
	var parts []string
	for _, f := range []struct {
		k string
		v int64
	}{{"rpm", s.RPM}, {"tpm", s.TPM}, {"concurrency", s.Concurrency}} {
		if f.v != 0 {
			parts = append(parts, fmt.Sprintf("%s %d", f.k, f.v))
		}
	}
	if s.TTFT != 0 {
		parts = append(parts, "ttft "+durationString(s.TTFT))
	}
	if s.TokenDelay != 0 {
		parts = append(parts, "token delay "+durationString(s.TokenDelay))
	}
	for _, f := range []struct {
		k string
		v float64
	}{{"jitter", s.Jitter}, {"error rate", s.ErrorRate}, {"drop rate", s.DropRate}} {
		if f.v != 0 {
			parts = append(parts, f.k+" "+strconv.FormatFloat(f.v, 'g', -1, 64))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// shortHash shows enough of a key's hash to tell tenants apart.
func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12] + "..."
	}
	return h
}

func firstOr(ps []Provider, def string) string {
	if len(ps) > 0 && ps[0].Name != "" {
		return ps[0].Name
	}
	return def
}

func firstModel(ps []Provider) string {
	if len(ps) > 0 && len(ps[0].Models) > 0 {
		return ps[0].Models[0]
	}
	return "gpt-4o"
}

// errWriter keeps the first write error and skips later writes.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

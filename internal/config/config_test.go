package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/sim"
)

func TestDefaults(t *testing.T) {
	c := mustParse(t, providerBlock+"tenants: [{name: a, api_key_env: A, budget: {period: day}}]",
		env(map[string]string{"HOME": "/home/u"}))
	want := map[string]any{
		"Listen":                     "127.0.0.1:8080",
		"Store":                      "memory",
		"StateDir":                   "/home/u/.local/state/llmgate",
		"AdminTokenEnv":              "LLMGATE_ADMIN_TOKEN",
		"MaxBodyBytes":               8 * MiB,
		"MaxWait":                    30 * time.Second,
		"RequestTimeout":             10 * time.Minute,
		"Log":                        Log{Level: "info", Format: "text"},
		"Upstream.MaxAttempts":       3,
		"Upstream.BackoffBase":       200 * time.Millisecond,
		"Upstream.BackoffMax":        10 * time.Second,
		"Upstream.Breaker":           Breaker{Failures: 5, OpenFor: 30 * time.Second},
		"Upstream.Timeout":           Timeout{Floor: 10 * time.Second, Ceiling: 300 * time.Second, Multiplier: 4},
		"Upstream.IdleTimeout":       120 * time.Second,
		"Server.DrainDelay":          5 * time.Second,
		"Server.ShutdownGrace":       30 * time.Second,
		"Budget":                     BudgetStore{FailOpen: false, ReservationTTL: 30 * time.Second},
		"RateLimit":                  RateLimitStore{FailClosed: false, ReservationHold: DefaultReservationHold, LocalWindow: DefaultLocalWindow},
		"Source":                     "test.yaml",
		"Providers[0].Type":          "openai",
		"Tenants[0].Priority":        "interactive",
		"Tenants[0].Budget.Timezone": "UTC",
	}
	for path, w := range want {
		if got := field(t, c, path); !reflect.DeepEqual(got, w) {
			t.Errorf("%s = %#v, want %#v", path, got, w)
		}
	}
	if !reflect.DeepEqual(budget.PriceTable(c.Prices), budget.DefaultPrices()) {
		t.Errorf("Prices = %v, want the built-in table", c.Prices)
	}
	if c.Tenants[0].MaxWait != nil {
		t.Error("tenant MaxWait set by default; nil means the gateway's")
	}
}

// field returns the value at a dotted Go path such as "Providers[0].Type".
func field(t *testing.T, c *Config, path string) any {
	t.Helper()
	v := reflect.ValueOf(c).Elem()
	for _, part := range strings.Split(path, ".") {
		name, idx, indexed := strings.Cut(strings.TrimSuffix(part, "]"), "[")
		v = v.FieldByName(name)
		if indexed {
			v = v.Index(int(idx[0] - '0'))
		}
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if !v.IsValid() {
			t.Fatalf("no field %s", path)
		}
	}
	return v.Interface()
}

func TestDefaultStateDir(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"XDG_STATE_HOME": "/xdg", "HOME": "/home/u"}, "/xdg/llmgate"},
		{map[string]string{"XDG_STATE_HOME": "relative", "HOME": "/home/u"}, "/home/u/.local/state/llmgate"}, // the spec ignores relative paths
		{map[string]string{"HOME": "/home/u"}, "/home/u/.local/state/llmgate"},
		{map[string]string{"HOME": "/home/u", EnvStateDir: "/srv/state"}, "/srv/state"},
	} {
		if got := mustParse(t, providerBlock, env(tc.env)).StateDir; got != tc.want {
			t.Errorf("env %v: StateDir %q, want %q", tc.env, got, tc.want)
		}
	}
}

func TestFileKeepsExplicitValues(t *testing.T) {
	c := mustParse(t, providerBlock+`
listen: 127.0.0.1:9999
store: redis://localhost:6379/1
max_body_bytes: 512KiB
max_wait: 0s
request_timeout: 2m
log: {level: debug, format: json}
upstream: {max_attempts: 1, backoff_base: 1s, backoff_max: 2s, breaker: {failures: 2, open_for: 1m}, timeout: {floor: 1s, ceiling: 2s, multiplier: 1.5}, idle_timeout: 5s,
  max_conns_per_host: 7, max_response_header_bytes: 64KiB, dial_timeout: 3s, tls_handshake_timeout: 4s}
server: {read_header_timeout: 1s, body_timeout: 2s, write_timeout: 3s, stream_write_timeout: 4s, idle_timeout: 5s, max_connections: 6,
  drain_delay: 0s, shutdown_grace: 7s}
budget: {fail_open: true, reservation_ttl: 1h, ack_replicas: 2}
ratelimit: {fail_closed: true}
prices: {house: {input_per_mtok: 1, output_per_mtok: 2}, gpt-4o: {input_per_mtok: 9, output_per_mtok: 9}}
`, nil)
	if c.Listen != "127.0.0.1:9999" || c.Store != "redis://localhost:6379/1" || c.MaxBodyBytes != 512*KiB || c.MaxWait != 0 ||
		c.RequestTimeout != 2*time.Minute || c.Log != (Log{Level: "debug", Format: "json"}) ||
		c.Upstream != (Upstream{1, time.Second, 2 * time.Second, Breaker{2, time.Minute}, Timeout{time.Second, 2 * time.Second, 1.5}, 5 * time.Second,
			7, 64 * KiB, 3 * time.Second, 4 * time.Second}) ||
		c.Server != (Server{"", "", time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second, 6, 0, 7 * time.Second}) ||
		c.Budget != (BudgetStore{true, time.Hour, 2}) || !c.RateLimit.FailClosed {
		t.Errorf("explicit values lost: %+v", c)
	}
	if c.Prices["house"] != (budget.Price{InputPerMTok: 1, OutputPerMTok: 2}) || c.Prices["gpt-4o"].InputPerMTok != 9 {
		t.Errorf("configured prices not merged over the defaults: %v", c.Prices)
	}
	if _, ok := c.Prices["gpt-4o-mini"]; !ok {
		t.Error("built-in prices lost")
	}
	if c.Log.SlogLevel().String() != "DEBUG" {
		t.Errorf("SlogLevel %v", c.Log.SlogLevel())
	}
}

func TestEnvOverrides(t *testing.T) {
	getenv := env(map[string]string{
		EnvListen:   "127.0.0.2:7000",
		EnvStore:    " redis://localhost:6379/3 ", // surrounding spaces trimmed
		EnvStateDir: "/srv/llmgate",
		EnvMaxWait:  "0",
		EnvLogLevel: "warn",
	})
	c := mustParse(t, providerBlock+"listen: 127.0.0.1:1\nstore: memory\nstate_dir: /x\nmax_wait: 5s\nlog: {level: debug}", getenv)
	if c.Listen != "127.0.0.2:7000" || c.Store != "redis://localhost:6379/3" || c.StateDir != "/srv/llmgate" || c.MaxWait != 0 || c.Log.Level != "warn" {
		t.Errorf("environment did not override the file: %+v", c)
	}
	// Empty variables override nothing.
	c = mustParse(t, providerBlock+"max_wait: 5s", env(map[string]string{EnvMaxWait: "", EnvListen: "  "}))
	if c.MaxWait != 5*time.Second || c.Listen != DefaultListen {
		t.Errorf("empty variables changed the configuration: %+v", c)
	}
}

func TestDefault(t *testing.T) {
	t.Run("openai", func(t *testing.T) {
		getenv := env(map[string]string{EnvOpenAIKey: "sk-test"})
		c := Default(getenv)
		if err := c.Validate(getenv); err != nil {
			t.Fatal(err)
		}
		if c.Source != SourceDefaultOpenAI || len(c.Providers) != 1 {
			t.Fatalf("Source %q, %d providers", c.Source, len(c.Providers))
		}
		p := c.Providers[0]
		wantModels := []string{"gpt-4.1", "gpt-4.1-mini", "gpt-4o", "gpt-4o-mini", "text-embedding-3-small"}
		if p.Name != "openai" || p.Type != TypeOpenAI || p.BaseURL != "https://api.openai.com/v1" || p.APIKeyEnv != "OPENAI_API_KEY" ||
			!slices.Equal(p.Models, wantModels) || p.Limits != (Limits{}) {
			t.Errorf("provider %+v", p)
		}
		ds, err := c.Deployments(getenv)
		if err != nil || len(ds) != len(wantModels) || ds[0].Name != "openai/gpt-4.1" || ds[0].APIKey != "sk-test" {
			t.Errorf("Deployments: %v %v", ds, err)
		}
		if c.Store != "memory" || c.Listen != DefaultListen {
			t.Errorf("store %q listen %q", c.Store, c.Listen)
		}
	})
	t.Run("simulated", func(t *testing.T) {
		c := Default(nil)
		if err := c.Validate(nil); err != nil {
			t.Fatal(err)
		}
		want := append(slices.Clone(sim.DefaultModels), sim.DefaultEmbeddingModels...)
		if c.Source != SourceDefaultSimulated || len(c.Providers) != 1 || c.Providers[0].Name != "sim" ||
			c.Providers[0].Type != TypeSimulated || !slices.Equal(c.Providers[0].Models, want) {
			t.Errorf("Source %q, providers %+v", c.Source, c.Providers)
		}
		if c.Server.DrainDelay != DefaultDrainDelay || c.Server.ShutdownGrace != DefaultShutdownGrace {
			t.Errorf("drain delay %v, shutdown grace %v; want the defaults", c.Server.DrainDelay, c.Server.ShutdownGrace)
		}
		// The simulator's slices are not shared.
		c.Providers[0].Models[0] = "changed"
		if sim.DefaultModels[0] == "changed" {
			t.Error("Default aliases sim.DefaultModels")
		}
	})
	t.Run("overrides", func(t *testing.T) {
		c := Default(env(map[string]string{EnvListen: "0.0.0.0:8080", EnvMaxWait: "1s"}))
		if c.MaxWait != time.Second {
			t.Errorf("MaxWait %v", c.MaxWait)
		}
		// Open access on every interface: refused.
		if err := c.Validate(nil); !isInvalid(err) || !strings.Contains(err.Error(), "tenants: none") {
			t.Errorf("Validate: %v", err)
		}
	})
}

func TestSyntaxErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown top-level key", providerBlock + "listne: 1", []string{
			"line 7: listne: unknown key; known keys: listen, http_server, server, store, state_dir, admin_token_env, metrics_token_env, max_body_bytes, max_wait, request_timeout, log, upstream, providers, models, tenants, prices, budget, ratelimit, sessions, dedup, cache, tracing, passthrough"}},
		{"unknown nested key", "providers:\n  - name: a\n    base_urll: x", []string{
			"line 3: providers[0].base_urll: unknown key; known keys: name, type, base_url, api_key_env, api_key_envs, api_key_file, models, limits, model_limits, headers, api_version, deployments, simulated"}},
		{"unknown limits key", "providers: [{name: a, limits: {rpm: 1, rps: 2}}]", []string{
			"line 1: providers[0].limits.rps: unknown key; known keys: rpm, tpm, concurrency, itpm, otpm"}},
		{"unknown price key", "prices: {m: {input: 1}}", []string{
			"line 1: prices.m.input: unknown key; known keys: input_per_mtok, output_per_mtok, cached_input_per_mtok"}},
		{"key written twice", "listen: a\nlisten: b", []string{"line 2: listen: written twice (first at line 1); keep one"}},
		{"limit written twice", "providers: [{limits: {rpm: 1, rpm: 2}}]", []string{"line 1: providers[0].limits.rpm: written twice; keep one"}},
		{"duration without unit", "max_wait: 30", []string{"line 1: max_wait: got \"30\", want a duration such as 30s, 1m30s or 200ms"}},
		{"bad duration", "upstream:\n  breaker:\n    open_for: soon", []string{"line 3: upstream.breaker.open_for: got \"soon\", want a duration such as 30s, 1m30s or 200ms"}},
		{"text for a number", "upstream: {max_attempts: many}", []string{"line 1: upstream.max_attempts: got \"many\", want a whole number"}},
		{"fraction for a limit", "providers: [{limits: {tpm: 1.5}}]", []string{"line 1: providers[0].limits.tpm: got \"1.5\", want a whole number"}},
		{"text for a boolean", "budget: {fail_open: maybe}", []string{"line 1: budget.fail_open: got \"maybe\", want true or false"}},
		{"scalar for a list", "providers: openai", []string{"line 1: providers: got \"openai\", want a list"}},
		{"list for a mapping", "log: [a]", []string{"line 1: log: got a list, want a mapping with keys level, format, access"}},
		{"mapping for a string", "listen: {a: 1}", []string{"line 1: listen: got a mapping, want a string"}},
		{"list for limits", "providers:\n  - limits:\n      - 1", []string{"line 3: providers[0].limits: got a list, want a mapping with keys rpm, tpm, concurrency, itpm, otpm"}},
		{"not a mapping", "just text", []string{"line 1: got text, want a mapping of settings (listen:, providers:, ...); see docs/config.md"}},
		{"bad size", "max_body_bytes: 8 MB/s", []string{"line 1: max_body_bytes: size \"8 MB/s\": want a whole number of bytes, optionally with a unit: B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024), e.g. 8MiB"}},
		{"negative size", "max_body_bytes: -1", []string{"line 1: max_body_bytes: size -1 is negative; want a whole number of bytes, optionally with a unit: B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024), e.g. 8MiB"}},
		{"two documents", providerBlock + "---\nlisten: x", []string{"line 7: a second YAML document; put the whole configuration in one document (remove the ---)"}},
		{"bad indentation", "providers:\n  - name: a\n   models: [m]", []string{"line 1: did not find expected '-' indicator"}},
		{"tab", "listen:\n\t- x", []string{"line 2: found character that cannot start any token"}},
		{"value of a key setting not shown", "providers: [{api_key_envs: sk-proj-PASTEDSECRET}]", []string{"line 1: providers[0].api_key_envs: got text, want a list"}},
		{"value without a known path not shown", "providers: [{limits: {rpm: 1}, models: {a: b}, name: [x]}]", []string{
			"line 1: got a mapping, want a list",
			"line 1: got a list, want a string",
		}},
		{"several at once", "max_wait: 30\nlog: {levle: x}\nupstream: {max_attempts: x}", []string{
			"line 1: max_wait: got \"30\", want a duration such as 30s, 1m30s or 200ms",
			"line 2: log.levle: unknown key; known keys: level, format, access",
			"line 3: upstream.max_attempts: got \"x\", want a whole number",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tc.yaml), nil)
			if !errors.Is(err, ErrSyntax) || isInvalid(err) {
				t.Fatalf("error %v: want ErrSyntax only", err)
			}
			var se *syntaxError
			if !errors.As(err, &se) {
				t.Fatalf("error %T", err)
			}
			if !slices.Equal(se.lines, tc.want) {
				t.Errorf("lines:\n  got  %q\n  want %q", se.lines, tc.want)
			}
			prefix := "config: cannot parse bad.yaml: "
			if len(tc.want) > 1 {
				prefix = "config: cannot parse bad.yaml:\n  "
			}
			if !strings.HasPrefix(err.Error(), prefix) {
				t.Errorf("message %q, want prefix %q", err.Error(), prefix)
			}
		})
	}
}

func TestEmptyFile(t *testing.T) {
	for _, data := range []string{"", "# only a comment\n", "---\n", "~"} {
		_, err := Parse("empty.yaml", []byte(data), nil)
		if !isInvalid(err) || !strings.Contains(err.Error(), "providers: none") {
			t.Errorf("%q: %v", data, err)
		}
	}
}

func TestLoad(t *testing.T) {
	getenv := env(map[string]string{"OPENAI_KEY_A": "sk-a", "OPENAI_KEY_B": "sk-b", "BACKUP_API_KEY": "sk-c", "OPENAI_ORG_ID": "org-1", "ACME_KEY": "acme-0123456789abcdef"})
	c, err := Load("testdata/full.yaml", getenv)
	if err != nil {
		t.Fatal(err)
	}
	if c.Source != "testdata/full.yaml" {
		t.Errorf("Source %q", c.Source)
	}
	// Relative paths are the file's directory's.
	abs, _ := filepath.Abs("testdata/secrets/local.key")
	if got := c.Providers[2].APIKeyFile; got != abs {
		t.Errorf("api_key_file %q, want %q", got, abs)
	}
	if c.StateDir != "/var/lib/llmgate" {
		t.Errorf("absolute state_dir changed: %q", c.StateDir)
	}
	t.Chdir(t.TempDir())
	ds, err := c.Deployments(getenv)
	if err != nil {
		t.Fatalf("Deployments after chdir: %v", err)
	}
	for _, d := range ds {
		if d.Provider.Name == "local" && d.APIKey != "sk-local-test-key" {
			t.Errorf("local key %q", d.APIKey)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.yaml"), nil); !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(err.Error(), "config: open ") {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", MaxFileBytes)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big, nil); !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), "larger than 4MiB") {
		t.Errorf("big file: %v", err)
	}
	rel := filepath.Join(dir, "rel.yaml")
	if err := os.WriteFile(rel, []byte(providerBlock+"state_dir: state\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(rel, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.StateDir != filepath.Join(dir, "state") {
		t.Errorf("relative state_dir %q, want it under %s", c.StateDir, dir)
	}
}

func TestProviderNormalised(t *testing.T) {
	c := mustParse(t, "providers: [{name: a, base_url: 'https://x.example/v1///', models: [m]}]\ntenants: [{name: t, api_key_sha256: "+strings.ToUpper(shaTest)+"}]", nil)
	if c.Providers[0].BaseURL != "https://x.example/v1" {
		t.Errorf("BaseURL %q", c.Providers[0].BaseURL)
	}
	if c.Tenants[0].APIKeySHA256 != shaTest {
		t.Errorf("sha256 not lowercased: %q", c.Tenants[0].APIKeySHA256)
	}
}

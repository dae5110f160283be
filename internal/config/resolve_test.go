package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDeployments(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte("  sk-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := mustParse(t, `
providers:
  - name: multi
    base_url: https://multi.example/v1
    api_key_envs: [KEY_A, KEY_B]
    models: [m1, m2]
    limits: {rpm: 100, tpm: 1000, concurrency: 5}
    model_limits:
      m2: {tpm: 50, concurrency: 0}
    headers: {OpenAI-Organization: "org-${ORG}", X-Plain: plain}
  - name: single
    base_url: https://single.example/v1
    api_key_env: KEY_C
    models: [m1]
  - name: filed
    base_url: https://filed.example/v1
    api_key_file: `+keyFile+`
    models: [m3]
  - name: local
    base_url: http://127.0.0.1:8000/v1
    models: [m4]
`, nil)
	getenv := env(map[string]string{"KEY_A": "sk-aaa", "KEY_B": " sk-bbb\n", "KEY_C": "sk-ccc", "ORG": "acme"})
	ds, err := c.Deployments(getenv)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		name, provider, model string
		keyIndex              int
		label, key            string
		limits                Limits
	}
	want := []row{
		{"multi#1/m1", "multi", "m1", 0, "KEY_A", "sk-aaa", Limits{RPM: 100, TPM: 1000, Concurrency: 5}},
		{"multi#1/m2", "multi", "m2", 0, "KEY_A", "sk-aaa", Limits{RPM: 100, TPM: 50, Concurrency: 0}},
		{"multi#2/m1", "multi", "m1", 1, "KEY_B", "sk-bbb", Limits{RPM: 100, TPM: 1000, Concurrency: 5}},
		{"multi#2/m2", "multi", "m2", 1, "KEY_B", "sk-bbb", Limits{RPM: 100, TPM: 50, Concurrency: 0}},
		{"single/m1", "single", "m1", 0, "KEY_C", "sk-ccc", Limits{}},
		{"filed/m3", "filed", "m3", 0, "file:" + keyFile, "sk-from-file", Limits{}},
		{"local/m4", "local", "m4", 0, "none", "", Limits{}},
	}
	var got []row
	for _, d := range ds {
		got = append(got, row{d.Name, d.Provider.Name, d.Model, d.KeyIndex, d.KeyLabel, d.APIKey, d.Limits})
	}
	if !slices.Equal(got, want) {
		t.Errorf("deployments:\n  got  %+v\n  want %+v", got, want)
	}
	if ds[0].Provider != &c.Providers[0] {
		t.Error("Provider does not point into the Config")
	}
	if ds[0].Target() != "multi/m1" || ds[2].Target() != "multi/m1" {
		t.Errorf("Target %q %q", ds[0].Target(), ds[2].Target())
	}
	if h := ds[0].Header; h.Get("OpenAI-Organization") != "org-acme" || h.Get("X-Plain") != "plain" {
		t.Errorf("Header %v", h)
	}
	ds[0].Header.Set("X-Plain", "changed")
	if ds[1].Header.Get("X-Plain") != "plain" {
		t.Error("deployments share one Header map")
	}
	if ds[4].Header != nil {
		t.Errorf("provider without headers: Header %v", ds[4].Header)
	}

	// Nothing that prints a deployment shows its key or header values.
	secrets := []string{"sk-aaa", "sk-bbb", "sk-ccc", "sk-from-file", "org-acme"}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for _, d := range ds {
		js, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("deployment", "d", d, "p", &d)
		out := fmt.Sprintf("%v %+v %#v %s %q %d %x %v", d, d, d, d, d, d, d, []Deployment{d}) + d.String() + string(js)
		noSecret(t, "formatting", out, secrets...)
		if !strings.Contains(out, d.Name) || !strings.Contains(out, d.KeyLabel) {
			t.Errorf("formatting lost the name or label: %s", out)
		}
	}
	noSecret(t, "slog", logs.String(), secrets...)
	if !strings.Contains(logs.String(), "d.name=multi#1/m1") {
		t.Errorf("LogValue: %s", logs.String())
	}
}

func TestDeploymentsErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := write("empty", " \n")
	twoLines := write("two", "sk-secret-one\nsk-secret-two\n")
	big := write("big", strings.Repeat("k", maxKeyFileBytes+1))
	c := mustParse(t, fmt.Sprintf(`
providers:
  - {name: unset, base_url: 'https://a/v1', api_key_env: UNSET_KEY, models: [m]}
  - {name: spaced, base_url: 'https://a/v1', api_key_env: SPACED_KEY, models: [m]}
  - {name: missing, base_url: 'https://a/v1', api_key_file: %s, models: [m]}
  - {name: empty, base_url: 'https://a/v1', api_key_file: %s, models: [m]}
  - {name: two, base_url: 'https://a/v1', api_key_file: %s, models: [m]}
  - {name: big, base_url: 'https://a/v1', api_key_file: %s, models: [m]}
  - {name: dup, base_url: 'https://a/v1', api_key_envs: [DUP_A, DUP_B], models: [m]}
  - {name: hdr, base_url: 'https://a/v1', api_key_env: OK_KEY, models: [m], headers: {X-Org: '${NO_ORG}', X-Bad: '${BAD_VALUE}'}}
`, filepath.Join(dir, "nope"), empty, twoLines, big), nil)
	getenv := env(map[string]string{
		"SPACED_KEY": "sk-has space", "DUP_A": "sk-dup-secret", "DUP_B": "sk-dup-secret", "OK_KEY": "sk-ok",
		"BAD_VALUE": "a\r\nInjected: sk-injected",
	})
	ds, err := c.Deployments(getenv)
	if ds != nil || !errors.Is(err, ErrSecret) {
		t.Fatalf("Deployments = %v, %v", ds, err)
	}
	want := []string{
		"config: cannot resolve secret: providers[0].api_key_env: $UNSET_KEY is not set or empty; export the provider's API key in it",
		"config: cannot resolve secret: providers[1].api_key_env: $SPACED_KEY contains spaces or control characters; check its value",
		"config: cannot resolve secret: providers[2].api_key_file: open " + filepath.Join(dir, "nope") + ": no such file or directory",
		"config: cannot resolve secret: providers[3].api_key_file: " + empty + " is empty; write the provider's API key in it",
		"config: cannot resolve secret: providers[4].api_key_file: " + twoLines + " holds more than one key (spaces, line breaks or control characters inside); it should hold only the key",
		"config: cannot resolve secret: providers[5].api_key_file: " + big + " is larger than 64KiB; it should hold only the key",
		"providers[6].api_key_envs[1]: holds the same key as DUP_A; every key must be different",
		"config: cannot resolve secret: providers[7].headers.X-Bad: the value, once resolved, contains a line break or NUL; check the variables it refers to",
		"config: cannot resolve secret: providers[7].headers.X-Org: $NO_ORG not set; export it",
	}
	sameProblems(t, problems(err), want)
	noSecret(t, "error", err.Error(), "sk-has space", "sk-secret-one", "sk-dup-secret", "sk-injected", "kkkkkkkk")
	var fe *FieldError
	if !errors.As(err, &fe) || !isInvalid(err) {
		t.Error("duplicate keys are not a FieldError")
	}
}

func TestLimitsOverride(t *testing.T) {
	c := mustParse(t, `
providers:
  - name: a
    base_url: https://a/v1
    models: [plain, lifted, merged, aliased, emptied]
    limits: &base {rpm: 100, tpm: 1000, concurrency: 5}
    model_limits:
      lifted: {rpm: 0}
      merged: {<<: *base, tpm: 7}
      aliased: *base
      emptied: {}
`, nil)
	want := map[string]Limits{
		"a/plain":   {RPM: 100, TPM: 1000, Concurrency: 5},
		"a/lifted":  {RPM: 0, TPM: 1000, Concurrency: 5},
		"a/merged":  {RPM: 100, TPM: 7, Concurrency: 5},
		"a/aliased": {RPM: 100, TPM: 1000, Concurrency: 5},
		"a/emptied": {RPM: 100, TPM: 1000, Concurrency: 5},
	}
	ds, err := c.Deployments(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Limits != want[d.Name] {
			t.Errorf("%s: %+v, want %+v", d.Name, d.Limits, want[d.Name])
		}
	}
	// In Go, a zero field does not override.
	base := Limits{RPM: 1, TPM: 2, Concurrency: 3}
	if got := base.Override(Limits{TPM: 9}); got != (Limits{RPM: 1, TPM: 9, Concurrency: 3}) {
		t.Errorf("Override = %+v", got)
	}
	if got := base.Override(Limits{}); got != base {
		t.Errorf("Override(zero) = %+v", got)
	}
}

func TestTargets(t *testing.T) {
	c := mustParse(t, `
providers:
  - {name: a, base_url: 'https://a/v1', models: [gpt-4o, shared, meta/llama]}
  - {name: b, base_url: 'https://b/v1', models: [shared, gpt-4o-mini]}
models:
  - {name: smart, targets: [b/gpt-4o-mini, a/gpt-4o]}
  - {name: gpt-4o-mini, targets: [a/gpt-4o]}
`, nil)
	route := c.Router()
	for _, tc := range []struct {
		model string
		want  []string
		ok    bool
	}{
		{"smart", []string{"b/gpt-4o-mini", "a/gpt-4o"}, true},
		{"shared", []string{"a/shared", "b/shared"}, true}, // configuration order
		{"gpt-4o", []string{"a/gpt-4o"}, true},
		{"gpt-4o-mini", []string{"a/gpt-4o"}, true}, // the alias wins over the model
		{"b/gpt-4o-mini", []string{"b/gpt-4o-mini"}, true},
		{"meta/llama", []string{"a/meta/llama"}, true}, // model ids may hold slashes
		{"a/meta/llama", []string{"a/meta/llama"}, true},
		{"b/gpt-4o", nil, false}, // b does not serve it
		{"c/gpt-4o", nil, false},
		{"unknown", nil, false},
		{"", nil, false},
	} {
		got, ok := c.Targets(tc.model)
		if ok != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("Targets(%q) = %q, %v; want %q, %v", tc.model, got, ok, tc.want, tc.ok)
		}
		// Router is the same answer from a table.
		if got, ok := route(tc.model); ok != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("Router()(%q) = %q, %v; want %q, %v", tc.model, got, ok, tc.want, tc.ok)
		}
	}
	got, _ := c.Targets("smart")
	got[0] = "changed"
	if again, _ := c.Targets("smart"); again[0] != "b/gpt-4o-mini" {
		t.Error("Targets returned the Config's own slice")
	}
}

func TestTenantKeys(t *testing.T) {
	c := mustParse(t, providerBlock+`
tenants:
  - {name: a, api_key_env: A_KEY}
  - {name: b, api_key_sha256: `+strings.ToUpper(shaTest)+`}
`, nil)
	keys, err := c.TenantKeys(env(map[string]string{"A_KEY": " tenant-a-secret\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[HashKey("tenant-a-secret")] != &c.Tenants[0] || keys[shaTest] != &c.Tenants[1] {
		t.Errorf("TenantKeys = %v", keys)
	}
	if HashKey("test") != shaTest {
		t.Errorf("HashKey(test) = %s", HashKey("test"))
	}

	_, err = c.TenantKeys(nil)
	if !errors.Is(err, ErrSecret) || err.Error() != "config: cannot resolve secret: tenants[0].api_key_env: $A_KEY is not set or empty; export tenant a's key in it, or use api_key_sha256" {
		t.Errorf("unset key: %v", err)
	}

	// A key in the environment that another tenant has by hash.
	_, err = c.TenantKeys(env(map[string]string{"A_KEY": "test"}))
	sameProblems(t, problems(err), []string{"tenants[1].api_key_sha256: the same key as tenant a; every tenant needs its own key"})
	noSecret(t, "error", err.Error(), "test\"", " test ")

	// Built in Go, without Validate.
	bare := &Config{Tenants: []Tenant{{Name: "x"}}}
	if _, err := bare.TenantKeys(nil); !isInvalid(err) {
		t.Errorf("tenant without key: %v", err)
	}
}

func TestHeaderRefs(t *testing.T) {
	getenv := env(map[string]string{"A": "1", "B_2": "two"})
	for _, tc := range []struct {
		in, want string
		err      bool
	}{
		{"plain", "plain", false},
		{"${A}", "1", false},
		{"x-${A}-${B_2}-${A}", "x-1-two-1", false},
		{"costs $5 or $", "costs $5 or $", false},
		{"${MISSING}", "", true},
		{"${A", "", true},
		{"${}", "", true},
		{"${1A}", "", true},
		{"${A B}", "", true},
	} {
		got, err := expandRefs(tc.in, getenv)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("expandRefs(%q) = %q, %v", tc.in, got, err)
		}
	}
}

func TestLimitsCompareAsLiterals(t *testing.T) {
	c := mustParse(t, `
providers: [{name: a, base_url: 'https://a/v1', models: [m], limits: {rpm: 1, tpm: 0}}]
tenants: [{name: t, api_key_env: T, limits: {rpm: 2}, model_limits: {m: {tpm: 3}}}]
`, nil)
	if c.Providers[0].Limits != (Limits{RPM: 1}) || c.Tenants[0].Limits != (Limits{RPM: 2}) || c.Tenants[0].ModelLimits["m"] != (Limits{TPM: 3}) {
		t.Errorf("limits read from YAML differ from literals: %+v %+v", c.Providers[0].Limits, c.Tenants[0])
	}
}

func TestSimConfig(t *testing.T) {
	c := mustParse(t, `
providers:
  - name: s
    type: simulated
    models: [gpt-4.1, text-embedding-3-small, gpt-4o-mini]
    simulated: {rpm: 1, tpm: 2, concurrency: 3, ttft: 4ms, token_delay: 5ms, jitter: 0.5, error_rate: 0.25, drop_rate: 0.125, seed: 9}
`, nil)
	sc := c.Providers[0].SimConfig()
	if !slices.Equal(sc.Models, []string{"gpt-4.1", "gpt-4o-mini"}) || !slices.Equal(sc.EmbeddingModels, []string{"text-embedding-3-small"}) ||
		sc.RPM != 1 || sc.TPM != 2 || sc.Concurrency != 3 || sc.TTFT != 4*time.Millisecond || sc.TokenDelay != 5*time.Millisecond ||
		sc.Jitter != 0.5 || sc.ErrorRate != 0.25 || sc.DropRate != 0.125 || sc.Seed != 9 {
		t.Errorf("SimConfig = %+v", sc)
	}
	if err := sc.Validate(); err != nil {
		t.Errorf("sim refuses what config accepted: %v", err)
	}
}

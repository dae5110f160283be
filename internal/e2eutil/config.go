package e2eutil

import (
	"fmt"
	"strings"
	"testing"
)

// GatewayConfig is the YAML configuration of the test replicas: one
// provider "sim" (the test's simulated provider, model gpt-4.1, key in
// $E2E_PROVIDER_KEY) and one tenant "team-a" (key in $E2E_TENANT_KEY).
type GatewayConfig struct {
	Store          string
	SimURL         string
	Limits         string // the provider's limits, a YAML flow mapping; "" for none
	MaxWait        string // "" for the default
	RequestTimeout string // "" for the default
	MaxAttempts    int    // 0 for the default
	LogLevel       string // "" for debug
	Budget         string // the tenant's budget, a YAML flow mapping; "" for none
	// Extra is YAML appended at the top level (for example "budget: ...").
	Extra string
	// Models are the models of provider "sim"; default gpt-4.1.
	Models []string
	// BadProvider adds a provider "other" on the same simulated upstream
	// with a key it refuses ($E2E_OTHER_KEY), serving model gpt-4.1-mini.
	BadProvider bool
}

// YAML is the configuration file's content.
func (c GatewayConfig) YAML() string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nstore: %q\n", c.Store)
	if c.MaxWait != "" {
		fmt.Fprintf(&b, "max_wait: %s\n", c.MaxWait)
	}
	if c.RequestTimeout != "" {
		fmt.Fprintf(&b, "request_timeout: %s\n", c.RequestTimeout)
	}
	level := c.LogLevel
	if level == "" {
		level = "debug"
	}
	fmt.Fprintf(&b, "log: {level: %s}\n", level)
	b.WriteString("upstream:\n  backoff_base: 10ms\n  backoff_max: 100ms\n")
	if c.MaxAttempts != 0 {
		fmt.Fprintf(&b, "  max_attempts: %d\n", c.MaxAttempts)
	}
	models := "gpt-4.1"
	if len(c.Models) > 0 {
		models = strings.Join(c.Models, ", ")
	}
	fmt.Fprintf(&b, "providers:\n  - name: sim\n    base_url: %s\n    api_key_env: E2E_PROVIDER_KEY\n    models: [%s]\n", c.SimURL, models)
	if c.Limits != "" {
		fmt.Fprintf(&b, "    limits: %s\n", c.Limits)
	}
	if c.BadProvider {
		fmt.Fprintf(&b, "  - name: other\n    base_url: %s\n    api_key_env: E2E_OTHER_KEY\n    models: [gpt-4.1-mini]\n", c.SimURL)
	}
	b.WriteString("tenants:\n  - name: team-a\n    api_key_env: E2E_TENANT_KEY\n")
	if c.Budget != "" {
		fmt.Fprintf(&b, "    budget: %s\n", c.Budget)
	}
	b.WriteString(c.Extra)
	return b.String()
}

// TenantYAML is c's configuration with settings, YAML lines indented for
// an entry of tenants:, added to tenant team-a.
func TenantYAML(t testing.TB, c GatewayConfig, settings string) string {
	t.Helper()
	const anchor = "    api_key_env: E2E_TENANT_KEY\n"
	y := c.YAML()
	if strings.Count(y, anchor) != 1 {
		t.Fatalf("tenant team-a's entry not found in the configuration:\n%s", y)
	}
	return strings.Replace(y, anchor, anchor+settings, 1)
}

package app

import (
	"strings"
	"testing"

	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestRedisWarnings: budgets on a real Redis without AOF, with an
// evicting policy, or with fewer replicas than budget.ack_replicas, are
// warned about; with AOF and noeviction, or without budgets, nothing is
// said.
func TestRedisWarnings(t *testing.T) {
	withBudget := &config.Config{Tenants: []config.Tenant{{Name: "a", Budget: &config.TenantBudget{Tokens: 10}}}}
	noBudget := &config.Config{Tenants: []config.Tenant{{Name: "a"}}}
	ackTwo := &config.Config{Tenants: withBudget.Tenants, Budget: config.BudgetStore{AckReplicas: 2}}
	for _, tc := range []struct {
		name string
		args []string
		cfg  *config.Config
		want []string
	}{
		{"no persistence", nil, withBudget, []string{"without appendonly"}},
		{"aof", []string{"--appendonly", "yes"}, withBudget, nil},
		{"aof but evicting", []string{"--appendonly", "yes", "--maxmemory-policy", "allkeys-lru"}, withBudget, []string{"maxmemory-policy allkeys-lru"}},
		{"no budgets", nil, noBudget, nil},
		{"acks from replicas it has not", []string{"--appendonly", "yes"}, ackTwo, []string{"ack_replicas is 2, but the store's master has 0 replicas"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rds := testutil.StartRedisArgs(t, tc.args...)
			got, err := redisWarnings(t.Context(), rds.Client(t), tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("warnings %q, want %d matching %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q does not say %q", got[i], w)
				}
			}
		})
	}
}

func TestInfoField(t *testing.T) {
	info := "# Persistence\r\nloading:0\r\naof_enabled:1\r\naof_rewrite_in_progress:0\r\n"
	if v, ok := infoField(info, "aof_enabled"); !ok || v != "1" {
		t.Fatalf("aof_enabled = %q, %v", v, ok)
	}
	if _, ok := infoField(info, "aof"); ok {
		t.Fatal("a prefix of a field was found")
	}
}

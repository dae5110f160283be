package app

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestRedisWarnings: on a real Redis, set by CONFIG SET case by case,
// budgets without AOF, with an evicting policy or with fewer replicas
// than budget.ack_replicas are warned about, a
// coordination store that may evict any key too, and a cache store that
// is unbounded or refuses writes when full; a store set as docs/deploy.md
// says gets no warning.
func TestRedisWarnings(t *testing.T) {
	withBudget := &config.Config{Tenants: []config.Tenant{{Name: "a", Budget: &config.TenantBudget{Tokens: 10}}}}
	noBudget := &config.Config{Tenants: []config.Tenant{{Name: "a"}}}
	noBudget.Cache.MaxBytesPerTenant = 64 << 20
	ackTwo := &config.Config{Tenants: withBudget.Tenants, Budget: config.BudgetStore{AckReplicas: 2}}
	rds := testutil.StartRedis(t)
	client := rds.Client(t)
	for _, tc := range []struct {
		name  string
		set   []string // CONFIG SET arguments
		cfg   *config.Config
		check func(context.Context, rueidis.Client, *config.Config) ([]string, error)
		want  []string
	}{
		{"no persistence", []string{"appendonly", "no", "maxmemory-policy", "noeviction"}, withBudget, redisWarnings, []string{"without appendonly"}},
		{"aof", []string{"appendonly", "yes"}, withBudget, redisWarnings, nil},
		{"aof but evicting", []string{"maxmemory-policy", "allkeys-lru"}, withBudget, redisWarnings, []string{"maxmemory-policy allkeys-lru: an evicted key is spend forgotten"}},
		{"no budgets, evicting without maxmemory", nil, noBudget, redisWarnings, nil},
		{"no budgets, evicting any key", []string{"maxmemory", "100mb"}, noBudget, redisWarnings, []string{"maxmemory-policy allkeys-lru: when it is full, it drops keys"}},
		{"no budgets, evicting keys with a TTL", []string{"maxmemory-policy", "volatile-lru"}, noBudget, redisWarnings, []string{"maxmemory-policy volatile-lru: when it is full, it drops keys"}},
		{"no budgets, noeviction", []string{"maxmemory-policy", "noeviction"}, noBudget, redisWarnings, nil},
		{"cache refusing writes when full", nil, noBudget, cacheRedisWarnings, []string{"noeviction: once full it refuses writes"}},
		{"cache as deploy.md says", []string{"maxmemory-policy", "allkeys-lru"}, noBudget, cacheRedisWarnings, nil},
		{"cache without maxmemory", []string{"maxmemory", "0"}, noBudget, cacheRedisWarnings, []string{"without maxmemory: it holds up to cache.max_bytes_per_tenant (64MiB) per tenant"}},
		{"acks from replicas it has not", []string{"maxmemory-policy", "noeviction"}, ackTwo, redisWarnings, []string{"ack_replicas is 2, but the store's master has 0 replicas"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.set) > 0 {
				if err := client.Do(t.Context(), client.B().Arbitrary("CONFIG", "SET").Args(tc.set...).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			got, err := tc.check(t.Context(), client, tc.cfg)
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

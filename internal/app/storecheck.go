package app

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/config"
)

// hasBudgets reports whether any tenant of cfg has a budget cap.
func hasBudgets(cfg *config.Config) bool {
	for _, t := range cfg.Tenants {
		if t.Budget != nil {
			return true
		}
	}
	return false
}

// redisWarnings returns what the coordination Redis lacks for cfg.
// Budgets need persistence (spend lives only in the store: a restart
// without AOF forgets it), no eviction (an evicted counter is spend
// forgotten), and as many replicas as budget.ack_replicas waits for.
// Without budgets, a full Redis that evicts may still drop locks,
// sessions and limits: allkeys-* any key, volatile-* any key with a TTL,
// which they all have.
func redisWarnings(ctx context.Context, client rueidis.Client, cfg *config.Config) ([]string, error) {
	policy, maxmemory, err := evictionPolicy(ctx, client)
	if err != nil {
		return nil, err
	}
	var w []string
	if hasBudgets(cfg) {
		persistence, err := client.Do(ctx, client.B().Info().Section("persistence").Build()).ToString()
		if err != nil {
			return nil, fmt.Errorf("INFO persistence: %w", err)
		}
		if v, ok := infoField(persistence, "aof_enabled"); ok && v != "1" {
			w = append(w, "budgets are on a Redis without appendonly: a restart of it forgets every tenant's spend; set 'appendonly yes' (docs/budget.md)")
		}
		if policy != "" && policy != "noeviction" {
			w = append(w, fmt.Sprintf("budgets are on a Redis with maxmemory-policy %s: an evicted key is spend forgotten; set 'maxmemory-policy noeviction' (docs/budget.md)", policy))
		}
		if n := cfg.Budget.AckReplicas; n > 0 {
			repl, err := client.Do(ctx, client.B().Info().Section("replication").Build()).ToString()
			if err != nil {
				return w, fmt.Errorf("INFO replication: %w", err)
			}
			if v, ok := infoField(repl, "connected_slaves"); ok {
				if have, _ := strconv.Atoi(v); have < n {
					w = append(w, fmt.Sprintf("budget.ack_replicas is %d, but the store's master has %d replicas: every budget write fails, and requests of tenants with a budget are refused (docs/failover.md)", n, have))
				}
			}
		}
		return w, nil
	}
	if policy != "" && policy != "noeviction" && maxmemory != "0" {
		w = append(w, fmt.Sprintf("the store is a Redis with maxmemory and maxmemory-policy %s: when it is full, it drops keys, a held lock or a session's turn among them; set 'maxmemory-policy noeviction', and give the cache a Redis of its own (docs/deploy.md)", policy))
	}
	return w, nil
}

// cacheRedisWarnings returns what the cache's own Redis lacks: a bound
// and an eviction policy that makes room. With noeviction, a full Redis
// refuses writes: new answers are not cached.
func cacheRedisWarnings(ctx context.Context, client rueidis.Client, cfg *config.Config) ([]string, error) {
	policy, maxmemory, err := evictionPolicy(ctx, client)
	if err != nil {
		return nil, err
	}
	switch {
	case maxmemory == "0":
		return []string{fmt.Sprintf("cache.store is a Redis without maxmemory: it holds up to cache.max_bytes_per_tenant (%s) per tenant, however much memory that takes; set maxmemory and 'maxmemory-policy allkeys-lru' (docs/cache.md)", cfg.Cache.MaxBytesPerTenant)}, nil
	case policy == "noeviction":
		return []string{"cache.store is a Redis with maxmemory-policy noeviction: once full it refuses writes, and new answers are not cached; set 'maxmemory-policy allkeys-lru' (docs/cache.md)"}, nil
	}
	return nil, nil
}

// evictionPolicy returns a Redis's maxmemory-policy and maxmemory ("" for
// a field INFO does not have).
func evictionPolicy(ctx context.Context, client rueidis.Client) (policy, maxmemory string, err error) {
	memory, err := client.Do(ctx, client.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		return "", "", fmt.Errorf("INFO memory: %w", err)
	}
	policy, _ = infoField(memory, "maxmemory_policy")
	maxmemory, _ = infoField(memory, "maxmemory")
	return policy, maxmemory, nil
}

// infoField returns the value of name in an INFO reply.
func infoField(info, name string) (string, bool) {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), name+":"); ok {
			return v, true
		}
	}
	return "", false
}

// storeCheckTimeout bounds the store checks at start and in check-config.
const storeCheckTimeout = 2 * time.Second

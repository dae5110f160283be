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

// redisWarnings returns what a Redis store lacks for cfg: budgets need
// persistence (spend lives only in the store: a restart without AOF
// forgets it), no eviction (an evicted counter is spend forgotten), and
// as many replicas as budget.ack_replicas waits for.
func redisWarnings(ctx context.Context, client rueidis.Client, cfg *config.Config) ([]string, error) {
	if !hasBudgets(cfg) {
		return nil, nil
	}
	persistence, err := client.Do(ctx, client.B().Info().Section("persistence").Build()).ToString()
	if err != nil {
		return nil, fmt.Errorf("INFO persistence: %w", err)
	}
	memory, err := client.Do(ctx, client.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		return nil, fmt.Errorf("INFO memory: %w", err)
	}
	var w []string
	if v, ok := infoField(persistence, "aof_enabled"); ok && v != "1" {
		w = append(w, "budgets are on a Redis without appendonly: a restart of it forgets every tenant's spend; set 'appendonly yes' (docs/budget.md)")
	}
	if v, ok := infoField(memory, "maxmemory_policy"); ok && v != "noeviction" {
		w = append(w, fmt.Sprintf("budgets are on a Redis with maxmemory-policy %s: an evicted key is spend forgotten; set 'maxmemory-policy noeviction' (docs/budget.md)", v))
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

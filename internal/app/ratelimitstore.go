package app

import (
	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/gateway"
	"github.com/llmgate/llmgate/ratelimit"
	rlredis "github.com/llmgate/llmgate/ratelimit/redis"
)

// redisLimits is the rate-limit backend on Redis. On a Cluster each
// deployment's and each tenant's limits are a group (a hash tag) of their
// own, so that they spread over the shards (gateway.LimitGroup); elsewhere
// one group holds them all and every decision is one script.
func redisLimits(c rueidis.Client) ratelimit.Backend {
	if c.Mode() != rueidis.ClientModeCluster {
		return rlredis.New(c, rlredis.Config{})
	}
	return ratelimit.NewSharded(gateway.LimitGroup, func(group string) ratelimit.Backend {
		return rlredis.New(c, rlredis.Config{Group: group})
	})
}

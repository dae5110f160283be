package redis_test

import (
	"os"
	"testing"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/locktest"
	"github.com/llmgate/llmgate/lock/redis"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// TestConformanceCluster3 runs the suite on a Cluster of 3 masters with a
// replica each: every lock key carries its own hash tag, so distinct locks
// spread over the shards, which the test checks.
func TestConformanceCluster3(t *testing.T) {
	c := testutil.SharedCluster(t)
	check := c.TrackSpread(t, 10)
	locktest.Run(t, func(t *testing.T) lock.Backend {
		return redis.New(c.Client(t), redis.Config{})
	})
	check()
}

// TestConformanceSentinel runs the suite through a Sentinel client: the
// master found through 3 sentinels, with 2 replicas.
func TestConformanceSentinel(t *testing.T) {
	s := testutil.SharedSentinel(t)
	locktest.Run(t, func(t *testing.T) lock.Backend {
		return redis.New(s.Client(t), redis.Config{})
	})
}

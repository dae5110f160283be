package redis_test

import (
	"os"
	"testing"

	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/dedup/deduptest"
	"github.com/llmgate/llmgate/dedup/redis"
	"github.com/llmgate/llmgate/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// TestConformanceCluster3 runs the suite on a Cluster of 3 masters with a
// replica each. A flight's keys share one hash tag (its key), so distinct
// flights spread over the shards, which the test checks.
func TestConformanceCluster3(t *testing.T) {
	c := testutil.SharedCluster(t)
	check := c.TrackSpread(t, 10)
	deduptest.Run(t, func(t *testing.T) dedup.Backend {
		return redis.New(c.Client(t), redis.Config{})
	})
	check()
}

// TestConformanceSentinel runs the suite through a Sentinel client.
func TestConformanceSentinel(t *testing.T) {
	s := testutil.SharedSentinel(t)
	deduptest.Run(t, func(t *testing.T) dedup.Backend {
		return redis.New(s.Client(t), redis.Config{})
	})
}

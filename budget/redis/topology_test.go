package redis_test

import (
	"os"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/budget/budgettest"
	"github.com/llmgate/llmgate/budget/redis"
	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// TestConformanceCluster3 runs the suite on a Cluster of 3 masters with a
// replica each. A budget's keys share one hash tag (tenant and window), so
// distinct tenants and periods spread over the shards, which the test
// checks.
func TestConformanceCluster3(t *testing.T) {
	c := testutil.SharedCluster(t)
	// The server must refuse a cross-slot script, or this test proves
	// nothing about the key layout.
	if line, _ := c.Nodes[0].Do(t.Context(), "EVAL", "return 1", "2", "{a}x", "{b}x"); !strings.HasPrefix(line, "-CROSSSLOT") {
		t.Fatalf("a cross-slot EVAL answered %q, want a CROSSSLOT error", line)
	}
	check := c.TrackSpread(t, 10)
	budgettest.Run(t, func(t *testing.T, _ clock.Clock) func() budget.Backend {
		return func() budget.Backend { return redis.New(c.Client(t), redis.Config{}) }
	})
	check()
}

// TestConformanceSentinel runs the suite through a Sentinel client.
func TestConformanceSentinel(t *testing.T) {
	s := testutil.SharedSentinel(t)
	budgettest.Run(t, func(t *testing.T, _ clock.Clock) func() budget.Backend {
		return func() budget.Backend { return redis.New(s.Client(t), redis.Config{}) }
	})
}

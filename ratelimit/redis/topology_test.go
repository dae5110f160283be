package redis_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"sync"
	"testing"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/ratelimittest"
	"github.com/llmgate/llmgate/ratelimit/redis"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// groupOf names a subtest's limiter group: every backend of one subtest
// (its "replicas") shares it, and subtests differ. One group is one hash
// tag, so all of a limiter's keys are in one slot; only distinct groups
// spread over the shards.
func groupOf(t *testing.T) string {
	h := sha256.Sum256([]byte(t.Name()))
	return "g" + hex.EncodeToString(h[:4])
}

// inspectedGroup is inspected for a backend of another group.
type inspectedGroup struct {
	*redis.Backend
	c     rueidis.Client
	group string
}

var _ ratelimittest.Inspector = inspectedGroup{}

func (b inspectedGroup) Waiters(ctx context.Context, lane string) (int, error) {
	key := redis.DefaultPrefix + "{" + b.group + "}:q:" + lane
	n, err := b.c.Do(ctx, b.c.B().Zcard().Key(key).Build()).AsInt64()
	return int(n), err
}

// TestConformanceCluster3 runs the suite on a Cluster of 3 masters with a
// replica each, each subtest with its own group, and checks that the
// groups spread over the shards.
func TestConformanceCluster3(t *testing.T) {
	c := testutil.SharedCluster(t)
	check := c.TrackSpread(t, 10)
	ratelimittest.Run(t, func(t *testing.T) ratelimit.Backend {
		cl := c.Client(t)
		return inspectedGroup{Backend: redis.New(cl, redis.Config{Group: groupOf(t)}), c: cl, group: groupOf(t)}
	})
	check()
}

// TestConformanceShardedCluster3 runs the cross-group cases on the Cluster:
// each group is its own hash tag, so the parts of a request are on
// different shards. The groups of a subtest share one client, as a
// gateway's do (a Cluster client is slow to start).
func TestConformanceShardedCluster3(t *testing.T) {
	c := testutil.SharedCluster(t)
	var clients sync.Map // *testing.T -> rueidis.Client
	ratelimittest.RunSharded(t, func(t *testing.T, g string) ratelimit.Backend {
		v, ok := clients.Load(t)
		if !ok {
			v, _ = clients.LoadOrStore(t, c.Client(t))
		}
		cl := v.(rueidis.Client)
		return inspectedGroup{Backend: redis.New(cl, redis.Config{Group: g}), c: cl, group: g}
	})
}

// TestConformanceShardedSentinel runs the cross-group cases through a
// Sentinel client.
func TestConformanceShardedSentinel(t *testing.T) {
	s := testutil.SharedSentinel(t)
	ratelimittest.RunSharded(t, func(t *testing.T, g string) ratelimit.Backend {
		cl := s.Client(t)
		return inspectedGroup{Backend: redis.New(cl, redis.Config{Group: g}), c: cl, group: g}
	})
}

// TestConformanceSentinel runs the suite through a Sentinel client.
func TestConformanceSentinel(t *testing.T) {
	s := testutil.SharedSentinel(t)
	ratelimittest.Run(t, func(t *testing.T) ratelimit.Backend {
		cl := s.Client(t)
		return inspected{Backend: redis.New(cl, redis.Config{}), c: cl}
	})
}

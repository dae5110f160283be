package respcache_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// TestRedisConformanceCluster3 runs the suite on a Cluster of 3 masters
// with a replica each. Each answer is one key without a hash tag, so
// answers spread over the shards, which the test checks.
func TestRedisConformanceCluster3(t *testing.T) {
	c := testutil.SharedCluster(t)
	cl := c.Client(t)
	check := c.TrackSpread(t, 10)
	runConformance(t, func(t *testing.T) harness {
		prefix := uniquePrefix()
		return harness{
			store:   respcache.NewRedis(cl, prefix, respcache.WithMaxEntryBytes(conformanceMaxEntry), respcache.WithTenantBytes(conformanceTenantBytes)),
			tenant:  "t" + strings.TrimSuffix(prefix, ":"),
			advance: func(t *testing.T, d time.Duration) { advanceCluster(t, c, cl, prefix, d) },
		}
	})
	check()
}

// TestRedisConformanceSentinel runs the suite through a Sentinel client.
func TestRedisConformanceSentinel(t *testing.T) {
	s := testutil.SharedSentinel(t)
	cl := s.Client(t)
	runConformance(t, func(t *testing.T) harness {
		prefix := uniquePrefix()
		return harness{
			store:   respcache.NewRedis(cl, prefix, respcache.WithMaxEntryBytes(conformanceMaxEntry), respcache.WithTenantBytes(conformanceTenantBytes)),
			tenant:  "t" + strings.TrimSuffix(prefix, ":"),
			advance: func(t *testing.T, d time.Duration) { advanceRedis(t, cl, prefix, d) },
		}
	})
}

// advanceCluster is advanceRedis on a Cluster, whose KEYS sees one node:
// it lists each master's keys and moves them through the Cluster client.
func advanceCluster(t *testing.T, c *testutil.Cluster, cl rueidis.Client, prefix string, d time.Duration) {
	t.Helper()
	ctx := t.Context()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range masters {
		res, err := m.Command(ctx, "KEYS", prefix+"*")
		if err != nil {
			t.Fatalf("KEYS: %v", err)
		}
		keys, err := res.AsStrSlice()
		if err != nil {
			t.Fatalf("KEYS: %v", err)
		}
		for _, k := range keys {
			pttl, err := cl.Do(ctx, cl.B().Pttl().Key(k).Build()).AsInt64()
			if err != nil {
				t.Fatalf("PTTL %s: %v", k, err)
			}
			if pttl < 0 {
				t.Fatalf("key %s has no TTL (PTTL %d)", k, pttl)
			}
			if pttl <= d.Milliseconds() {
				err = cl.Do(ctx, cl.B().Del().Key(k).Build()).Error()
			} else {
				err = cl.Do(ctx, cl.B().Pexpire().Key(k).Milliseconds(pttl-d.Milliseconds()).Build()).Error()
			}
			if err != nil {
				t.Fatalf("advancing %s: %v", k, err)
			}
		}
	}
}

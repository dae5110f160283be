package testutil

import (
	"testing"

	"github.com/redis/rueidis"
)

// ClusterClient returns a rueidis client for a server started by
// StartCluster, closed when the test ends. It fails the test unless the
// client runs in cluster mode: a suite run on a standalone client would
// prove nothing about cross-slot keys.
func (r *Redis) ClusterClient(tb testing.TB) rueidis.Client {
	tb.Helper()
	c := r.Client(tb)
	if c.Mode() != rueidis.ClientModeCluster {
		tb.Fatalf("client mode %v, want cluster", c.Mode())
	}
	return c
}

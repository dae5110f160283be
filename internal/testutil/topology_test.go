package testutil

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestCluster3: the shared Cluster has three masters, keys spread over
// them, a client writes through it, and a manual failover moves a master's
// slots to its replica with the data.
func TestCluster3(t *testing.T) {
	c := SharedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*topologyTimeout)
	defer cancel()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) != 3 {
		t.Fatalf("%d masters, want 3", len(masters))
	}
	cl := c.Client(t)
	seen := map[*Redis]bool{}
	for i := range 30 {
		k := fmt.Sprintf("topo:{k%d}", i)
		if err := cl.Do(ctx, cl.B().Set().Key(k).Value("v").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		m, err := c.MasterOf(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		seen[m] = true
	}
	if len(seen) != 3 {
		t.Errorf("30 keys landed on %d masters, want 3", len(seen))
	}
	per, err := c.KeysPerMaster(ctx, "topo:*")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for m, n := range per {
		t.Logf("%s: %d keys", m.Addr, n)
		total += n
	}
	if total != 30 {
		t.Errorf("KeysPerMaster counts %d keys, want 30", total)
	}

	old, err := c.MasterOf(ctx, "topo:{k0}")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	nm, err := c.Failover(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CLUSTER FAILOVER of %s to %s settled in %v", old.Addr, nm.Addr, time.Since(start))
	if got, err := c.MasterOf(ctx, "topo:{k0}"); err != nil || got != nm {
		t.Fatalf("after failover topo:{k0} is on %v (%v), want %s", got, err, nm.Addr)
	}
	if v, err := cl.Do(ctx, cl.B().Get().Key("topo:{k0}").Build()).ToString(); err != nil || v != "v" {
		t.Fatalf("GET after failover = %q, %v", v, err)
	}
}

// TestClusterKillMaster: a killed master's replica takes over within a few
// node timeouts and the old master rejoins as a replica.
func TestClusterKillMaster(t *testing.T) {
	c := SharedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*topologyTimeout)
	defer cancel()
	old, err := c.MasterOf(ctx, "topo:{kill}")
	if err != nil {
		t.Fatal(err)
	}
	nm, down, err := c.KillMaster(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed master %s: %s took over after %v", old.Addr, nm.Addr, down)
	if role, err := old.Role(ctx); err != nil || role != "slave" {
		t.Errorf("old master is %q (%v), want a replica", role, err)
	}
}

// TestSentinel: the shared Sentinel topology answers through a Sentinel
// client, and a SENTINEL FAILOVER and a killed master each move the client
// to a new master that has the data.
func TestSentinel(t *testing.T) {
	s := SharedSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*topologyTimeout)
	defer cancel()
	cl := s.Client(t)
	if err := cl.Do(ctx, cl.B().Set().Key("topo:a").Value("1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// Make sure the write reached both replicas before failing over.
	if n, err := cl.Do(ctx, cl.B().Wait().Numreplicas(2).Timeout(10000).Build()).AsInt64(); err != nil || n != 2 {
		t.Fatalf("WAIT = %d, %v", n, err)
	}
	old, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	nm, err := s.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SENTINEL FAILOVER %s -> %s settled in %v", old.Addr, nm.Addr, time.Since(start))
	if nm == old {
		t.Fatal("the master did not change")
	}
	if err := waitFor(ctx, topologyTimeout, "client follows", func() error {
		v, err := cl.Do(ctx, cl.B().Get().Key("topo:a").Build()).ToString()
		if err == nil && v != "1" {
			return fmt.Errorf("GET = %q", v)
		}
		if err == nil {
			err = cl.Do(ctx, cl.B().Set().Key("topo:b").Value("2").Build()).Error()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}

	nm2, down, err := s.KillMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed master %s: %s promoted after %v", nm.Addr, nm2.Addr, down)
	if role, err := nm.Role(ctx); err != nil || role != "slave" {
		t.Errorf("old master is %q (%v), want a replica", role, err)
	}
}

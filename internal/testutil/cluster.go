package testutil

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// Cluster is a Redis Cluster of 3 masters and 3 replicas on loopback.
type Cluster struct {
	Nodes   []*Redis      // the six nodes; which are masters changes with failovers
	Started time.Duration // how long it took to start and settle
	dir     string
	ids     map[*Redis]string // node ID of each node
	bus     map[*Redis]int    // cluster bus port of each node

	cutMu      sync.Mutex // protects resume and cutReplica
	resume     func()     // resumes replicas paused by CutReplication
	cutReplica *Redis     // the replica CutReplication paused
}

// SlotRange is one range of hash slots and the nodes serving it.
type SlotRange struct {
	Start, End int
	Master     *Redis
	Replicas   []*Redis
}

// StartCluster3 starts a 3+3 Redis Cluster for this test alone and stops it
// when the test ends. Prefer SharedCluster: starting one takes seconds.
func StartCluster3(tb testing.TB) *Cluster {
	tb.Helper()
	c, err := NewCluster3(tb.TempDir())
	if err != nil {
		tb.Fatalf("start cluster: %v", err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// NewCluster3 starts a 3+3 Redis Cluster with its nodes' directories under
// dir and waits until every node agrees on the slot map and reports
// cluster_state:ok. The caller must call Stop.
func NewCluster3(dir string) (*Cluster, error) {
	start := time.Now()
	c := &Cluster{dir: dir, ids: map[*Redis]string{}, bus: map[*Redis]int{}}
	ctx := context.Background()
	for i := range 6 {
		r, bus, err := newClusterNode(filepath.Join(dir, "node"+strconv.Itoa(i)))
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, r)
		c.bus[r] = bus
		id, err := r.str(ctx, "CLUSTER", "MYID")
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.ids[r] = id
	}
	if err := c.create(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	c.Started = time.Since(start)
	return c, nil
}

// newClusterNode starts one cluster-enabled node; a taken bus port, like a
// taken client port, makes it exit, so it tries other ports.
func newClusterNode(dir string) (*Redis, int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, 0, err
	}
	for attempt := 1; ; attempt++ {
		busPort, err := FreePort()
		if err != nil {
			return nil, 0, err
		}
		r, err := NewRedisArgs(dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(busPort),
			"--cluster-node-timeout", strconv.FormatInt(ClusterNodeTimeout.Milliseconds(), 10),
			// A replica may always take over, however long its link was down.
			"--cluster-replica-validity-factor", "0",
			"--repl-diskless-sync-delay", "0", // the default waits 5s for more replicas
			// CLUSTER SLOTS hides a replica until its replication offset is
			// not 0, which on an idle master takes a replication ping.
			"--repl-ping-replica-period", "1")
		if err == nil {
			return r, busPort, nil
		}
		if !errors.Is(err, errExited) || attempt == 5 {
			return nil, 0, err
		}
	}
}

// create does what redis-cli --cluster create does, without its fixed
// one-second sleeps: slots to the first three nodes, distinct config
// epochs, MEET, then each of the last three replicates one master.
func (c *Cluster) create(ctx context.Context) error {
	ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	for i, n := range c.Nodes {
		if i < 3 {
			if err := n.ok(ctx, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(ranges[i][0]), strconv.Itoa(ranges[i][1])); err != nil {
				return err
			}
		}
		if err := n.ok(ctx, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes[1:] {
		if err := n.ok(ctx, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(c.Nodes[0].Port), strconv.Itoa(c.bus[c.Nodes[0]])); err != nil {
			return err
		}
	}
	// REPLICATE needs the master known to the replica.
	err := waitFor(ctx, topologyTimeout, "cluster nodes meet", func() error {
		for _, n := range c.Nodes {
			s, err := n.str(ctx, "CLUSTER", "NODES")
			if err != nil {
				return err
			}
			if k := strings.Count(strings.TrimSpace(s), "\n") + 1; k != 6 || strings.Contains(s, "handshake") {
				return fmt.Errorf("%s knows %d nodes", n.Addr, k)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i, n := range c.Nodes[3:] {
		if err := n.ok(ctx, "CLUSTER", "REPLICATE", c.ids[c.Nodes[i]]); err != nil {
			return err
		}
	}
	return c.WaitStable(ctx)
}

// Addrs returns every node's host:port.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		a[i] = n.Addr
	}
	return a
}

// URL returns a multi-seed URL: redis://node0?addr=node1&addr=node2...
func (c *Cluster) URL() string {
	return "redis://" + c.Nodes[0].Addr + "?addr=" + strings.Join(c.Addrs()[1:], "&addr=")
}

// Client returns a Cluster client seeded with every node, closed when the
// test ends.
func (c *Cluster) Client(tb testing.TB) rueidis.Client {
	tb.Helper()
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs(), DisableCache: true})
	if err != nil {
		tb.Fatalf("connect to cluster: %v", err)
	}
	tb.Cleanup(cl.Close)
	if cl.Mode() != rueidis.ClientModeCluster {
		tb.Fatalf("client mode %v, want cluster", cl.Mode())
	}
	return cl
}

// node returns the node listening on addr, or nil.
func (c *Cluster) node(addr string) *Redis {
	return nodeAt(c.Nodes, addr)
}

// slotsFrom reads CLUSTER SLOTS from one node.
func (c *Cluster) slotsFrom(ctx context.Context, n *Redis) ([]SlotRange, error) {
	res, err := n.Command(ctx, "CLUSTER", "SLOTS")
	if err != nil {
		return nil, err
	}
	rows, err := res.ToArray()
	if err != nil {
		return nil, fmt.Errorf("%s CLUSTER SLOTS: %w", n.Addr, err)
	}
	var out []SlotRange
	for _, row := range rows {
		f, err := row.ToArray()
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("%s CLUSTER SLOTS: bad row", n.Addr)
		}
		var sr SlotRange
		s, _ := f[0].AsInt64()
		e, _ := f[1].AsInt64()
		sr.Start, sr.End = int(s), int(e)
		for i, nf := range f[2:] {
			hp, err := nf.ToArray()
			if err != nil || len(hp) < 2 {
				return nil, fmt.Errorf("%s CLUSTER SLOTS: bad node", n.Addr)
			}
			host, _ := hp[0].ToString()
			port, _ := hp[1].AsInt64()
			node := c.node(host + ":" + strconv.FormatInt(port, 10))
			if node == nil {
				return nil, fmt.Errorf("%s CLUSTER SLOTS: unknown node %s:%d", n.Addr, host, port)
			}
			if i == 0 {
				sr.Master = node
			} else {
				sr.Replicas = append(sr.Replicas, node)
			}
		}
		out = append(out, sr)
	}
	slices.SortFunc(out, func(a, b SlotRange) int { return a.Start - b.Start })
	return out, nil
}

// Slots returns the slot map as the first running node reports it.
func (c *Cluster) Slots(ctx context.Context) ([]SlotRange, error) {
	var errs []error
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		s, err := c.slotsFrom(ctx, n)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(append(errs, errors.New("no node answered CLUSTER SLOTS"))...)
}

// Masters returns the masters serving slots, in slot order.
func (c *Cluster) Masters(ctx context.Context) ([]*Redis, error) {
	s, err := c.Slots(ctx)
	if err != nil {
		return nil, err
	}
	var m []*Redis
	for _, r := range s {
		if !slices.Contains(m, r.Master) {
			m = append(m, r.Master)
		}
	}
	return m, nil
}

// KeySlot returns key's hash slot (CLUSTER KEYSLOT).
func (c *Cluster) KeySlot(ctx context.Context, key string) (int, error) {
	var errs []error
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		res, err := n.Command(ctx, "CLUSTER", "KEYSLOT", key)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s, err := res.AsInt64()
		if err == nil {
			return int(s), nil
		}
		errs = append(errs, err)
	}
	return 0, errors.Join(append(errs, errors.New("no node answered CLUSTER KEYSLOT"))...)
}

// MasterOf returns the master serving key's slot.
func (c *Cluster) MasterOf(ctx context.Context, key string) (*Redis, error) {
	slot, err := c.KeySlot(ctx, key)
	if err != nil {
		return nil, err
	}
	s, err := c.Slots(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range s {
		if slot >= r.Start && slot <= r.End {
			return r.Master, nil
		}
	}
	return nil, fmt.Errorf("slot %d of %q is not served", slot, key)
}

// KeysPerMaster counts, on each master, the keys matching a SCAN MATCH
// pattern: how a test's keys spread over the shards.
func (c *Cluster) KeysPerMaster(ctx context.Context, pattern string) (map[*Redis]int, error) {
	masters, err := c.Masters(ctx)
	if err != nil {
		return nil, err
	}
	out := map[*Redis]int{}
	for _, m := range masters {
		n, err := scanCount(ctx, m, pattern)
		if err != nil {
			return nil, err
		}
		out[m] = n
	}
	return out, nil
}

// scanCount counts the keys of one node matching pattern.
func scanCount(ctx context.Context, r *Redis, pattern string) (int, error) {
	keys, err := r.Keys(ctx, pattern)
	return len(keys), err
}

// Keys lists the keys of this node alone matching a SCAN MATCH pattern.
func (r *Redis) Keys(ctx context.Context, pattern string) ([]string, error) {
	cursor := "0"
	var keys []string
	for range 100_000 { // bounded: a test's keyspace is small
		res, err := r.Command(ctx, "SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
		if err != nil {
			return nil, err
		}
		e, err := res.AsScanEntry()
		if err != nil {
			return nil, fmt.Errorf("%s SCAN: %w", r.Addr, err)
		}
		keys = append(keys, e.Elements...)
		if e.Cursor == 0 {
			return keys, nil
		}
		cursor = strconv.FormatUint(e.Cursor, 10)
	}
	return nil, fmt.Errorf("%s SCAN did not finish", r.Addr)
}

// DataCommands returns, for each current master, how many commands that
// read or write keys it has served (INFO commandstats, without the
// cluster, connection, Pub/Sub and introspection commands every node
// sees). Two readings around a test show which shards its keys used.
func (c *Cluster) DataCommands(ctx context.Context) (map[*Redis]int64, error) {
	masters, err := c.Masters(ctx)
	if err != nil {
		return nil, err
	}
	out := map[*Redis]int64{}
	for _, m := range masters {
		stats, err := m.info(ctx, "commandstats")
		if err != nil {
			return nil, err
		}
		for k, v := range stats {
			name, ok := strings.CutPrefix(k, "cmdstat_")
			if !ok || notData(name) {
				continue
			}
			// calls=12,usec=...
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			n, _ := strconv.ParseInt(calls, 10, 64)
			out[m] += n
		}
	}
	return out, nil
}

// notData reports commands that touch no key of a test.
func notData(name string) bool {
	for _, p := range []string{"cluster|", "client|", "command|", "config|", "script|", "function|", "memory|", "latency|", "slowlog|", "acl|", "pubsub|"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	switch name {
	case "info", "ping", "hello", "auth", "select", "readonly", "readwrite", "wait", "waitaof", "scan", "keys", "dbsize", "echo", "time",
		"publish", "subscribe", "unsubscribe", "psubscribe", "punsubscribe", "replconf", "psync", "sync", "multi", "exec", "discard":
		return true
	}
	return false
}

// Spread returns the data commands each master served between before (a
// DataCommands reading) and now, and how many masters served at least
// min of them.
func (c *Cluster) Spread(ctx context.Context, before map[*Redis]int64, min int64) (map[*Redis]int64, int, error) {
	after, err := c.DataCommands(ctx)
	if err != nil {
		return nil, 0, err
	}
	d := map[*Redis]int64{}
	used := 0
	for m, n := range after {
		d[m] = n - before[m]
		if d[m] >= min {
			used++
		}
	}
	return d, used, nil
}

// WaitStable waits until every running node reports cluster_state:ok and
// the same slot map of 3 ranges, each served by a running master with one
// running replica.
func (c *Cluster) WaitStable(ctx context.Context) error {
	return waitFor(ctx, topologyTimeout, "cluster stable", func() error {
		var first string
		for _, n := range c.Nodes {
			if !n.Running() {
				continue
			}
			info, err := n.str(ctx, "CLUSTER", "INFO")
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster state not ok", n.Addr)
			}
			s, err := c.slotsFrom(ctx, n)
			if err != nil {
				return err
			}
			if len(s) != 3 {
				return fmt.Errorf("%s sees %d slot ranges", n.Addr, len(s))
			}
			var b strings.Builder
			for _, r := range s {
				if !r.Master.Running() || len(r.Replicas) != 1 || !r.Replicas[0].Running() {
					return fmt.Errorf("%s: slots %d-%d not served by a running master with one running replica", n.Addr, r.Start, r.End)
				}
				fmt.Fprintf(&b, "%d-%d %s %s;", r.Start, r.End, r.Master.Addr, r.Replicas[0].Addr)
			}
			if first == "" {
				first = b.String()
			} else if b.String() != first {
				return fmt.Errorf("nodes disagree on the slot map: %s vs %s", first, b.String())
			}
			// A replica must also have finished its sync to be one.
			role, err := n.info(ctx, "replication")
			if err != nil {
				return err
			}
			if role["role"] == "slave" && role["master_link_status"] != "up" {
				return fmt.Errorf("%s: link to its master is %s", n.Addr, role["master_link_status"])
			}
		}
		return nil
	})
}

// replicaOf returns the running replica serving master's slots.
func (c *Cluster) replicaOf(ctx context.Context, master *Redis) (*Redis, error) {
	s, err := c.Slots(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range s {
		if r.Master == master && len(r.Replicas) > 0 {
			return r.Replicas[0], nil
		}
	}
	return nil, fmt.Errorf("%s serves no slots with a replica", master.Addr)
}

// Failover makes master's replica take over with CLUSTER FAILOVER (the
// replica first catches up with the master: nothing acknowledged is lost),
// waits until the cluster is stable again and returns the new master.
func (c *Cluster) Failover(ctx context.Context, master *Redis) (*Redis, error) {
	rep, err := c.replicaOf(ctx, master)
	if err != nil {
		return nil, err
	}
	if err := rep.ok(ctx, "CLUSTER", "FAILOVER"); err != nil {
		return nil, err
	}
	return rep, c.waitMaster(ctx, rep, master)
}

// KillMaster kills master (SIGKILL), waits until its replica has taken over
// (what the master had not yet replicated is lost), restarts the old master,
// which rejoins as a replica, and returns the new master and how long the
// slots had no master (from the kill until every running node agreed on the
// new master).
func (c *Cluster) KillMaster(ctx context.Context, master *Redis) (*Redis, time.Duration, error) {
	// A replica paused by CutReplication may be reported failed by now
	// (and left out of CLUSTER SLOTS): it is still the one to take over.
	c.cutMu.Lock()
	rep := c.cutReplica
	c.cutMu.Unlock()
	if rep == nil {
		var err error
		if rep, err = c.replicaOf(ctx, master); err != nil {
			return nil, 0, err
		}
	}
	start := time.Now()
	master.Stop()
	c.resumeOnce()
	err := waitFor(ctx, topologyTimeout, "replica takes over", func() error {
		return c.agreeMaster(ctx, rep)
	})
	down := time.Since(start)
	if err != nil {
		return nil, down, err
	}
	if err := master.Start(); err != nil {
		return nil, down, err
	}
	return rep, down, c.waitMaster(ctx, rep, master)
}

// agreeMaster checks that every running node names m master of some slots.
func (c *Cluster) agreeMaster(ctx context.Context, m *Redis) error {
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		s, err := c.slotsFrom(ctx, n)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(s, func(r SlotRange) bool { return r.Master == m }) {
			return fmt.Errorf("%s does not see %s as a master yet", n.Addr, m.Addr)
		}
	}
	return nil
}

// waitMaster waits until newMaster serves old's slots and the cluster is
// stable.
func (c *Cluster) waitMaster(ctx context.Context, newMaster, old *Redis) error {
	err := waitFor(ctx, topologyTimeout, "failover", func() error {
		if err := c.agreeMaster(ctx, newMaster); err != nil {
			return err
		}
		if role, err := old.Role(ctx); err != nil || role != "slave" {
			return fmt.Errorf("old master %s is %q (%v), not yet a replica", old.Addr, role, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return c.WaitStable(ctx)
}

// Stop kills every node.
func (c *Cluster) Stop() {
	c.resumeOnce()
	for _, n := range c.Nodes {
		n.Stop()
	}
}

// TrackSpread reads DataCommands now; the function it returns reads them
// again and fails the test unless at least two masters each served at
// least min of the data commands in between, logging the spread. It is
// how a test shows that its keys did not all land on one shard.
func (c *Cluster) TrackSpread(tb testing.TB, min int64) func() {
	tb.Helper()
	ctx := context.Background()
	before, err := c.DataCommands(ctx)
	if err != nil {
		tb.Fatalf("read command stats: %v", err)
	}
	return func() {
		tb.Helper()
		d, used, err := c.Spread(ctx, before, min)
		if err != nil {
			tb.Fatalf("read command stats: %v", err)
		}
		var parts []string
		for _, m := range slices.SortedFunc(maps.Keys(d), func(a, b *Redis) int { return a.Port - b.Port }) {
			parts = append(parts, fmt.Sprintf("%s: %d", m.Addr, d[m]))
		}
		tb.Logf("data commands per master: %s", strings.Join(parts, ", "))
		if used < 2 {
			tb.Errorf("%d of %d masters served at least %d data commands; the keys did not spread over the shards", used, len(d), min)
		}
	}
}

// CutReplication is Sentinel.CutReplication for master's replica.
func (c *Cluster) CutReplication(ctx context.Context, master *Redis) (resume func(), err error) {
	rep, err := c.replicaOf(ctx, master)
	if err != nil {
		return nil, err
	}
	key := ""
	for i := range 10_000 {
		k := "testutil:filler:" + strconv.Itoa(i)
		if m, err := c.MasterOf(ctx, k); err == nil && m == master {
			key = k
			break
		}
	}
	if key == "" {
		return nil, fmt.Errorf("no filler key on %s", master.Addr)
	}
	resume, err = cutReplication(ctx, master, []*Redis{rep}, key)
	if err != nil {
		return nil, err
	}
	c.cutMu.Lock()
	c.resume, c.cutReplica = resume, rep
	c.cutMu.Unlock()
	return c.resumeOnce, nil
}

// resumeOnce resumes a replica paused by CutReplication, if any.
func (c *Cluster) resumeOnce() {
	c.cutMu.Lock()
	r := c.resume
	c.resume, c.cutReplica = nil, nil
	c.cutMu.Unlock()
	if r != nil {
		r()
	}
}

package testutil

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// Multi-node topologies for tests: a Redis Cluster of 3 masters with one
// replica each, and a Sentinel group of 1 master, 2 replicas and 3
// sentinels, all on free loopback ports. Starting one takes seconds (see
// the Started field), so a package shares one across its tests: call
// SharedCluster or SharedSentinel, with Main in the package's TestMain.

// topologyTimeout bounds how long a topology may take to settle (start, or
// a failover): generous for a loaded 2-core machine.
const topologyTimeout = 90 * time.Second

// ClusterNodeTimeout is the Cluster's cluster-node-timeout: a master that
// does not answer for this long is failed over. Long enough that a loaded
// machine does not fail a master over by mistake.
const ClusterNodeTimeout = 3 * time.Second

// SentinelDownAfter is the sentinels' down-after-milliseconds: a master that
// does not answer for this long is failed over.
const SentinelDownAfter = 3 * time.Second

// MasterSet is the name the sentinels monitor their master under.
const MasterSet = "llmgate"

// ---------------------------------------------------------------------------
// Commands on one node

// Command sends one command to this node alone (no Cluster redirection) on
// a short-lived connection, for setup, inspection and faults.
func (r *Redis) Command(ctx context.Context, args ...string) (rueidis.RedisMessage, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{r.Addr}, DisableCache: true, ForceSingleClient: true,
		DisableRetry: true, Dialer: net.Dialer{Timeout: 5 * time.Second},
	})
	if err != nil {
		return rueidis.RedisMessage{}, fmt.Errorf("%s: %w", r.Addr, err)
	}
	defer c.Close()
	m, err := c.Do(ctx, c.B().Arbitrary(args...).Build()).ToMessage()
	if err != nil {
		return m, fmt.Errorf("%s %s: %w", r.Addr, args[0], err)
	}
	return m, nil
}

// str runs a command and returns its reply as text.
func (r *Redis) str(ctx context.Context, args ...string) (string, error) {
	m, err := r.Command(ctx, args...)
	if err != nil {
		return "", err
	}
	return m.ToString()
}

// ok runs a command that answers OK.
func (r *Redis) ok(ctx context.Context, args ...string) error {
	s, err := r.str(ctx, args...)
	if err != nil {
		return fmt.Errorf("%v: %w", args, err)
	}
	if s != "OK" {
		return fmt.Errorf("%s %v: %q, want OK", r.Addr, args, s)
	}
	return nil
}

// info returns one INFO section as field -> value.
func (r *Redis) info(ctx context.Context, section string) (map[string]string, error) {
	s, err := r.str(ctx, "INFO", section)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// Role returns "master" or "slave" as INFO replication says.
func (r *Redis) Role(ctx context.Context) (string, error) {
	m, err := r.info(ctx, "replication")
	if err != nil {
		return "", err
	}
	return m["role"], nil
}

// Running reports whether the process is up (not stopped by Stop).
func (r *Redis) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd != nil
}

// waitFor polls cond until it holds or d passes; it returns cond's last
// error. Polling, because these are external processes with nothing to
// wait on. With LLMGATE_TOPOLOGY_DEBUG set it prints, once a second, what
// it is still waiting for.
func waitFor(ctx context.Context, d time.Duration, what string, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	last := time.Now()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if os.Getenv("LLMGATE_TOPOLOGY_DEBUG") != "" && time.Since(last) > time.Second {
			last = time.Now()
			fmt.Fprintf(os.Stderr, "%s %s: %v\n", time.Now().Format("15:04:05.000"), what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %v: %w", what, d, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ---------------------------------------------------------------------------
// Cluster

// Cluster is a Redis Cluster of 3 masters and 3 replicas on loopback.
type Cluster struct {
	Nodes   []*Redis      // the six nodes; which are masters changes with failovers
	Started time.Duration // how long it took to start and settle
	dir     string
	ids     map[*Redis]string // node ID of each node
	bus     map[*Redis]int    // cluster bus port of each node

	cutMu  sync.Mutex // protects resume
	resume func()     // resumes replicas paused by CutReplication
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
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
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
	cursor, n := "0", 0
	for range 100_000 { // bounded: a test's keyspace is small
		res, err := r.Command(ctx, "SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
		if err != nil {
			return 0, err
		}
		e, err := res.AsScanEntry()
		if err != nil {
			return 0, fmt.Errorf("%s SCAN: %w", r.Addr, err)
		}
		n += len(e.Elements)
		if e.Cursor == 0 {
			return n, nil
		}
		cursor = strconv.FormatUint(e.Cursor, 10)
	}
	return 0, fmt.Errorf("%s SCAN did not finish", r.Addr)
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
	rep, err := c.replicaOf(ctx, master)
	if err != nil {
		return nil, 0, err
	}
	start := time.Now()
	master.Stop()
	c.resumeOnce()
	err = waitFor(ctx, topologyTimeout, "replica takes over", func() error {
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

// ---------------------------------------------------------------------------
// Sentinel

// Sentinel is a master with 2 replicas watched by 3 sentinels, on loopback.
type Sentinel struct {
	Data      []*Redis      // the master and its replicas; which is master changes with failovers
	Sentinels []*Redis      // the three sentinels
	Started   time.Duration // how long it took to start and settle

	cutMu  sync.Mutex // protects resume
	resume func()     // resumes replicas paused by CutReplication
}

// StartSentinel starts a Sentinel topology for this test alone and stops it
// when the test ends. Prefer SharedSentinel: starting one takes seconds.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	s, err := NewSentinel(tb.TempDir())
	if err != nil {
		tb.Fatalf("start sentinel topology: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// NewSentinel starts a master, 2 replicas and 3 sentinels monitoring them
// as MasterSet, with their directories under dir, and waits until every
// sentinel knows both replicas and the other two sentinels. The caller
// must call Stop.
func NewSentinel(dir string) (*Sentinel, error) {
	start := time.Now()
	s := &Sentinel{}
	ctx := context.Background()
	for i := range 3 {
		d := filepath.Join(dir, "data"+strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			s.Stop()
			return nil, err
		}
		args := []string{"--repl-diskless-sync-delay", "0"} // the default waits 5s for more replicas
		if i > 0 {
			args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(s.Data[0].Port))
		}
		r, err := NewRedisArgs(d, args...)
		if err != nil {
			s.Stop()
			return nil, err
		}
		s.Data = append(s.Data, r)
	}
	// Sentinels learn the replicas from the master's INFO at once if they
	// are already attached; otherwise only ten seconds later.
	err := waitFor(ctx, topologyTimeout, "replicas attach", func() error {
		m, err := s.Data[0].info(ctx, "replication")
		if err != nil {
			return err
		}
		if m["connected_slaves"] != "2" {
			return fmt.Errorf("master has %s replicas", m["connected_slaves"])
		}
		for _, r := range s.Data[1:] {
			m, err := r.info(ctx, "replication")
			if err != nil {
				return err
			}
			if m["master_link_status"] != "up" {
				return fmt.Errorf("%s: link %s", r.Addr, m["master_link_status"])
			}
		}
		return nil
	})
	if err != nil {
		s.Stop()
		return nil, err
	}
	for i := range 3 {
		d := filepath.Join(dir, "sentinel"+strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			s.Stop()
			return nil, err
		}
		conf := filepath.Join(d, "sentinel.conf")
		// Sentinel rewrites its config file: it must exist and be writable.
		if err := os.WriteFile(conf, nil, 0o644); err != nil {
			s.Stop()
			return nil, err
		}
		r, err := newRedis(d, conf, "--sentinel",
			"--sentinel", "monitor", MasterSet, "127.0.0.1", strconv.Itoa(s.Data[0].Port), "2",
			"--sentinel", "down-after-milliseconds", MasterSet, strconv.FormatInt(SentinelDownAfter.Milliseconds(), 10),
			"--sentinel", "failover-timeout", MasterSet, "20000",
			"--sentinel", "parallel-syncs", MasterSet, "2")
		if err != nil {
			s.Stop()
			return nil, err
		}
		s.Sentinels = append(s.Sentinels, r)
	}
	if err := s.WaitStable(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	s.Started = time.Since(start)
	return s, nil
}

// SentinelAddrs returns the sentinels' host:port.
func (s *Sentinel) SentinelAddrs() []string {
	a := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		a[i] = n.Addr
	}
	return a
}

// URL returns redis://sentinel0?addr=sentinel1&addr=sentinel2&master_set=MasterSet,
// the form rueidis.ParseURL reads.
func (s *Sentinel) URL() string {
	a := s.SentinelAddrs()
	return "redis://" + a[0] + "?addr=" + strings.Join(a[1:], "&addr=") + "&master_set=" + MasterSet
}

// Option returns client options that find the master through the sentinels.
func (s *Sentinel) Option() rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress: s.SentinelAddrs(), DisableCache: true,
		Sentinel: rueidis.SentinelOption{MasterSet: MasterSet},
	}
}

// Client returns a client that follows the master through the sentinels,
// closed when the test ends.
func (s *Sentinel) Client(tb testing.TB) rueidis.Client {
	tb.Helper()
	c, err := rueidis.NewClient(s.Option())
	if err != nil {
		tb.Fatalf("connect through sentinels: %v", err)
	}
	tb.Cleanup(c.Close)
	if c.Mode() != rueidis.ClientModeSentinel {
		tb.Fatalf("client mode %v, want sentinel", c.Mode())
	}
	return c
}

// node returns the data node listening on addr, or nil.
func (s *Sentinel) node(addr string) *Redis {
	for _, n := range s.Data {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// masterFrom asks one sentinel for the master's address.
func (s *Sentinel) masterFrom(ctx context.Context, sn *Redis) (*Redis, error) {
	res, err := sn.Command(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterSet)
	if err != nil {
		return nil, err
	}
	a, err := res.AsStrSlice()
	if err != nil || len(a) != 2 {
		return nil, fmt.Errorf("sentinel %s GET-MASTER-ADDR-BY-NAME: %v %v", sn.Addr, a, err)
	}
	m := s.node(a[0] + ":" + a[1])
	if m == nil {
		return nil, fmt.Errorf("sentinel %s names an unknown master %s:%s", sn.Addr, a[0], a[1])
	}
	return m, nil
}

// Master returns the data node the sentinels name master.
func (s *Sentinel) Master(ctx context.Context) (*Redis, error) {
	var errs []error
	for _, sn := range s.Sentinels {
		m, err := s.masterFrom(ctx, sn)
		if err == nil {
			return m, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// WaitStable waits until all three sentinels name the same running master,
// that node says it is master with both other data nodes attached, and
// every sentinel knows both replicas (not down) and the other two sentinels.
func (s *Sentinel) WaitStable(ctx context.Context) error {
	return waitFor(ctx, topologyTimeout, "sentinel stable", func() error {
		var master *Redis
		for _, sn := range s.Sentinels {
			m, err := s.masterFrom(ctx, sn)
			if err != nil {
				return err
			}
			if master != nil && m != master {
				return fmt.Errorf("sentinels disagree on the master: %s vs %s", master.Addr, m.Addr)
			}
			master = m
		}
		if !master.Running() {
			return fmt.Errorf("master %s is stopped", master.Addr)
		}
		mi, err := master.info(ctx, "replication")
		if err != nil {
			return err
		}
		if mi["role"] != "master" || mi["connected_slaves"] != "2" {
			return fmt.Errorf("%s: role %s with %s replicas", master.Addr, mi["role"], mi["connected_slaves"])
		}
		for _, r := range s.Data {
			if r == master {
				continue
			}
			ri, err := r.info(ctx, "replication")
			if err != nil {
				return err
			}
			if ri["master_port"] != strconv.Itoa(master.Port) || ri["master_link_status"] != "up" {
				return fmt.Errorf("%s: replica of port %s, link %s", r.Addr, ri["master_port"], ri["master_link_status"])
			}
		}
		for _, sn := range s.Sentinels {
			m, err := sn.info(ctx, "sentinel")
			if err != nil {
				return err
			}
			// master0:name=llmgate,status=ok,address=...,slaves=2,sentinels=3
			line := m["master0"]
			if !strings.Contains(line, "status=ok") || !strings.Contains(line, ",slaves=2,") || !strings.HasSuffix(line, ",sentinels=3") {
				return fmt.Errorf("sentinel %s: %s", sn.Addr, line)
			}
			if err := s.replicasUp(ctx, sn); err != nil {
				return err
			}
		}
		return nil
	})
}

// replicasUp checks that sentinel sn sees no replica down or disconnected
// (a failover picks only among those).
func (s *Sentinel) replicasUp(ctx context.Context, sn *Redis) error {
	res, err := sn.Command(ctx, "SENTINEL", "REPLICAS", MasterSet)
	if err != nil {
		return err
	}
	reps, err := res.ToArray()
	if err != nil {
		return fmt.Errorf("sentinel %s REPLICAS: %w", sn.Addr, err)
	}
	if len(reps) != 2 {
		return fmt.Errorf("sentinel %s knows %d replicas", sn.Addr, len(reps))
	}
	for _, rep := range reps {
		m, err := rep.AsStrMap()
		if err != nil {
			return fmt.Errorf("sentinel %s REPLICAS: %w", sn.Addr, err)
		}
		// Its view of the replica's link is refreshed only every 10s: the
		// replicas' own INFO says whether it is up (see WaitStable).
		if m["flags"] != "slave" {
			return fmt.Errorf("sentinel %s: replica %s:%s flags %s", sn.Addr, m["ip"], m["port"], m["flags"])
		}
	}
	return nil
}

// Failover asks a sentinel to fail over now (SENTINEL FAILOVER: no
// agreement needed, the old master stays up and becomes a replica), waits
// until the topology is stable again and returns the new master.
func (s *Sentinel) Failover(ctx context.Context) (*Redis, error) {
	old, err := s.Master(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Sentinels[0].ok(ctx, "SENTINEL", "FAILOVER", MasterSet); err != nil {
		return nil, err
	}
	m, err := s.waitPromoted(ctx, old)
	if err != nil {
		return nil, err
	}
	return m, s.demote(ctx, old, m)
}

// demote makes old a replica of m at once, which the sentinels would do
// only after their next INFO round (10 to 20 seconds).
func (s *Sentinel) demote(ctx context.Context, old, m *Redis) error {
	// "OK Already connected to specified master" when the sentinels were
	// first.
	if r, err := old.str(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(m.Port)); err != nil || !strings.HasPrefix(r, "OK") {
		return fmt.Errorf("%s REPLICAOF: %q, %v", old.Addr, r, err)
	}
	return s.WaitStable(ctx)
}

// waitPromoted waits until every sentinel names one new master, not old,
// which says it is master.
func (s *Sentinel) waitPromoted(ctx context.Context, old *Redis) (*Redis, error) {
	var m *Redis
	err := waitFor(ctx, topologyTimeout, "sentinels promote a replica", func() error {
		var err error
		m, err = s.agreedNewMaster(ctx, old)
		return err
	})
	return m, err
}

// KillMaster kills the master (SIGKILL), waits until the sentinels have
// promoted a replica (what the master had not replicated is lost),
// restarts the old master, which the sentinels turn into a replica, and
// returns the new master and how long there was no master (from the kill
// until all sentinels named the new one).
func (s *Sentinel) KillMaster(ctx context.Context) (*Redis, time.Duration, error) {
	old, err := s.Master(ctx)
	if err != nil {
		return nil, 0, err
	}
	start := time.Now()
	old.Stop()
	s.resumeOnce()
	m, err := s.waitPromoted(ctx, old)
	down := time.Since(start)
	if err != nil {
		return nil, down, err
	}
	if err := old.Start(); err != nil {
		return nil, down, err
	}
	return m, down, s.demote(ctx, old, m)
}

// agreedNewMaster returns the master every sentinel names, if it is not old
// and says it is master.
func (s *Sentinel) agreedNewMaster(ctx context.Context, old *Redis) (*Redis, error) {
	var m *Redis
	for _, sn := range s.Sentinels {
		mm, err := s.masterFrom(ctx, sn)
		if err != nil {
			return nil, err
		}
		if mm == old || (m != nil && mm != m) {
			return nil, errors.New("sentinels have not all moved to one new master")
		}
		m = mm
	}
	if role, err := m.Role(ctx); err != nil || role != "master" {
		return nil, fmt.Errorf("new master %s is %q (%v)", m.Addr, role, err)
	}
	return m, nil
}

// Stop kills every process.
func (s *Sentinel) Stop() {
	s.resumeOnce()
	for _, n := range s.Sentinels {
		n.Stop()
	}
	for _, n := range s.Data {
		n.Stop()
	}
}

// ---------------------------------------------------------------------------
// Shared per test binary

var shared struct {
	mu       sync.Mutex // protects the fields below
	main     bool       // Main is running the tests
	dir      string
	cluster  *Cluster
	clErr    error
	sentinel *Sentinel
	seErr    error
}

// Main runs the package's tests (call it from TestMain as
// os.Exit(testutil.Main(m))) and then stops the topologies the tests
// shared.
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster != nil {
		shared.cluster.Stop()
	}
	if shared.sentinel != nil {
		shared.sentinel.Stop()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	return code
}

// sharedDirLocked returns the directory shared topologies live in.
func sharedDirLocked() (string, error) {
	if shared.dir == "" {
		d, err := os.MkdirTemp("", "llmgate-topology-")
		if err != nil {
			return "", err
		}
		shared.dir = d
	}
	return shared.dir, nil
}

// SharedCluster returns the 3+3 Cluster shared by this test binary's
// tests, starting it on first use; Main stops it. Tests may fail its
// masters over (Cluster.Failover, KillMaster), which leave it stable, but
// must not assume which node is master.
func SharedCluster(tb testing.TB) *Cluster {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.main {
		tb.Fatal("SharedCluster needs TestMain calling os.Exit(testutil.Main(m)), which stops it")
	}
	if shared.cluster == nil && shared.clErr == nil {
		dir, err := sharedDirLocked()
		if err == nil {
			shared.cluster, err = NewCluster3(filepath.Join(dir, "cluster"))
		}
		shared.clErr = err
		if err == nil {
			tb.Logf("3+3 cluster started in %v", shared.cluster.Started.Round(time.Millisecond))
		}
	}
	if shared.clErr != nil {
		tb.Fatalf("start cluster: %v", shared.clErr)
	}
	return shared.cluster
}

// SharedSentinel returns the Sentinel topology shared by this test
// binary's tests, starting it on first use; Main stops it. Tests may fail
// it over (Sentinel.Failover, KillMaster), which leave it stable, but must
// not assume which node is master.
func SharedSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.main {
		tb.Fatal("SharedSentinel needs TestMain calling os.Exit(testutil.Main(m)), which stops it")
	}
	if shared.sentinel == nil && shared.seErr == nil {
		dir, err := sharedDirLocked()
		if err == nil {
			shared.sentinel, err = NewSentinel(filepath.Join(dir, "sentinel"))
		}
		shared.seErr = err
		if err == nil {
			tb.Logf("sentinel topology started in %v", shared.sentinel.Started.Round(time.Millisecond))
		}
	}
	if shared.seErr != nil {
		tb.Fatalf("start sentinel topology: %v", shared.seErr)
	}
	return shared.sentinel
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

// Pause stops the process (SIGSTOP) until Resume: it neither answers nor
// reads what its master sends it.
func (r *Redis) Pause() error { return r.signal(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (r *Redis) Resume() error { return r.signal(syscall.SIGCONT) }

func (r *Redis) signal(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return fmt.Errorf("%s is not running", r.Addr)
	}
	return r.cmd.Process.Signal(sig)
}

// cutReplication pauses replicas and fills master's replication link with
// a write of key (which must live on master), so that whatever master
// acknowledges next waits in its output buffer: 32 MiB is far more than the
// loopback socket buffers hold. It returns the function that resumes the
// replicas.
func cutReplication(ctx context.Context, master *Redis, replicas []*Redis, key string) (func(), error) {
	var paused []*Redis
	resume := func() {
		for _, r := range paused {
			_ = r.Resume()
		}
	}
	for _, r := range replicas {
		if err := r.Pause(); err != nil {
			resume()
			return nil, err
		}
		paused = append(paused, r)
	}
	if err := master.ok(ctx, "SET", key, strings.Repeat("x", 32<<20), "PX", "60000"); err != nil {
		resume()
		return nil, err
	}
	return resume, nil
}

// CutReplication makes the master's next writes unreplicated, as a slow
// network or a busy replica would: it pauses its replicas (SIGSTOP) and
// fills the replication link, so that what the master acknowledges next
// dies with it. The next KillMaster resumes the replicas right after the
// kill; without one, call the returned function.
func (s *Sentinel) CutReplication(ctx context.Context) (resume func(), err error) {
	m, err := s.Master(ctx)
	if err != nil {
		return nil, err
	}
	var reps []*Redis
	for _, r := range s.Data {
		if r != m {
			reps = append(reps, r)
		}
	}
	resume, err = cutReplication(ctx, m, reps, "testutil:filler")
	if err != nil {
		return nil, err
	}
	s.cutMu.Lock()
	s.resume = resume
	s.cutMu.Unlock()
	return s.resumeOnce, nil
}

// resumeOnce resumes replicas paused by CutReplication, if any.
func (s *Sentinel) resumeOnce() {
	s.cutMu.Lock()
	r := s.resume
	s.resume = nil
	s.cutMu.Unlock()
	if r != nil {
		r()
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
	c.resume = resume
	c.cutMu.Unlock()
	return c.resumeOnce, nil
}

// resumeOnce resumes a replica paused by CutReplication, if any.
func (c *Cluster) resumeOnce() {
	c.cutMu.Lock()
	r := c.resume
	c.resume = nil
	c.cutMu.Unlock()
	if r != nil {
		r()
	}
}

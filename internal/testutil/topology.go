package testutil

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
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
		DisableRetry: true, Dialer: net.Dialer{Timeout: 5 * time.Second}, Password: r.password,
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

// Pid is the server's process ID, or 0 when it is not running.
func (r *Redis) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return 0
	}
	return r.cmd.Process.Pid
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

// nodeAt returns the node of nodes listening on addr, or nil.
func nodeAt(nodes []*Redis, addr string) *Redis {
	for _, n := range nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

package testutil

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// sentinelFailoverTimeout is the sentinels' failover-timeout: a failover
// stuck this long is aborted.
const sentinelFailoverTimeout = 20 * time.Second

// Sentinel is a master with 2 replicas watched by 3 sentinels, on loopback.
type Sentinel struct {
	Data      []*Redis      // the master and its replicas; which is master changes with failovers
	Sentinels []*Redis      // the three sentinels
	Started   time.Duration // how long it took to start and settle

	Auth SentinelAuth // the passwords the nodes require

	cutMu  sync.Mutex // protects resume
	resume func()     // resumes replicas paused by CutReplication
}

// SentinelAuth are the passwords a Sentinel topology requires; "" for
// none, the default.
type SentinelAuth struct {
	// Data is the requirepass of the master and replicas (and their
	// masterauth); the sentinels are given it too (auth-pass).
	Data string
	// Sentinels is the sentinels' own requirepass, which they also use
	// with each other.
	Sentinels string
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

// StartSentinelAuth is StartSentinel with nodes that require the passwords
// in auth.
func StartSentinelAuth(tb testing.TB, auth SentinelAuth) *Sentinel {
	tb.Helper()
	s, err := NewSentinelAuth(tb.TempDir(), auth)
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
func NewSentinel(dir string) (*Sentinel, error) { return NewSentinelAuth(dir, SentinelAuth{}) }

// NewSentinelAuth is NewSentinel with nodes that require the passwords in
// auth.
func NewSentinelAuth(dir string, auth SentinelAuth) (*Sentinel, error) {
	start := time.Now()
	s := &Sentinel{Auth: auth}
	ctx := context.Background()
	for i := range 3 {
		d := filepath.Join(dir, "data"+strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			s.Stop()
			return nil, err
		}
		args := []string{"--repl-diskless-sync-delay", "0"} // the default waits 5s for more replicas
		if auth.Data != "" {
			args = append(args, "--requirepass", auth.Data, "--masterauth", auth.Data)
		}
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
		args := []string{"--sentinel",
			"--sentinel", "monitor", MasterSet, "127.0.0.1", strconv.Itoa(s.Data[0].Port), "2",
			"--sentinel", "down-after-milliseconds", MasterSet, strconv.FormatInt(SentinelDownAfter.Milliseconds(), 10),
			"--sentinel", "failover-timeout", MasterSet, strconv.FormatInt(sentinelFailoverTimeout.Milliseconds(), 10),
			"--sentinel", "parallel-syncs", MasterSet, "2"}
		if auth.Data != "" {
			args = append(args, "--sentinel", "auth-pass", MasterSet, auth.Data)
		}
		if auth.Sentinels != "" {
			args = append(args, "--requirepass", auth.Sentinels)
		}
		r, err := newRedis(d, conf, args...)
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
// the form rueidis.ParseURL reads, with the passwords of Auth
// (:DATA@ and &sentinel_password=SENTINELS, for storeurl).
func (s *Sentinel) URL() string {
	a := s.SentinelAddrs()
	user := ""
	if s.Auth.Data != "" {
		user = url.UserPassword("", s.Auth.Data).String() + "@"
	}
	u := "redis://" + user + a[0] + "?addr=" + strings.Join(a[1:], "&addr=") + "&master_set=" + MasterSet
	if s.Auth.Sentinels != "" {
		u += "&sentinel_password=" + url.QueryEscape(s.Auth.Sentinels)
	}
	return u
}

// Option returns client options that find the master through the sentinels.
func (s *Sentinel) Option() rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress: s.SentinelAddrs(), DisableCache: true, Password: s.Auth.Data,
		Sentinel: rueidis.SentinelOption{MasterSet: MasterSet, Password: s.Auth.Sentinels},
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
	return nodeAt(s.Data, addr)
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
// until the topology is stable again and returns the new master. A forced
// failover can end without a promotion (the sentinel aborts it when no
// replica answers well enough at that moment, as on a loaded machine): it
// is asked again once the sentinel's failover-timeout has passed.
func (s *Sentinel) Failover(ctx context.Context) (*Redis, error) {
	old, err := s.Master(ctx)
	if err != nil {
		return nil, err
	}
	ask := func() error {
		r, err := s.Sentinels[0].str(ctx, "SENTINEL", "FAILOVER", MasterSet)
		if err != nil && strings.Contains(err.Error(), "INPROG") {
			return nil // the last one is still running
		}
		if err == nil && r != "OK" {
			err = fmt.Errorf("SENTINEL FAILOVER: %q", r)
		}
		return err
	}
	if err := ask(); err != nil {
		return nil, err
	}
	asked := time.Now()
	var m *Redis
	err = waitFor(ctx, topologyTimeout, "sentinels promote a replica", func() error {
		var err error
		if m, err = s.agreedNewMaster(ctx, old); err == nil {
			return nil
		}
		if time.Since(asked) > sentinelFailoverTimeout+SentinelDownAfter {
			asked = time.Now()
			if aerr := ask(); aerr != nil {
				return errors.Join(err, aerr)
			}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w; sentinel logs: %s", err, s.logTails())
	}
	return m, s.demote(ctx, old, m)
}

// logTails returns the end of every sentinel's log, for failures.
func (s *Sentinel) logTails() string {
	var b strings.Builder
	for _, sn := range s.Sentinels {
		fmt.Fprintf(&b, "\n--- %s:\n%s", sn.Addr, sn.logTail())
	}
	return b.String()
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

// Replicated checks that the master's keys matching pattern are on both
// replicas: it lists them on the master, waits until each replica has
// acknowledged the master's replication offset as read after that, and
// then finds each key on every replica, unless it is gone from the master
// too by then (expired or deleted). It returns how many keys it checked.
func (s *Sentinel) Replicated(ctx context.Context, pattern string) (int, error) {
	m, err := s.Master(ctx)
	if err != nil {
		return 0, err
	}
	keys, err := m.Keys(ctx, pattern)
	if err != nil {
		return 0, err
	}
	info, err := m.info(ctx, "replication")
	if err != nil {
		return 0, err
	}
	target, _ := strconv.ParseInt(info["master_repl_offset"], 10, 64)
	for _, r := range s.Data {
		if r == m {
			continue
		}
		err := waitFor(ctx, topologyTimeout, "replica catches up", func() error {
			ri, err := r.info(ctx, "replication")
			if err != nil {
				return err
			}
			if off, _ := strconv.ParseInt(ri["slave_repl_offset"], 10, 64); off < target {
				return fmt.Errorf("%s at offset %d of %d", r.Addr, off, target)
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		for _, k := range keys {
			n, err := r.Command(ctx, "EXISTS", k)
			if err != nil {
				return 0, err
			}
			if on, _ := n.AsInt64(); on == 1 {
				continue
			}
			n, err = m.Command(ctx, "EXISTS", k)
			if err != nil {
				return 0, err
			}
			if on, _ := n.AsInt64(); on == 1 {
				return 0, fmt.Errorf("%s has %q, its replica %s does not", m.Addr, k, r.Addr)
			}
		}
	}
	return len(keys), nil
}

package lockcheck_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/lockcheck"
	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	lockredis "github.com/llmgate/llmgate/lock/redis"
	"github.com/llmgate/llmgate/lock/redlock"
)

// Environment.
const (
	envChild     = "LLMGATE_LOCKCHECK_CHILD"     // "1" in a child process
	envHistories = "LLMGATE_LOCKCHECK_HISTORIES" // histories to check in all (default 200)
	envVisDir    = "LLMGATE_PORCUPINE_DIR"       // where visualisations of violations go (default t.TempDir())
)

// Shape of a batch: procs processes contend for keysPerBatch locks at once,
// one history per lock; each process takes each lock acquisitions times
// and writes writes times per acquisition, work apart, renewing the lease
// between writes.
const (
	procs        = 3
	keysPerBatch = 10
	acquisitions = 3
	writes       = 3
	ttl          = 200 * time.Millisecond
	work         = ttl / 10
	// recycleEvery bounds a child's life (its -test.timeout is 2m).
	recycleEvery = 20
	batchBound   = time.Minute
)

// batch is what the parent asks a child to run (one JSON line on stdin).
type batch struct {
	Backend  string   `json:"backend"` // "redis" or "redlock"
	Locks    []string `json:"locks"`   // lock store addresses
	Register string   `json:"register"`
	Batch    int      `json:"batch"`
	Proc     int      `json:"proc"`
	// Fenced: the register rejects writes with a fence below the highest
	// it accepted. Then the writers of even keys are careful (they stop
	// writing once they know their lease is gone) and those of odd keys
	// careless (they write on regardless: only the fence protects the
	// register). When false the register accepts anything and every writer
	// is careless: the broken setup the checker must catch.
	Fenced bool `json:"fenced"`
}

// register.lua: KEYS[1] the register (the highest fence accepted);
// ARGV[1] fence, ARGV[2] "1" to reject lower fences. Returns 1 accepted,
// 0 rejected.
var registerScript = rueidis.NewLuaScript(`
local top = tonumber(redis.call('GET', KEYS[1]) or '0')
local f = tonumber(ARGV[1])
if ARGV[2] == '1' and f < top then return 0 end
if f > top then redis.call('SET', KEYS[1], ARGV[1]) end
return 1`)

func historyKey(b, k int) string { return fmt.Sprintf("lockcheck/%d/%d", b, k) }

// TestLockcheckChild is the body of a child process: it runs the batches
// its parent sends on stdin, one at a time, printing events as it goes.
func TestLockcheckChild(t *testing.T) {
	if os.Getenv(envChild) != "1" {
		t.Skip("child process body; runs only when started by TestFaults or TestCheckerCatchesUnfencedWriter")
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var b batch
		if err := json.Unmarshal(sc.Bytes(), &b); err != nil {
			t.Fatalf("bad batch %q: %v", sc.Text(), err)
		}
		if err := runBatch(b); err != nil {
			t.Fatal(err)
		}
		testutil.Say("done")
	}
}

func connect(addr string) (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
}

func runBatch(b batch) error {
	var cs []rueidis.Client
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for _, a := range append([]string{b.Register}, b.Locks...) {
		c, err := connect(a)
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	reg := cs[0]
	var backend lock.Backend
	switch b.Backend {
	case "redis":
		backend = lockredis.New(cs[1], lockredis.Config{})
	case "redlock":
		var err error
		if backend, err = redlock.New(cs[1:], redlock.Config{}); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown backend %q", b.Backend)
	}
	l := lock.New(backend)
	ctx, cancel := context.WithTimeout(context.Background(), batchBound)
	defer cancel()
	var wg sync.WaitGroup
	for k := range keysPerBatch {
		wg.Go(func() { runHistory(ctx, l, reg, b, k) })
	}
	wg.Wait()
	return nil
}

func say(e lockcheck.Event) {
	raw, _ := json.Marshal(e)
	testutil.Say("%s", raw)
}

func now() int64 { return time.Now().UnixNano() }

// runHistory is one process's part of one history.
func runHistory(ctx context.Context, l *lock.Locker, reg rueidis.Client, b batch, k int) {
	key := historyKey(b.Batch, k)
	seq := 0
	fenced := "0"
	if b.Fenced {
		fenced = "1"
	}
	careful := b.Fenced && k%2 == 0
	for range acquisitions {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		call := now()
		lease, err := l.Acquire(actx, key, lock.Options{TTL: ttl, WaiterLease: ttl})
		cancel()
		if err != nil {
			continue // nothing happened that the model constrains
		}
		say(lockcheck.Event{Op: lockcheck.OpAcquire, Key: k, Proc: b.Proc, Call: call, Ret: now(), Fence: lease.Fence})
		lost := false
		for w := range writes {
			if careful && (lease.Err() != nil || !time.Now().Before(lease.ValidUntil())) {
				lost = true
				break
			}
			seq++
			say(lockcheck.Event{Op: lockcheck.OpWriteCall, Key: k, Proc: b.Proc, Seq: seq, Call: now(), Fence: lease.Fence})
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			v, err := registerScript.Exec(wctx, reg, []string{key}, []string{strconv.FormatUint(lease.Fence, 10), fenced}).AsInt64()
			cancel()
			say(lockcheck.Event{Op: lockcheck.OpWriteRet, Key: k, Proc: b.Proc, Seq: seq, Ret: now(), OK: v == 1, Unknown: err != nil})
			<-time.After(work) // the critical section's work
			if w < writes-1 {
				ectx, cancel := context.WithTimeout(ctx, ttl)
				err := lease.Extend(ectx, 0)
				cancel()
				if err != nil && careful && errors.Is(err, lock.ErrNotHeld) {
					lost = true
					break
				}
			}
		}
		if lost {
			say(lockcheck.Event{Op: lockcheck.OpLost, Key: k, Proc: b.Proc, Call: now()})
		}
		call = now()
		_ = lease.Release(ctx)
		say(lockcheck.Event{Op: lockcheck.OpRelease, Key: k, Proc: b.Proc, Call: call, Ret: now()})
	}
}

// fault is one kind of fault, injected once per batch.
type fault struct {
	name string
	// locks returns the lock stores' addresses for a batch with this fault.
	locks func() []string
	// inject runs the fault; victim is the process that last acquired.
	inject func(t *testing.T, victim *testutil.Child)
}

// target is a lock backend and the faults it is run under.
type target struct {
	backend string
	faults  []fault
}

func kill(t *testing.T, c *testutil.Child) {
	// Not c.Kill: that would drain the child's lines, which the batch still
	// reads up to the end.
	if err := c.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Errorf("kill -9: %v", err)
	}
}

func stop(t *testing.T, c *testutil.Child) {
	if err := c.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Errorf("SIGSTOP: %v", err)
		return
	}
	<-time.After(3 * ttl) // the pause under test: well past the TTL
	if err := c.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Errorf("SIGCONT: %v", err)
	}
}

func restart(t *testing.T, r *testutil.Redis) {
	if err := r.Restart(); err != nil {
		t.Errorf("restart redis: %v", err)
	}
}

func pause(t *testing.T, rs ...*testutil.Redis) {
	for _, r := range rs {
		if _, err := r.Do(t.Context(), "CLIENT", "PAUSE", strconv.FormatInt((2*ttl).Milliseconds(), 10), "ALL"); err != nil {
			t.Errorf("CLIENT PAUSE: %v", err)
		}
	}
}

func latency(ps ...*testutil.DelayProxy) {
	for _, p := range ps {
		p.SetRTT(ttl / 2)
	}
	<-time.After(2 * ttl) // the slow period under test
	for _, p := range ps {
		p.SetRTT(0)
	}
}

func addrs(ps ...*testutil.DelayProxy) func() []string {
	return func() []string {
		var as []string
		for _, p := range ps {
			as = append(as, p.Addr)
		}
		return as
	}
}

// redisTarget is lock/redis on one standalone Redis, reached through a
// delay proxy; restarts use a second Redis with appendonly (fsync always)
// or the first, without persistence.
func redisTarget(t *testing.T) target {
	plain := testutil.StartRedis(t)
	aof := testutil.StartRedisArgs(t, "--appendonly", "yes", "--appendfsync", "always")
	pp := testutil.StartDelayProxy(t, plain.Addr, 0)
	pa := testutil.StartDelayProxy(t, aof.Addr, 0)
	onPlain := addrs(pp)
	return target{backend: "redis", faults: []fault{
		{"kill -9 holder", onPlain, kill},
		{"SIGSTOP holder past TTL", onPlain, stop},
		{"restart, appendonly", addrs(pa), func(t *testing.T, _ *testutil.Child) { restart(t, aof) }},
		{"restart, no persistence", onPlain, func(t *testing.T, _ *testutil.Child) { restart(t, plain) }},
		{"CLIENT PAUSE 2×TTL", onPlain, func(t *testing.T, _ *testutil.Child) { pause(t, plain) }},
		{"latency TTL/2 for 2×TTL", onPlain, func(*testing.T, *testutil.Child) { latency(pp) }},
	}}
}

// redlockTarget is lock/redlock over 3 instances without persistence, each
// through a delay proxy.
func redlockTarget(t *testing.T) target {
	rs := make([]*testutil.Redis, 3)
	ps := make([]*testutil.DelayProxy, 3)
	for i := range rs {
		rs[i] = testutil.StartRedis(t)
		ps[i] = testutil.StartDelayProxy(t, rs[i].Addr, 0)
	}
	all := addrs(ps...)
	next := 0
	return target{backend: "redlock", faults: []fault{
		{"kill -9 holder", all, kill},
		{"SIGSTOP holder past TTL", all, stop},
		{"restart one instance, no persistence", all, func(t *testing.T, _ *testutil.Child) {
			restart(t, rs[next%3])
			next++
		}},
		{"restart a majority, no persistence", all, func(t *testing.T, _ *testutil.Child) {
			var wg sync.WaitGroup
			for _, r := range rs[:2] {
				wg.Go(func() { restart(t, r) })
			}
			wg.Wait()
		}},
		{"CLIENT PAUSE 2×TTL on a majority", all, func(t *testing.T, _ *testutil.Child) { pause(t, rs[0], rs[1]) }},
		{"latency TTL/2 for 2×TTL on a majority", all, func(*testing.T, *testutil.Child) { latency(ps[0], ps[1]) }},
	}}
}

// tally counts what a run found, per backend and fault.
type tally struct {
	histories, faults, ops, accepted, rejected, overlaps, violations int
}

// runner runs batches on a pool of child processes.
type runner struct {
	t        *testing.T
	ctx      context.Context
	register string
	kids     []*testutil.Child
	dead     map[*testutil.Child]bool // children whose output ended
	batches  int
	visDir   string
	// fenced is passed to every batch.
	fenced bool
	// violations lists the visualisations written.
	violations []string
}

func newRunner(t *testing.T, fenced bool) *runner {
	dir := os.Getenv(envVisDir)
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &runner{t: t, ctx: t.Context(), register: testutil.StartRedis(t).Addr, visDir: dir, fenced: fenced, dead: make(map[*testutil.Child]bool)}
}

func (r *runner) child() *testutil.Child {
	return testutil.StartChild(r.t, r.ctx, "TestLockcheckChild", envChild+"=1")
}

// kid returns child i, started (again) if it died or is due for recycling.
func (r *runner) kid(i int) *testutil.Child {
	for len(r.kids) <= i {
		r.kids = append(r.kids, nil)
	}
	c := r.kids[i]
	if c != nil && (r.dead[c] || r.batches%recycleEvery == 0) {
		_ = c.Stdin.Close()
		c.Kill()
		delete(r.dead, c)
		c = nil
	}
	if c == nil {
		c = r.child()
		r.kids[i] = c
	}
	return c
}

type line struct {
	proc int
	text string
	ok   bool // false: the child's output ended
}

// batch runs one batch of keysPerBatch histories on backend with fault f
// and checks them. It returns the tally.
func (r *runner) batch(backend string, f fault) tally {
	t := r.t
	kids := make([]*testutil.Child, procs)
	for i := range kids {
		kids[i] = r.kid(i)
	}
	r.batches++
	id := r.batches
	locks := f.locks()
	lines := make(chan line, 64)
	var readers sync.WaitGroup
	stopRead := make(chan struct{})
	for i, c := range kids {
		readers.Go(func() {
			for {
				select {
				case s, ok := <-c.Lines():
					select {
					case lines <- line{i, s, ok}:
					case <-stopRead:
						return
					}
					if !ok || s == "done" {
						return
					}
				case <-stopRead:
					return
				}
			}
		})
	}
	defer func() { close(stopRead); readers.Wait() }()
	for i, c := range kids {
		raw, _ := json.Marshal(batch{Backend: backend, Locks: locks, Register: r.register, Batch: id, Proc: i, Fenced: r.fenced})
		if _, err := fmt.Fprintf(c.Stdin, "%s\n", raw); err != nil {
			t.Fatalf("send batch to child %d: %v", i, err)
		}
	}
	events := make([][]lockcheck.Event, keysPerBatch)
	finished := 0
	acquired := 0
	lastAcquirer := 0
	injected := false
	faultDone := make(chan struct{})
	deadline := time.NewTimer(batchBound)
	defer deadline.Stop()
	for finished < procs {
		var l line
		select {
		case l = <-lines:
		case <-deadline.C:
			t.Fatalf("batch %d (%s, %s) did not finish within %v", id, backend, f.name, batchBound)
		}
		if !l.ok || l.text == "done" {
			if !l.ok {
				r.dead[kids[l.proc]] = true
			}
			finished++
			continue
		}
		var e lockcheck.Event
		if err := json.Unmarshal([]byte(l.text), &e); err != nil || e.Key < 0 || e.Key >= keysPerBatch {
			t.Fatalf("child %d: bad event %q: %v", l.proc, l.text, err)
		}
		events[e.Key] = append(events[e.Key], e)
		if e.Op == lockcheck.OpAcquire {
			acquired++
			lastAcquirer = l.proc
			// Inject once every key has been taken about once: all
			// processes are busy, and each holds some of the locks.
			if !injected && acquired > keysPerBatch {
				injected = true
				victim := kids[lastAcquirer]
				go func() {
					defer close(faultDone)
					f.inject(t, victim)
				}()
			}
		}
	}
	if !injected {
		t.Fatalf("batch %d (%s, %s): only %d acquisitions, the fault was never injected", id, backend, f.name, acquired)
	}
	<-faultDone
	var tl tally
	tl.faults = 1
	for k, es := range events {
		res := lockcheck.Check(es, 30*time.Second)
		tl.histories++
		tl.ops += res.Ops
		tl.accepted += res.Accepted
		tl.rejected += res.Rejected
		tl.overlaps += res.Overlaps
		switch res.Verdict {
		case porcupine.Ok:
		case porcupine.Illegal:
			tl.violations++
			name := strings.NewReplacer(" ", "-", "×", "x", "/", "-", ",", "").Replace(fmt.Sprintf("%s-%s-batch%d-key%d.html", backend, f.name, id, k))
			path := filepath.Join(r.visDir, name)
			if err := lockcheck.Visualize(res, path); err != nil {
				t.Errorf("write visualisation: %v", err)
			}
			r.violations = append(r.violations, path)
		default:
			t.Errorf("batch %d key %d: porcupine gave no verdict (%v) on %d ops", id, k, res.Verdict, res.Ops)
		}
	}
	return tl
}

// histories is how many histories TestFaults checks in all.
func histories(t *testing.T) int {
	n := 200
	if v := os.Getenv(envHistories); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", envHistories, v)
		}
	}
	return n
}

// TestFaults runs histories of fenced writes under faults on lock/redis and
// on lock/redlock (3 instances), half each, and checks every history with
// porcupine: no violation may be found.
//
//	go test -count=1 -run TestFaults -v ./internal/lockcheck/
//	LLMGATE_LOCKCHECK_HISTORIES=2000 go test -count=1 -run TestFaults -v -timeout 30m ./internal/lockcheck/
func TestFaults(t *testing.T) {
	start := time.Now()
	r := newRunner(t, true)
	targets := []target{redisTarget(t), redlockTarget(t)}
	perTarget := (histories(t) + len(targets)*keysPerBatch - 1) / (len(targets) * keysPerBatch) // batches
	type row struct{ backend, fault string }
	tallies := make(map[row]*tally)
	var order []row
	var total tally
	for i := range perTarget {
		for _, tg := range targets {
			f := tg.faults[i%len(tg.faults)]
			tl := r.batch(tg.backend, f)
			k := row{tg.backend, f.name}
			if tallies[k] == nil {
				tallies[k] = &tally{}
				order = append(order, k)
			}
			add(tallies[k], tl)
			add(&total, tl)
		}
	}
	slices.SortStableFunc(order, func(a, b row) int { return strings.Compare(a.backend, b.backend) })
	t.Logf("| backend | fault | histories | faults | operations | writes accepted | stale writes rejected | overlapping holds | violations |")
	t.Logf("|---|---|---|---|---|---|---|---|---|")
	for _, k := range order {
		tl := tallies[k]
		t.Logf("| %s | %s | %d | %d | %d | %d | %d | %d | %d |", k.backend, k.fault, tl.histories, tl.faults, tl.ops, tl.accepted, tl.rejected, tl.overlaps, tl.violations)
	}
	t.Logf("total: %d histories, %d faults injected, %d operations, %d accepted, %d rejected, %d overlapping holds, %d violations, in %v",
		total.histories, total.faults, total.ops, total.accepted, total.rejected, total.overlaps, total.violations, time.Since(start).Round(time.Millisecond))
	if total.accepted == 0 {
		t.Errorf("no write was accepted: the histories checked nothing")
	}
	if len(r.violations) > 0 {
		t.Fatalf("%d histories are not linearizable under the fenced-lock model; porcupine's visualisations:\n%s", len(r.violations), strings.Join(r.violations, "\n"))
	}
}

func add(a *tally, b tally) {
	a.histories += b.histories
	a.faults += b.faults
	a.ops += b.ops
	a.accepted += b.accepted
	a.rejected += b.rejected
	a.overlaps += b.overlaps
	a.violations += b.violations
}

// TestCheckerCatchesUnfencedWriter proves the check can fail: with a
// register that accepts any write and writers that ignore their lease, a
// holder paused past its TTL writes after the next holder did, and
// porcupine must report it, with a visualisation.
func TestCheckerCatchesUnfencedWriter(t *testing.T) {
	r := newRunner(t, false)
	tg := redisTarget(t)
	stopFault := tg.faults[1]
	if stopFault.name != "SIGSTOP holder past TTL" {
		t.Fatalf("fault %q, want the SIGSTOP one", stopFault.name)
	}
	// A paused holder holds about a third of the batch's locks, so one
	// batch nearly always shows it; a few more make a miss negligible.
	const maxBatches = 5
	for i := 1; i <= maxBatches; i++ {
		tl := r.batch(tg.backend, stopFault)
		if tl.violations > 0 {
			for _, p := range r.violations {
				if fi, err := os.Stat(p); err != nil || fi.Size() == 0 {
					t.Fatalf("visualisation %s not written: %v", p, err)
				}
			}
			t.Logf("batch %d: %d of %d histories flagged, %d overlapping holds; first visualisation %s", i, tl.violations, tl.histories, tl.overlaps, r.violations[0])
			return
		}
	}
	t.Fatalf("no violation found in %d batches of unfenced writes under SIGSTOP", maxBatches)
}

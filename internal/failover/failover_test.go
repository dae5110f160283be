package failover_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/budget"
	budgetredis "github.com/llmgate/llmgate/budget/redis"
	"github.com/llmgate/llmgate/dedup"
	dedupredis "github.com/llmgate/llmgate/dedup/redis"
	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	lockredis "github.com/llmgate/llmgate/lock/redis"
	"github.com/llmgate/llmgate/ratelimit"
	ratelimitredis "github.com/llmgate/llmgate/ratelimit/redis"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// topology is what the scenario needs from Sentinel or Cluster.
type topology struct {
	url string
	// master is the node the scenario kills.
	master *testutil.Redis
	// place returns a name, from base, whose hash tag tagOf(name) lives on
	// master.
	place func(t *testing.T, base string, tagOf func(string) string) string
	// cut leaves master's next writes unreplicated until kill.
	cut func(ctx context.Context) (func(), error)
	// kill kills master and returns how long until a replica had taken
	// over; it leaves the topology stable.
	kill func(ctx context.Context) (time.Duration, error)
}

func TestFailoverSentinel(t *testing.T) {
	s := testutil.SharedSentinel(t)
	m, err := s.Master(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	run(t, topology{
		url:    s.URL(),
		master: m,
		place:  func(_ *testing.T, base string, _ func(string) string) string { return base },
		cut:    s.CutReplication,
		kill: func(ctx context.Context) (time.Duration, error) {
			_, d, err := s.KillMaster(ctx)
			return d, err
		},
	})
}

func TestFailoverCluster(t *testing.T) {
	c := testutil.SharedCluster(t)
	ms, err := c.Masters(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	m := ms[0]
	run(t, topology{
		url:    c.URL(),
		master: m,
		place: func(t *testing.T, base string, tagOf func(string) string) string {
			for i := range 1000 {
				name := base + strconv.Itoa(i)
				on, err := c.MasterOf(t.Context(), tagOf(name))
				if err != nil {
					t.Fatal(err)
				}
				if on == m {
					return name
				}
			}
			t.Fatalf("no name from %q on %s", base, m.Addr)
			return ""
		},
		cut: func(ctx context.Context) (func(), error) { return c.CutReplication(ctx, m) },
		kill: func(ctx context.Context) (time.Duration, error) {
			_, d, err := c.KillMaster(ctx, m)
			return d, err
		},
	})
}

// worker runs one operation in a loop and records when it worked.
type worker struct {
	name string
	op   func(ctx context.Context) (ok bool, err error)

	mu       sync.Mutex // protects the fields below
	ok, fail int
	degraded int       // admitted without the store (fail-open)
	lastFail time.Time // the last failure
	okSince  time.Time // the first success after lastFail
	firstErr error
}

// loop calls op every pace until stop closes (at most maxOps times), each
// call bounded by opTimeout.
func (w *worker) loop(stop <-chan struct{}, done *sync.WaitGroup) {
	defer done.Done()
	const pace, opTimeout, maxOps = 20 * time.Millisecond, time.Second, 20_000
	for range maxOps {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		ok, err := w.op(ctx)
		cancel()
		now := time.Now()
		w.mu.Lock()
		switch {
		case err != nil:
			w.fail++
			w.lastFail, w.okSince = now, time.Time{}
			if w.firstErr == nil {
				w.firstErr = err
			}
		case !ok:
			w.degraded++
			w.lastFail, w.okSince = now, time.Time{}
		default:
			w.ok++
			if w.okSince.IsZero() {
				w.okSince = now
			}
		}
		w.mu.Unlock()
		select {
		case <-stop:
			return
		case <-time.After(pace): // load pacing, not synchronisation
		}
	}
}

// healthy reports whether the last failure is older than d (or none) and
// there were at least min successes.
func (w *worker) healthy(min int, d time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ok >= min && !w.okSince.IsZero() && time.Since(w.okSince) >= d
}

// run is the scenario: a held lock renewed, a limiter admitting and a
// budget reserving and settling, all with keys on the master it kills; and
// writes made while the master's replicas were cut off, to count what a
// failover loses.
func run(t *testing.T, topo topology) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	open := func() rueidis.Client {
		c, err := storeurl.OpenRedis(topo.url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)

	// The lock: held with a TTL longer than any failover here, renewed.
	lockTag := func(k string) string { return "{" + k + "}" }
	lockKey := topo.place(t, "held-"+run+"-", lockTag)
	holder := lock.New(lockredis.New(open(), lockredis.Config{}))
	other := lock.New(lockredis.New(open(), lockredis.Config{}))
	const lockTTL = 60 * time.Second
	lease, err := holder.TryAcquire(ctx, lockKey, lock.Options{TTL: lockTTL})
	if err != nil {
		t.Fatal(err)
	}
	lockW := &worker{name: "lock extend", op: func(ctx context.Context) (bool, error) {
		return true, lease.Extend(ctx, 0)
	}}

	// The limiter: one request per call, far from its limit; fail-open.
	group := topo.place(t, "g-"+run+"-", func(g string) string { return "{" + g + "}" })
	limiter := ratelimit.New(ratelimitredis.New(open(), ratelimitredis.Config{Group: group}))
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 1_000_000, Window: time.Minute}
	limitW := &worker{name: "ratelimit allow", op: func(ctx context.Context) (bool, error) {
		d, err := limiter.Allow(ctx, ratelimit.Request{Charges: []ratelimit.Charge{{Scope: "tenant:a", Limit: lim}}})
		if err != nil {
			return false, err
		}
		if !d.Allowed {
			return false, errors.New("denied far from the limit")
		}
		return !d.Degraded, nil
	}}

	// The budget: reserve then settle 10 tokens a call; fail-closed.
	bm, err := budget.New(budgetredis.New(open(), budgetredis.Config{}), budget.Config{Prices: budget.PriceTable{"m": {InputPerMTok: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	window, err := budget.Budget{Tenant: "x", Period: budget.Month, Tokens: 1}.Window(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	budgetTag := func(tenant string) string { return "{" + tenant + ":" + window.ID + "}" }
	tenant := topo.place(t, "t-"+run+"-", budgetTag)
	bud := budget.Budget{Tenant: tenant, Period: budget.Month, Tokens: 1 << 40}
	var ackMu sync.Mutex
	var acked int64 // tokens whose Settle was acknowledged
	budgetW := &worker{name: "budget reserve+settle", op: func(ctx context.Context) (bool, error) {
		res, err := bm.Reserve(ctx, bud, "", "m", budget.Usage{PromptTokens: 10})
		if err != nil {
			return false, err
		}
		if _, err := bm.Settle(ctx, res, budget.Record{Tenant: tenant, Model: "m", Usage: budget.Usage{PromptTokens: 10}, Requests: 1}); err != nil {
			return false, err
		}
		ackMu.Lock()
		acked += 10
		ackMu.Unlock()
		return true, nil
	}}

	workers := []*worker{lockW, limitW, budgetW}
	stop := make(chan struct{})
	var done sync.WaitGroup
	for _, w := range workers {
		done.Add(1)
		go w.loop(stop, &done)
	}
	stopped := false
	stopAll := func() {
		if !stopped {
			stopped = true
			close(stop)
			done.Wait()
		}
	}
	defer stopAll()
	waitUntil(t, ctx, time.Minute, "every worker succeeds 5 times", func() bool {
		for _, w := range workers {
			if !w.healthy(5, 0) {
				return false
			}
		}
		return true
	})

	// Everything acknowledged so far reaches the replicas; then cut them
	// off (as a slow link would) and write what only the master will have.
	ackMu.Lock()
	ackedBefore := acked
	ackMu.Unlock()
	// The cache: one answer stored before the cut, one after.
	cache := respcache.NewRedis(open(), "llmgate:cache:"+run+":")
	// Each answer under a tenant of its own: a tenant's keys share a slot.
	cacheTag := func(tenant string) string { return cache.RedisKey(tenant, "answer") }
	entry := &respcache.Entry{Status: 200, Body: []byte(`{"object":"chat.completion"}`)}
	cachedBefore := topo.place(t, "before-", cacheTag)
	if err := cache.Put(ctx, cachedBefore, "answer", entry, time.Hour); err != nil {
		t.Fatal(err)
	}
	cachedAfter := topo.place(t, "after-", cacheTag)

	// De-duplication: one flight led (by process A) since before the cut,
	// one claimed after it. LeaseTTL 30s outlasts the outage.
	dedupA := dedup.New(dedupredis.New(open(), dedupredis.Config{}), dedup.Options{LeaseTTL: 30 * time.Second})
	dedupB := dedup.New(dedupredis.New(open(), dedupredis.Config{}), dedup.Options{LeaseTTL: 30 * time.Second})
	flightBefore := topo.place(t, "fb-"+run+"-", lockTag)
	flightAfter := topo.place(t, "fa-"+run+"-", lockTag)
	leaderBefore, _, err := dedupA.Join(ctx, flightBefore, "fp", time.Minute)
	if err != nil || leaderBefore == nil {
		t.Fatalf("Join before the cut: leader %v, %v", leaderBefore, err)
	}
	defer func() { _ = leaderBefore.Abort(context.Background()) }()

	// Names first: between the cut and the kill no time is to be lost (a
	// replica paused for longer than the node timeout is reported failed).
	probeKey := topo.place(t, "probe-"+run+"-", lockTag)
	probeTenant := topo.place(t, "pt-"+run+"-", budgetTag)
	ackProbeKey := topo.place(t, "ackprobe-"+run+"-", lockTag)
	ackTenant := topo.place(t, "apt-"+run+"-", budgetTag)
	ackLocker := lock.New(lockredis.New(open(), lockredis.Config{AckReplicas: 1, AckTimeout: 200 * time.Millisecond}))
	ackBM, err := budget.New(budgetredis.New(open(), budgetredis.Config{AckReplicas: 1, AckTimeout: 200 * time.Millisecond}), budget.Config{Prices: budget.PriceTable{"m": {InputPerMTok: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	waitReplicated(t, ctx, topo.master)
	resume, err := topo.cut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer resume()
	probe, err := holder.TryAcquire(ctx, probeKey, lock.Options{TTL: lockTTL})
	if err != nil {
		t.Fatal(err)
	}
	probeBud := budget.Budget{Tenant: probeTenant, Period: budget.Month, Tokens: 1 << 40}
	pres, err := bm.Reserve(ctx, probeBud, "", "m", budget.Usage{PromptTokens: 1000})
	if err == nil {
		_, err = bm.Settle(ctx, pres, budget.Record{Tenant: probeTenant, Model: "m", Usage: budget.Usage{PromptTokens: 1000}, Requests: 1})
	}
	if err != nil {
		t.Fatal(err)
	}

	if err := cache.Put(ctx, cachedAfter, "answer", entry, time.Hour); err != nil {
		t.Fatal(err)
	}
	leaderAfter, _, err := dedupA.Join(ctx, flightAfter, "fp", time.Minute)
	if err != nil || leaderAfter == nil {
		t.Fatalf("Join after the cut: leader %v, %v", leaderAfter, err)
	}
	defer func() { _ = leaderAfter.Abort(context.Background()) }()

	// The same writes with AckReplicas fail closed instead.
	if l, err := ackLocker.TryAcquire(ctx, ackProbeKey, lock.Options{TTL: lockTTL}); !errors.Is(err, lockredis.ErrNotReplicated) {
		t.Errorf("lock with AckReplicas while the replicas were cut off: %v, %v; want ErrNotReplicated", l, err)
	}
	ackBud := budget.Budget{Tenant: ackTenant, Period: budget.Month, Tokens: 1 << 40}
	if _, err := ackBM.Reserve(ctx, ackBud, "", "m", budget.Usage{PromptTokens: 1000}); !errors.Is(err, budgetredis.ErrNotReplicated) {
		t.Errorf("budget with AckReplicas while the replicas were cut off: %v; want ErrNotReplicated", err)
	}

	killed := time.Now()
	down, err := topo.kill(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Clients learn of the new master within a topology refresh of the
	// takeover (storeurl.SentinelRefresh; a Cluster client on its first
	// error); a loaded machine gets as long again as the takeover took.
	bound := 2*down + 2*storeurl.SentinelRefresh + 5*time.Second
	t.Logf("master %s killed: a replica took over after %v; recovery bound %v", topo.master.Addr, down.Round(time.Millisecond), bound.Round(time.Millisecond))
	recoverBy := killed.Add(bound)
	waitUntil(t, ctx, time.Until(recoverBy)+time.Second, "every worker recovers", func() bool {
		for _, w := range workers {
			if !w.healthy(1, 200*time.Millisecond) {
				return false
			}
		}
		return true
	})
	stopAll()
	for _, w := range workers {
		rec := "no failure"
		if !w.lastFail.IsZero() {
			rec = fmt.Sprintf("last failure %v after the kill, working again %v after it", w.lastFail.Sub(killed).Round(time.Millisecond), w.okSince.Sub(killed).Round(time.Millisecond))
			if w.okSince.After(recoverBy) {
				t.Errorf("%s: working again only %v after the kill, bound %v", w.name, w.okSince.Sub(killed), bound)
			}
		}
		t.Logf("%s: %d ok, %d errors, %d degraded (admitted unchecked); %s; first error: %v", w.name, w.ok, w.fail, w.degraded, rec, w.firstErr)
	}

	// The held lock survived (it was replicated long before) and still
	// excludes others.
	if err := lease.Extend(ctx, 0); err != nil {
		t.Errorf("the lock held through the failover: Extend = %v", err)
	}
	if l, err := other.TryAcquire(ctx, lockKey, lock.Options{TTL: time.Second}); !errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("another process took the lock held through the failover: %v, %v", l, err)
	}
	// The lock acquired while the replicas were cut off: lost if another
	// process can take it now.
	if l, err := other.TryAcquire(ctx, probeKey, lock.Options{TTL: time.Second}); err == nil {
		t.Logf("LOST: the lock acquired while the replicas were cut off (fence %d) was lost; another process got it with fence %d", probe.Fence, l.Fence)
		// Fences are minted from the server's clock, so even a lost
		// counter does not make them go backwards (one machine: one clock).
		if l.Fence <= probe.Fence {
			t.Errorf("the fence went backwards across the failover: %d after %d", l.Fence, probe.Fence)
		}
	} else if !errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("TryAcquire(probe): %v", err)
	} else {
		t.Logf("the lock acquired while the replicas were cut off survived")
	}

	// The cache: the answer stored before the cut is still served; the one
	// stored after it is a miss (a second upstream call, never a wrong
	// answer).
	if _, ok, err := cache.Get(ctx, cachedBefore, "answer"); err != nil || !ok {
		t.Errorf("the answer cached before the cut: hit %v, %v; want a hit", ok, err)
	}
	if _, ok, err := cache.Get(ctx, cachedAfter, "answer"); err != nil {
		t.Errorf("Get: %v", err)
	} else if !ok {
		t.Logf("LOST: the answer cached while the replicas were cut off is a miss")
	} else {
		t.Logf("the answer cached while the replicas were cut off survived")
	}

	// De-duplication: another process joining the flight led since before
	// the cut follows it; joining the one claimed after the cut, it leads
	// a second, duplicate call.
	if l, f, err := dedupB.Join(ctx, flightBefore, "fp", time.Minute); err != nil {
		t.Errorf("Join of the flight led since before the cut: %v", err)
	} else if l != nil {
		t.Errorf("another process leads the flight led since before the cut: a duplicate call")
		_ = l.Abort(ctx)
	} else {
		f.Close()
	}
	if l, f, err := dedupB.Join(ctx, flightAfter, "fp", time.Minute); err != nil {
		t.Errorf("Join of the flight claimed after the cut: %v", err)
	} else if l != nil {
		t.Logf("LOST: the flight claimed while the replicas were cut off has a second leader: one duplicate upstream call")
		_ = l.Abort(ctx)
	} else {
		t.Logf("the flight claimed while the replicas were cut off kept its leader")
		f.Close()
	}

	// Spend: what was acknowledged before the cut survived; what was
	// acknowledged after it may not have.
	st, err := bm.Spend(ctx, bud, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.Spent.Tokens < ackedBefore {
		t.Errorf("spend %d tokens after the failover, but %d were acknowledged and replicated before it", st.Spent.Tokens, ackedBefore)
	}
	t.Logf("budget: %d tokens acknowledged, %d stored after the failover: %d lost", acked, st.Spent.Tokens, max(0, acked-st.Spent.Tokens))
	pst, err := bm.Spend(ctx, probeBud, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("budget: the settle made while the replicas were cut off: 1000 tokens acknowledged, %d stored after the failover", pst.Spent.Tokens)
}

// waitReplicated waits until every replica of m has acknowledged m's
// replication offset as read now.
func waitReplicated(t *testing.T, ctx context.Context, m *testutil.Redis) {
	t.Helper()
	info := func() string {
		res, err := m.Command(ctx, "INFO", "replication")
		if err != nil {
			t.Fatal(err)
		}
		s, _ := res.ToString()
		return s
	}
	field := func(s, name string) string {
		for _, line := range strings.Split(s, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
				return v
			}
		}
		return ""
	}
	target, _ := strconv.ParseInt(field(info(), "master_repl_offset"), 10, 64)
	waitUntil(t, ctx, time.Minute, "replicas catch up", func() bool {
		s := info()
		n, _ := strconv.Atoi(field(s, "connected_slaves"))
		if n == 0 {
			return false
		}
		for i := range n {
			// slave0:ip=127.0.0.1,port=1234,state=online,offset=42,lag=0
			v := field(s, "slave"+strconv.Itoa(i))
			_, off, _ := strings.Cut(v, "offset=")
			off, _, _ = strings.Cut(off, ",")
			if o, _ := strconv.ParseInt(off, 10, 64); o < target {
				return false
			}
		}
		return true
	})
}

// waitUntil polls cond until it holds, failing the test after d.
func waitUntil(t *testing.T, ctx context.Context, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not within %v", what, d)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

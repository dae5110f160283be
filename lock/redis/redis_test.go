package redis_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/locktest"
	"github.com/llmgate/llmgate/lock/redis"
)

// Environment of the helper process (see TestHelperProcess).
const (
	envKey    = "LLMGATE_LOCK_HELPER_KEY"   // lock key
	envFair   = "LLMGATE_LOCK_HELPER_FAIR"  // "true" or "false"
	envTTL    = "LLMGATE_LOCK_HELPER_TTL"   // lease TTL (time.ParseDuration)
	envWL     = "LLMGATE_LOCK_HELPER_WL"    // waiter lease
	envCount  = "LLMGATE_LOCK_HELPER_COUNT" // counter file (count mode)
	envFences = "LLMGATE_LOCK_HELPER_FENCE" // fences file (count mode)
	envRounds = "LLMGATE_LOCK_HELPER_N"     // increments (count mode)

)

const defaultPrefix = "llmgate:lock:"

// lockKey is the Redis key holding key's owner token.
func lockKey(prefix, key string) string { return prefix + "{" + key + "}" }

// queueKey is the Redis zset of key's waiters.
func queueKey(prefix, key string) string { return lockKey(prefix, key) + ":q" }

func newKey(t *testing.T) string {
	return "redistest/" + strings.ReplaceAll(t.Name(), "/", ".") + "/" + lock.NewToken()[:8]
}

// newLocker returns a Locker on its own client: a separate "process".
func newLocker(t *testing.T, r *testutil.Redis) *lock.Locker {
	t.Helper()
	return lock.New(redis.New(r.Client(t), redis.Config{}))
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestConformance(t *testing.T) {
	r := testutil.StartRedis(t)
	locktest.Run(t, func(t *testing.T) lock.Backend {
		return redis.New(r.Client(t), redis.Config{})
	})
}

type acquired struct {
	lease *lock.Lease
	err   error
	at    time.Time
}

func acquireAsync(ctx context.Context, l *lock.Locker, key string, opts lock.Options) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, opts)
		ch <- acquired{lease, err, time.Now()}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan acquired, d time.Duration, what string) acquired {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: Acquire: %v", what, r.err)
		}
		return r
	case <-time.After(d):
		t.Fatalf("%s: Acquire did not return within %v", what, d)
		return acquired{}
	}
}

// waitWaiters polls Redis until n waiters are queued for key.
func waitWaiters(t *testing.T, ctx context.Context, l *lock.Locker, key string, n int) {
	t.Helper()
	in := l.Backend().(lock.Inspector)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := in.Waiters(ctx, key)
		if err != nil {
			t.Fatalf("Waiters: %v", err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Waiters(%q) = %d after 10s, want %d", key, got, n)
		}
		time.Sleep(time.Millisecond) // polling an external observable: nothing to select on
	}
}

// redisGet reads a string key from outside ("" and false if it is missing).
func redisGet(t *testing.T, c rueidis.Client, key string) (string, bool) {
	t.Helper()
	v, err := c.Do(t.Context(), c.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v, true
}

// lockState reads a lock key from outside: its owner token ("" when free or
// missing) and the lease left in ms by the server's clock. It knows both
// forms of the value (acquire.lua): the bare owner token, whose lease is the
// key's TTL, and "owner:expires_ms:fence:granted_us:grant_ms".
func lockState(t *testing.T, c rueidis.Client, key string) (owner string, leftMS int64) {
	t.Helper()
	v, ok := redisGet(t, c, key)
	if !ok {
		return "", 0
	}
	parts := strings.Split(v, ":")
	if len(parts) == 1 {
		pttl, err := c.Do(t.Context(), c.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PTTL %s: %v", key, err)
		}
		if pttl <= 0 {
			t.Fatalf("%s = %q (the short form) has PTTL %d, want its lease", key, v, pttl)
		}
		return v, pttl
	}
	if len(parts) != 5 {
		t.Fatalf("GET %s = %q, want owner or owner:expires_ms:fence:granted_us:grant_ms", key, v)
	}
	tm, err := c.Do(t.Context(), c.B().Time().Build()).AsStrSlice()
	if err != nil || len(tm) != 2 {
		t.Fatalf("TIME: %v %v", tm, err)
	}
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	usec, _ := strconv.ParseInt(tm[1], 10, 64)
	nowMS := sec*1000 + usec/1000
	expires, _ := strconv.ParseInt(parts[1], 10, 64)
	if parts[0] == "-" || expires <= nowMS {
		return "", 0
	}
	return parts[0], expires - nowMS
}

// ---------------------------------------------------------------------------
// Helper process

// TestHelperProcess is not a test: it is the body of the child processes
// the other tests start (testutil.StartHelper) in mode count, hold or wait.
func TestHelperProcess(t *testing.T) {
	mode, ctx, c := testutil.Helper(t)
	var err error
	l := lock.New(redis.New(c, redis.Config{}))
	key := os.Getenv(envKey)
	opts := lock.Options{Fair: os.Getenv(envFair) == "true"}
	if s := os.Getenv(envTTL); s != "" {
		if opts.TTL, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	if s := os.Getenv(envWL); s != "" {
		if opts.WaiterLease, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	switch mode {
	case "count":
		n, err := strconv.Atoi(os.Getenv(envRounds))
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := increment(ctx, l, key, opts, i%2 == 0, os.Getenv(envCount), os.Getenv(envFences)); err != nil {
				t.Fatalf("increment %d: %v", i, err)
			}
		}
	case "hold":
		before := time.Now()
		lease, err := l.TryAcquire(ctx, key, opts)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		testutil.Say("held %d %d", lease.Fence, before.UnixNano())
		<-ctx.Done() // until killed
	case "wait":
		testutil.Say("waiting")
		lease, err := l.Acquire(ctx, key, opts)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		testutil.Say("acquired %d", lease.Fence)
		<-ctx.Done() // until killed
	default:
		t.Fatalf("unknown helper mode %q", mode)
	}
}

// increment adds one to the number in counterPath under the lock, with a
// plain read-modify-write that loses updates unless the lock excludes every
// other process, and appends the fence to fencesPath.
func increment(ctx context.Context, l *lock.Locker, key string, opts lock.Options, useDo bool, counterPath, fencesPath string) error {
	critical := func(lease *lock.Lease) error {
		b, err := os.ReadFile(counterPath)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return fmt.Errorf("counter file holds %q (a concurrent write?): %w", b, err)
		}
		runtime.Gosched()
		if err := os.WriteFile(counterPath, []byte(strconv.Itoa(n+1)), 0o600); err != nil {
			return err
		}
		f, err := os.OpenFile(fencesPath, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(f, "%d\n", lease.Fence)
		return errors.Join(err, f.Close())
	}
	if useDo {
		return l.Do(ctx, key, opts, func(_ context.Context, lease *lock.Lease) error { return critical(lease) })
	}
	lease, err := l.Acquire(ctx, key, opts)
	if err != nil {
		return err
	}
	return errors.Join(critical(lease), lease.Release(ctx))
}

// ---------------------------------------------------------------------------
// Redis-specific tests

// TestMutualExclusionAcrossProcesses: 4 child processes and 8 goroutines of
// this one increment a counter in a file without any other protection; the
// count is exact and the fences, in acquisition order, strictly increase.
func TestMutualExclusionAcrossProcesses(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 90*time.Second)
			const procs, goroutines, rounds = 4, 8, 50
			key := newKey(t)
			dir := t.TempDir()
			counter, fences := dir+"/counter", dir+"/fences"
			if err := os.WriteFile(counter, []byte("0"), 0o600); err != nil {
				t.Fatal(err)
			}
			opts := lock.Options{TTL: 10 * time.Second, Fair: fair}

			var children []*testutil.Child
			for range procs {
				children = append(children, testutil.StartHelper(t, ctx, r, "count",
					envKey+"="+key,
					envFair+"="+strconv.FormatBool(fair), envTTL+"="+opts.TTL.String(),
					envCount+"="+counter, envFences+"="+fences, envRounds+"="+strconv.Itoa(rounds)))
			}
			// The parent's goroutines share one backend: in non-fair mode they
			// queue locally behind one Redis-level waiter.
			l := newLocker(t, r)
			errs := make(chan error, goroutines)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range rounds {
						if err := increment(ctx, l, key, opts, (g+i)%2 == 0, counter, fences); err != nil {
							errs <- fmt.Errorf("goroutine %d increment %d: %w", g, i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			for i, c := range children {
				if err := c.Exited(t, 60*time.Second); err != nil {
					t.Errorf("child %d: %v", i, err)
				}
			}
			want := (procs + goroutines) * rounds
			b, err := os.ReadFile(counter)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(b)); got != strconv.Itoa(want) {
				t.Errorf("counter = %s, want %d", got, want)
			}
			b, err = os.ReadFile(fences)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Fields(string(b))
			if len(lines) != want {
				t.Errorf("%d fences recorded, want %d", len(lines), want)
			}
			var prev uint64
			for i, s := range lines {
				f, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					t.Fatalf("fence line %d: %v", i, err)
				}
				if f <= prev {
					t.Fatalf("fence %d = %d is not above the previous %d", i, f, prev)
				}
				prev = f
			}
		})
	}
}

// TestWatchdogKeepsLockBeyondTTL: Do keeps a 1.2s lease for 3.6s (3 TTLs)
// while another client's TryAcquire keeps failing, and the key in Redis
// never carries a lease longer than the TTL: it is renewed, not set long.
// The TTL is long against the scheduling stalls of a busy machine: the
// renewals come every 400ms, 800ms before the lease would run out.
func TestWatchdogKeepsLockBeyondTTL(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	l, other := newLocker(t, r), newLocker(t, r)
	observer := r.Client(t)
	key := newKey(t)
	const ttl, hold, probe = 1200 * time.Millisecond, 3600 * time.Millisecond, 100 * time.Millisecond
	err := l.Do(ctx, key, lock.Options{TTL: ttl}, func(fctx context.Context, lease *lock.Lease) error {
		timer := time.NewTimer(hold)
		defer timer.Stop()
		ticker := time.NewTicker(probe)
		defer ticker.Stop()
		probes := 0
		for {
			select {
			case <-fctx.Done():
				t.Fatalf("lock lost after %d probes: %v", probes, context.Cause(fctx))
			case <-ticker.C:
				if got, err := other.TryAcquire(ctx, key, lock.Options{TTL: ttl}); !errors.Is(err, lock.ErrNotObtained) {
					if got != nil {
						_ = got.Release(ctx)
					}
					t.Fatalf("probe %d: TryAcquire by another client = %v, want ErrNotObtained", probes, err)
				}
				if _, left := lockState(t, observer, lockKey(defaultPrefix, key)); left <= 0 || left > ttl.Milliseconds() {
					t.Fatalf("probe %d: lease left = %dms, want in (0, %d]", probes, left, ttl.Milliseconds())
				}
				probes++
			case <-timer.C:
				if probes < int(hold/probe)/4 {
					t.Fatalf("only %d probes in %v", probes, hold)
				}
				return nil
			}
		}
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	lease, err := other.TryAcquire(ctx, key, lock.Options{TTL: ttl})
	if err != nil {
		t.Fatalf("TryAcquire after Do: %v", err)
	}
	_ = lease.Release(ctx)
}

// lostWithin runs Do with ttl; inside, interfere() takes the lock away from
// outside. It checks that fn's context is cancelled with ErrLost within
// bound of interfere returning.
func lostWithin(t *testing.T, l *lock.Locker, key string, ttl, bound time.Duration, interfere func()) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	var after time.Duration
	err := l.Do(ctx, key, lock.Options{TTL: ttl}, func(fctx context.Context, lease *lock.Lease) error {
		interfere()
		done := time.Now()
		select {
		case <-fctx.Done():
			after = time.Since(done)
		case <-time.After(10 * time.Second):
			t.Fatalf("holder's context not cancelled within 10s")
		}
		if cause := context.Cause(fctx); !errors.Is(cause, lock.ErrLost) {
			t.Errorf("context cause = %v, want ErrLost", cause)
		}
		return nil
	})
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Do = %v, want ErrLost", err)
	}
	t.Logf("holder's context cancelled %v after the interference; Do = %v", after, err)
	if after > bound {
		t.Fatalf("holder's context cancelled %v after the interference, want within %v", after, bound)
	}
}

// TestExternalDeleteCancelsHolder: a DEL of the lock key from outside ends
// the holder's context at its next renewal.
func TestExternalDeleteCancelsHolder(t *testing.T) {
	r := testutil.StartRedis(t)
	key := newKey(t)
	// The TTL is long enough that a loss found out at the next renewal
	// (every 2s), even late by a busy machine's stalls, comes well before
	// the validity the holder would otherwise run out (6s).
	const ttl = 6 * time.Second
	late := r.LateBound(t, 50, 2*time.Second)
	lostWithin(t, newLocker(t, r), key, ttl, ttl/3+late, func() {
		if n := r.Int(t, "DEL", lockKey(defaultPrefix, key)); n != 1 {
			t.Fatalf("DEL of the lock key removed %d keys, want 1 (key layout changed?)", n)
		}
	})
}

// TestRedisRestartCancelsHolder: a restart that loses the lock ends the
// holder's context about one renewal period after the server is back.
func TestRedisRestartCancelsHolder(t *testing.T) {
	r := testutil.StartRedis(t)
	key := newKey(t)
	const ttl = 6 * time.Second // as in TestExternalDeleteCancelsHolder
	late := r.LateBound(t, 50, 2*time.Second)
	lostWithin(t, newLocker(t, r), key, ttl, ttl/3+late, func() {
		if err := r.Restart(); err != nil {
			t.Fatalf("restart redis: %v", err)
		}
	})
}

// TestCrashedHolderTakenOverAtExpiry: a holder process killed with SIGKILL
// never releases; a waiter gets the lock right when its lease expires.
func TestCrashedHolderTakenOverAtExpiry(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	key := newKey(t)
	const ttl = 500 * time.Millisecond
	// The waiter renews its place every 10s: only its wake-up at the
	// holder's expiry explains an acquisition within late.
	late := r.LateBound(t, 50, 2*time.Second)
	child := testutil.StartHelper(t, ctx, r, "hold", envKey+"="+key, envTTL+"="+ttl.String())
	var childFence uint64
	var childStartNS int64
	line := child.Line(t, 30*time.Second)
	if _, err := fmt.Sscanf(line, "held %d %d", &childFence, &childStartNS); err != nil {
		t.Fatalf("helper said %q: %v", line, err)
	}
	heldBy := time.Now() // the child's lease started before this
	child.Kill()

	w := receive(t, acquireAsync(ctx, newLocker(t, r), key, lock.Options{TTL: 5 * time.Second, WaiterLease: 30 * time.Second}), 10*time.Second, "waiter")
	defer func() { _ = w.lease.Release(ctx) }()
	// Wall clock: the child is another process on this machine.
	earliest := time.Unix(0, childStartNS).Add(ttl - 2*time.Millisecond) // Redis expiry has ms resolution
	if w.at.Round(0).Before(earliest) {
		t.Fatalf("waiter got the lock %v before the crashed holder's lease could expire", earliest.Sub(w.at.Round(0)))
	}
	if d := w.at.Sub(heldBy.Add(ttl)); d > late {
		t.Fatalf("waiter got the lock %v after the crashed holder's lease expired, want within %v", d, late)
	}
	t.Logf("waiter got the lock at most %v after expiry", w.at.Sub(heldBy.Add(ttl)))
	if w.lease.Fence <= childFence {
		t.Fatalf("waiter's fence %d, want > crashed holder's %d", w.lease.Fence, childFence)
	}
}

// TestHandOffLatency: a release wakes the waiter directly. The median
// release-to-acquire latency over 200 hand-offs between two clients is far
// below any polling interval. (A sanity bound, not a benchmark.)
func TestHandOffLatency(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			ls := []*lock.Locker{newLocker(t, r), newLocker(t, r)}
			key := newKey(t)
			opts := lock.Options{TTL: 10 * time.Second, Fair: fair}
			const n = 200
			holder, err := ls[0].TryAcquire(ctx, key, opts)
			if err != nil {
				t.Fatal(err)
			}
			lat := make([]time.Duration, 0, n)
			for i := range n {
				waiter := ls[(i+1)%2]
				ch := acquireAsync(ctx, waiter, key, opts)
				waitWaiters(t, ctx, waiter, key, 1)
				start := time.Now()
				if err := holder.Release(ctx); err != nil {
					t.Fatalf("hand-off %d: Release: %v", i, err)
				}
				got := receive(t, ch, 10*time.Second, fmt.Sprintf("hand-off %d", i))
				if got.lease.Fence <= holder.Fence {
					t.Fatalf("hand-off %d: fence %d, want > %d", i, got.lease.Fence, holder.Fence)
				}
				lat = append(lat, got.at.Sub(start))
				holder = got.lease
			}
			_ = holder.Release(ctx)
			slices.Sort(lat)
			median := lat[n/2]
			t.Logf("hand-off latency over %d hand-offs: median %v, p90 %v, max %v", n, median, lat[n*9/10], lat[n-1])
			// Far below the waiters' renewal every 667ms; in round trips,
			// with a floor for a busy machine.
			if bound := r.LateBound(t, 20, 50*time.Millisecond); median > bound {
				t.Fatalf("median hand-off latency %v, want below %v (is the waiter polling?)", median, bound)
			}
		})
	}
}

// TestFairQueueAcrossClients: 8 waiters on 8 clients are served in arrival
// order, and the queue in Redis empties behind them.
func TestFairQueueAcrossClients(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	key := newKey(t)
	holder := newLocker(t, r)
	opts := lock.Options{TTL: 10 * time.Second, Fair: true}
	lease, err := holder.TryAcquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	order := make(chan int, n)
	results := make(chan error, n)
	for i := range n {
		w := newLocker(t, r)
		go func() {
			l, err := w.Acquire(ctx, key, opts)
			if err != nil {
				results <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			order <- i
			results <- l.Release(ctx)
		}()
		waitWaiters(t, ctx, holder, key, i+1)
		if got := r.Int(t, "ZCARD", queueKey(defaultPrefix, key)); got != int64(i+1) {
			t.Fatalf("ZCARD of the queue key = %d, want %d", got, i+1)
		}
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range n {
		select {
		case err := <-results:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("waiters not all served within 10s")
		}
	}
	close(order)
	got := slices.Collect(func(yield func(int) bool) {
		for i := range order {
			if !yield(i) {
				return
			}
		}
	})
	if want := []int{0, 1, 2, 3, 4, 5, 6, 7}; !slices.Equal(got, want) {
		t.Fatalf("served in order %v, want %v", got, want)
	}
	if n := r.Int(t, "EXISTS", queueKey(defaultPrefix, key)); n != 0 {
		t.Fatalf("queue key still exists after every waiter was served")
	}
}

// TestKilledWaiterDoesNotStallQueue: a waiter process killed with SIGKILL
// while queued (it may even be handed the lock) holds up the next waiter by
// at most its waiter lease.
func TestKilledWaiterDoesNotStallQueue(t *testing.T) {
	r := testutil.StartRedis(t)
	late := r.LateBound(t, 50, 2*time.Second)
	ctx := testCtx(t, 30*time.Second)
	key := newKey(t)
	const waiterLease = 300 * time.Millisecond
	opts := lock.Options{TTL: 5 * time.Second, WaiterLease: waiterLease, Fair: true}
	holder := newLocker(t, r)
	lease, err := holder.TryAcquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	child := testutil.StartHelper(t, ctx, r, "wait", envKey+"="+key, envFair+"=true",
		envTTL+"="+opts.TTL.String(), envWL+"="+waiterLease.String())
	if line := child.Line(t, 30*time.Second); line != "waiting" {
		t.Fatalf("helper said %q", line)
	}
	waitWaiters(t, ctx, holder, key, 1)
	ch := acquireAsync(ctx, newLocker(t, r), key, opts)
	waitWaiters(t, ctx, holder, key, 2)
	child.Kill()

	// Release at once: the dead waiter's place has not expired yet, so the
	// lock is handed to it first.
	start := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := receive(t, ch, 10*time.Second, "live waiter")
	defer func() { _ = got.lease.Release(ctx) }()
	d := got.at.Sub(start)
	t.Logf("live waiter served %v after the release", d)
	// A dead waiter handed the lock pins it for its waiter lease, not for
	// the 5s TTL; late allows for a busy machine.
	if bound := waiterLease + late; d > bound {
		t.Fatalf("live waiter served %v after the release, want within %v", d, bound)
	}
	if got.lease.Fence <= lease.Fence {
		t.Fatalf("fence %d, want > %d", got.lease.Fence, lease.Fence)
	}
	if err := got.lease.Err(); err != nil {
		t.Fatalf("live waiter's lease Err() = %v", err)
	}
}

// TestFencesSurviveDataLoss: after a restart that loses every key, fences
// keep increasing (they never fall below the server clock in µs).
func TestFencesSurviveDataLoss(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	key := newKey(t)
	old := newLocker(t, r)
	var last uint64
	for i := range 50 {
		lease, err := old.TryAcquire(ctx, key, lock.Options{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if lease.Fence <= last {
			t.Fatalf("acquisition %d: fence %d, want > %d", i, lease.Fence, last)
		}
		last = lease.Fence
		if i < 49 {
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The last lease is still held when the server dies.
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if n := r.Int(t, "DBSIZE"); n != 0 {
		t.Fatalf("DBSIZE after restart = %d, want 0 (data should be lost)", n)
	}
	lease, err := newLocker(t, r).TryAcquire(ctx, key, lock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("TryAcquire after restart: %v", err)
	}
	if lease.Fence <= last {
		t.Fatalf("fence after data loss %d, want > %d", lease.Fence, last)
	}
	last = lease.Fence
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The client from before the restart reconnects (Acquire retries
	// connection errors) and continues the sequence.
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lease, err = old.Acquire(actx, key, lock.Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire on the pre-restart client: %v", err)
	}
	if lease.Fence <= last {
		t.Fatalf("fence %d, want > %d", lease.Fence, last)
	}
	_ = lease.Release(ctx)
}

// TestStaleLeaseDoesNotTouchNewHolder: Release and Extend of a lease whose
// lock expired and was taken return ErrNotHeld and leave the new holder's
// key, its value and its TTL, as they were.
func TestStaleLeaseDoesNotTouchNewHolder(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, prefix := range []string{"", "custom:"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			key := newKey(t)
			cfg := redis.Config{Prefix: prefix}
			wantPrefix := prefix
			if wantPrefix == "" {
				wantPrefix = defaultPrefix
			}
			a := lock.New(redis.New(r.Client(t), cfg))
			b := lock.New(redis.New(r.Client(t), cfg))
			observer := r.Client(t)
			k := lockKey(wantPrefix, key)

			stale, err := a.TryAcquire(ctx, key, lock.Options{TTL: 150 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if v, _ := lockState(t, observer, k); v != stale.Token {
				t.Fatalf("owner of %s = %q, want the holder's token %q", k, v, stale.Token)
			}
			fresh := receive(t, acquireAsync(ctx, b, key, lock.Options{TTL: 10 * time.Second}), 10*time.Second, "new holder")
			if err := stale.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
				t.Fatalf("stale Release = %v, want ErrNotHeld", err)
			}
			if err := stale.Extend(ctx, lock.MinTTL); !errors.Is(err, lock.ErrNotHeld) {
				t.Fatalf("stale Extend = %v, want ErrNotHeld", err)
			}
			if err := a.Backend().Release(ctx, key, stale.Token); !errors.Is(err, lock.ErrNotHeld) {
				t.Fatalf("stale backend Release = %v, want ErrNotHeld", err)
			}
			v, left := lockState(t, observer, k)
			if v != fresh.lease.Token {
				t.Fatalf("owner of %s = %q, want the new holder's token %q", k, v, fresh.lease.Token)
			}
			if left < 5000 {
				t.Fatalf("lease left on %s = %dms after the stale Extend, want the new holder's ~10s", k, left)
			}
			if err := fresh.lease.Release(ctx); err != nil {
				t.Fatalf("new holder's Release: %v", err)
			}
			if v, _ := lockState(t, observer, k); v != "" {
				t.Fatalf("%s still owned by %q after the release", k, v)
			}
		})
	}
}

// TestNothingLeftBehind: after waiters gave up (some racing a hand-off) and
// the holder released, only the fence counter is left under the lock's hash
// tag: no queue entry, no wake-up list, no lock key.
func TestNothingLeftBehind(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	observer := r.Client(t)
	for _, fair := range []bool{false, true} {
		key := newKey(t)
		holder, w := newLocker(t, r), newLocker(t, r)
		opts := lock.Options{TTL: 10 * time.Second, Fair: fair}
		for i := range 10 {
			lease, err := holder.TryAcquire(ctx, key, opts)
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			var chs []<-chan acquired
			wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			for range 3 {
				chs = append(chs, acquireAsync(wctx, w, key, opts))
			}
			<-time.After(time.Duration(10+i*2) * time.Millisecond) // race the release against the deadline
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			for _, ch := range chs {
				select {
				case a := <-ch:
					if a.err == nil {
						_ = a.lease.Release(ctx)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("waiter did not return")
				}
			}
			cancel()
		}
		keys, err := observer.Do(ctx, observer.B().Keys().Pattern(lockKey(defaultPrefix, key)+"*").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(keys)
		if want := []string{lockKey(defaultPrefix, key) + ":f"}; !slices.Equal(keys, want) {
			t.Errorf("fair=%v: keys left: %q, want only the fence counter %q", fair, keys, want)
		}
	}
}

// TestWaiterSurvivesRestart: a waiter blocked in Redis when the server
// restarts (losing the lock) reconnects and takes the now free lock
// promptly; the old holder's lease is no longer the owner.
func TestWaiterSurvivesRestart(t *testing.T) {
	r := testutil.StartRedis(t)
	late := r.LateBound(t, 50, 2*time.Second)
	ctx := testCtx(t, 30*time.Second)
	key := newKey(t)
	h, w := newLocker(t, r), newLocker(t, r)
	lease, err := h.TryAcquire(ctx, key, lock.Options{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ch := acquireAsync(ctx, w, key, lock.Options{TTL: 5 * time.Second})
	waitWaiters(t, ctx, w, key, 1)
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	got := receive(t, ch, 10*time.Second, "waiter across a restart")
	defer func() { _ = got.lease.Release(ctx) }()
	d := got.at.Sub(restarted)
	t.Logf("waiter got the lock %v after the restart", d)
	if d > late {
		t.Fatalf("waiter got the lock %v after the restart, want within %v", d, late)
	}
	if got.lease.Fence <= lease.Fence {
		t.Fatalf("fence %d after the restart, want > %d", got.lease.Fence, lease.Fence)
	}
	// The old holder's client finds its connection dead on first use (the
	// script is not retried by the client); a second attempt reaches the
	// new server, which says the lease is gone.
	var relErr error
	for attempt := range 3 {
		if relErr = lease.Release(ctx); relErr == nil || errors.Is(relErr, lock.ErrNotHeld) {
			break
		}
		t.Logf("old holder's Release attempt %d after the restart: %v", attempt, relErr)
	}
	if !errors.Is(relErr, lock.ErrNotHeld) {
		t.Fatalf("old holder's Release after the restart = %v, want ErrNotHeld", relErr)
	}
}

// TestBusyProcessCannotStarveOthers: without fair mode a release passes the
// lock straight to a goroutine of the same process, but only while the
// first waiter queued in Redis (another process) has waited less than the
// pass limit. Eight goroutines of one process hammer the lock; a waiter of
// another process must still get it promptly, every time.
func TestBusyProcessCannotStarveOthers(t *testing.T) {
	r := testutil.StartRedis(t)
	late := r.LateBound(t, 50, 2*time.Second)
	ctx := testCtx(t, 60*time.Second)
	busy, other := newLocker(t, r), newLocker(t, r)
	key := newKey(t)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var passes atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				lease, err := busy.Acquire(ctx, key, lock.Options{})
				if err != nil {
					t.Error(err)
					return
				}
				passes.Add(1)
				if err := lease.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	var worst time.Duration
	for i := range 20 {
		start := time.Now()
		lease, err := other.Acquire(ctx, key, lock.Options{})
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if d := time.Since(start); d > worst {
			worst = d
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("busy process: %d acquisitions; the other process's worst wait: %v", passes.Load(), worst)
	// The pass limit is 5ms; a starved process would wait until the busy
	// one stopped. Allow for a loaded 2-core machine.
	if worst > late {
		t.Errorf("the other process waited up to %v while one process kept passing the lock to itself", worst)
	}
}

// TestAcquireWithoutPubSubPermission: on a server whose ACL forbids Pub/Sub
// a blocking Acquire cannot be woken; it must say so at once, not hang until
// its deadline. TryAcquire needs no subscription and still works.
func TestAcquireWithoutPubSubPermission(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	if line, err := r.Do(ctx, "ACL", "SETUSER", "nopubsub", "on", ">pw", "~*", "&*", "+@all", "-@pubsub"); err != nil || line != "+OK" {
		t.Fatalf("ACL SETUSER: %q, %v", line, err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Addr}, Username: "nopubsub", Password: "pw", DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	l := lock.New(redis.New(c, redis.Config{}))
	lease, err := l.TryAcquire(ctx, newKey(t), lock.Options{})
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	_ = lease.Release(ctx)

	start := time.Now()
	_, err = l.Acquire(ctx, newKey(t), lock.Options{})
	if err == nil || !strings.Contains(err.Error(), "subscribe") {
		t.Fatalf("Acquire without Pub/Sub permission = %v, want an error about the subscription", err)
	}
	if errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("Acquire error %v wraps ErrNotObtained; it is a setup problem, not contention", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Acquire took %v to report it", d)
	}
}

// backgroundPipes counts the rueidis connections that run background
// reader and writer goroutines.
func backgroundPipes() int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return strings.Count(string(buf[:n]), "rueidis.(*pipe)._backgroundWrite")
}

// A caller whose context can be cancelled but has no deadline (a signal
// context, say) keeps its client's connection on rueidis's fast path, where
// a command is written and its reply read by the calling goroutine; only
// the wake-up subscription's dedicated connection runs in the background.
func TestCancellableContextKeepsFastPath(t *testing.T) {
	r := testutil.StartRedis(t)
	// Other clients of this test binary (the shared topologies') may run
	// in background mode: only this one's count.
	before := backgroundPipes()
	c := r.Client(t)
	b := redis.New(c, redis.Config{})
	l := lock.New(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := newKey(t)
	for range 3 {
		lease, err := l.Acquire(ctx, key, lock.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Waiters(ctx, key); err != nil {
			t.Fatal(err)
		}
		if err := lease.Extend(ctx, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// 1: the subscription, which also shows that the count sees such
	// connections at all.
	if n := backgroundPipes() - before; n != 1 {
		t.Fatalf("%d more connections in background mode, want 1 (the subscription's)", n)
	}
}

// On the fast path a cancel cannot interrupt a command in flight, so a
// command gets no more than a second when the caller's context has no
// deadline: a Redis that stops answering gives a clear error, not a hang,
// and the client recovers once Redis answers again.
func TestUnansweredCommandBounded(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	l := lock.New(redis.New(c, redis.Config{}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := newKey(t)
	lease, err := l.TryAcquire(ctx, key, lock.Options{}) // connects
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if line, err := r.Do(testCtx(t, 5*time.Second), "CLIENT", "PAUSE", "1500", "ALL"); err != nil || line != "+OK" {
		t.Fatalf("CLIENT PAUSE: %q, %v", line, err)
	}
	_, err = l.TryAcquire(ctx, key, lock.Options{})
	if err == nil || !strings.Contains(err.Error(), "no reply from Redis within 1s") {
		t.Fatalf("TryAcquire while Redis is paused = %v, want a no-reply error", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v says the caller's context ended; it did not", err)
	}
	// After the pause, on a new connection.
	lease, err = l.TryAcquire(testCtx(t, 10*time.Second), key, lock.Options{})
	if err != nil {
		t.Fatalf("TryAcquire after the pause: %v", err)
	}
	_ = lease.Release(ctx)
}

// TestQueueOutlivesItsWaiters: while waiters renew their places, the queue
// keys (which expire so that an abandoned queue vanishes) always live at
// least as long as every queued entry's lease, whatever mix of waiter
// leases is queued; and the waiters keep their places.
func TestQueueOutlivesItsWaiters(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	observer := r.Client(t)
	key := newKey(t)
	holder := newLocker(t, r)
	lease, err := holder.TryAcquire(ctx, key, lock.Options{TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The short leases are still long against a busy machine's stalls
	// (renewals every 200ms, 400ms before a place would lapse).
	leases := []time.Duration{600 * time.Millisecond, 1500 * time.Millisecond, 600 * time.Millisecond}
	// Each waiter releases as soon as it holds the lock: they are served in
	// the order they queued, which is not the order they were started in.
	done := make(chan error, len(leases))
	for _, wl := range leases {
		l := newLocker(t, r)
		go func() {
			a, err := l.Acquire(ctx, key, lock.Options{TTL: 5 * time.Second, WaiterLease: wl, Fair: true})
			if err == nil {
				err = a.Release(ctx)
			}
			done <- err
		}()
	}
	L := lockKey(defaultPrefix, key)
	// One atomic look: the server's time, the queue keys' TTLs, the leases.
	snapshot := `local t = redis.call('TIME')
return {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), redis.call('PTTL', KEYS[1] .. ':q'), redis.call('PTTL', KEYS[1] .. ':l'), redis.call('ZRANGE', KEYS[1] .. ':l', 0, -1, 'WITHSCORES')}`
	look := func() (nowMs, qttl, lttl int64, expiries []int64) {
		vals, err := observer.Do(ctx, observer.B().Eval().Script(snapshot).Numkeys(1).Key(L).Build()).ToArray()
		if err != nil {
			t.Fatal(err)
		}
		nowMs, _ = vals[0].AsInt64()
		qttl, _ = vals[1].AsInt64()
		lttl, _ = vals[2].AsInt64()
		entries, _ := vals[3].ToArray()
		for i := 1; i < len(entries); i += 2 {
			s, _ := entries[i].ToString()
			e, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatalf("lease score %q: %v", s, err)
			}
			expiries = append(expiries, int64(e))
		}
		return nowMs, qttl, lttl, expiries
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, _, _, e := look(); len(e) == len(leases) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("waiters did not queue")
		}
		runtime.Gosched()
	}
	// Watch for four of the longest lease: every waiter renews many times.
	samples := 0
	for end := time.Now().Add(4 * leases[1]); time.Now().Before(end); samples++ {
		now, qttl, lttl, expiries := look()
		if len(expiries) != len(leases) {
			t.Fatalf("after %d samples: %d entries queued, want %d", samples, len(expiries), len(leases))
		}
		for _, e := range expiries {
			if now+qttl < e || now+lttl < e {
				t.Fatalf("after %d samples: an entry's lease ends at %d ms, the queue keys at %d and %d", samples, e, now+qttl, now+lttl)
			}
		}
		<-time.After(5 * time.Millisecond) // a sampling interval, not a synchronisation
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range leases {
		if err := <-done; err != nil {
			t.Fatalf("a waiter: %v", err)
		}
	}
}

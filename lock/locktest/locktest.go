// Package locktest is the conformance suite every lock.Backend must pass.
//
// A backend's own tests call Run with a constructor; the suite drives the
// backend through the public lock.Locker API with real time and real
// goroutines, so it checks the whole lock (backend, lease, watchdog) and not
// a model of it. A backend that takes a clock also runs RunFakeClock: the
// tests where the store's time matters (expiry, extension, the watchdog),
// on a fake clock that they step by hand, with exact bounds; its Run then
// skips them (RunSkipping with OnFakeClock).
package locktest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/lock"
)

// Timing bounds. How late a waiter may be woken (suite.late) is measured at
// the start of Run from the store's round trip, with a floor that the
// scheduling stalls of a busy 2-core machine under -race do not reach. The
// tests that check it give their waiters a long WaiterLease (waitLease), so
// that a waiter that is not woken, and finds out only when it renews its
// place, is still far later than the bound.
const (
	// lateFloor is the least suite.late can be.
	lateFloor = 2 * time.Second
	// lateRTTs is suite.late in median store round trips, when more.
	lateRTTs = 50
	// waitLease is the WaiterLease of waiters whose wake-up is timed: they
	// renew their place every 10s.
	waitLease = 30 * time.Second
	// waitBound bounds every wait for something that should happen "now".
	waitBound = 10 * time.Second
	// pollEvery is the interval for polling Inspector.Waiters.
	pollEvery = 2 * time.Millisecond
)

// Run runs the conformance suite as subtests of t.
//
// newBackend is called at least once per subtest, with that subtest's t, and
// sometimes several times to stand for several processes. Every backend it
// returns during one Run must share one store, so that they see each other's
// locks; a networked backend should return a new client each time, so that
// the suite's separate holders behave like separate processes. Each subtest
// uses its own keys, so the store need not be empty.
func Run(t *testing.T, newBackend func(t *testing.T) lock.Backend) {
	RunSkipping(t, newBackend, nil)
}

// RunSkipping is Run for a backend that does not promise everything: each
// subtest named in skip (a top-level name, as listed in Run) is skipped with
// the reason given, which should say why the promise cannot hold.
func RunSkipping(t *testing.T, newBackend func(t *testing.T) lock.Backend, skip map[string]string) {
	s := &suite{newBackend: newBackend}
	s.late = s.lateBound(t)
	tests := []namedTest{
		{"TryAcquireFree", s.testTryAcquireFree},
		{"TryAcquireHeld", s.testTryAcquireHeld},
		{"KeysAreIndependent", s.testKeysAreIndependent},
		{"ReacquireAfterReleaseFenceIncreases", s.testReacquireFence},
		{"DoubleRelease", s.testDoubleRelease},
		{"ReleaseStaleLease", s.testReleaseStale},
		{"ExtendStaleLease", s.testExtendStale},
		{"ExtendHeldLease", s.testExtendHeld},
		{"ExpiryHandsOffToWaiter", s.testExpiryHandOff},
		{"FencesStrictlyIncrease", s.testFenceSequence},
		{"AcquireWokenByRelease", s.testWokenByRelease},
		{"AcquireContextEnds", s.testAcquireContextEnds},
		{"CancelledWaiterDoesNotStrandOthers", s.testCancelledWaiterDoesNotStrand},
		{"CancelRacingHandOff", s.testCancelRacingHandOff},
		{"FIFOFair", s.testFIFOFair},
		{"FIFOAcrossProcesses", s.testFIFOAcrossProcesses},
		{"HandOffTopsUpToTTL", s.testHandOffTopUp},
		{"MixedWaiterLeasesKeepPlaces", s.testMixedWaiterLeases},
		{"ShortWaiterLeaseKeepsPlace", s.testShortWaiterLease},
		{"MutualExclusion", s.testMutualExclusion},
		{"Do", s.testDo},
		{"DoWatchdogKeepsLock", s.testWatchdog},
		{"DoLostLockNotHeld", s.testLostNotHeld},
		{"DoLostLockUnconfirmed", s.testLostUnconfirmed},
		{"DoneAndErrAfterRelease", s.testDoneAfterRelease},
		{"ReleaseWithCancelledContext", s.testReleaseCancelledCtx},
		{"InvalidOptions", s.testInvalidOptions},
	}
	for _, tc := range tests {
		if reason, ok := skip[tc.name]; ok {
			t.Run(tc.name, func(t *testing.T) { t.Skip(reason) })
			continue
		}
		t.Run(tc.name, tc.fn)
	}
}

// fakeClockTests are the tests RunFakeClock runs.
func (s *suite) fakeClockTests() []namedTest {
	return []namedTest{
		{"ReleaseStaleLease", s.testReleaseStale},
		{"ExtendStaleLease", s.testExtendStale},
		{"ExtendHeldLease", s.testExtendHeld},
		{"ExpiryHandsOffToWaiter", s.testExpiryHandOff},
		{"FencesStrictlyIncrease", s.testFenceSequence},
		{"HandOffTopsUpToTTL", s.testHandOffTopUp},
		{"MixedWaiterLeasesKeepPlaces", s.testMixedWaiterLeases},
		{"ShortWaiterLeaseKeepsPlace", s.testShortWaiterLease},
		{"DoWatchdogKeepsLock", s.testWatchdog},
		{"DoLostLockNotHeld", s.testLostNotHeld},
		{"DoLostLockUnconfirmed", s.testLostUnconfirmed},
	}
}

type namedTest struct {
	name string
	fn   func(t *testing.T)
}

// RunFakeClock runs, as subtests of t, the tests of the suite that depend
// on the store's time: expiry, extension, hand-off at expiry, the watchdog's
// renewals and losses. Every backend newBackend returns must keep time on
// clk; the suite's Lockers do too (lock.WithClock), and the tests step clk
// instead of waiting, each step to the moment a timer is due and once the
// Locker waits for it, so every bound is exact however busy the machine.
func RunFakeClock(t *testing.T, clk *clock.Fake, newBackend func(t *testing.T) lock.Backend) {
	s := &suite{newBackend: newBackend, fake: clk} // late 0: time moves only when a test moves it
	for _, tc := range s.fakeClockTests() {
		t.Run(tc.name, tc.fn)
	}
}

// OnFakeClock names the tests RunFakeClock runs, each with a reason: pass
// it to RunSkipping for a backend that runs them there.
func OnFakeClock() map[string]string {
	m := make(map[string]string)
	for _, tc := range (&suite{}).fakeClockTests() {
		m[tc.name] = "runs on a fake clock (RunFakeClock)"
	}
	return m
}

type suite struct {
	newBackend func(t *testing.T) lock.Backend
	// fake, when set, is the clock the backends and Lockers keep time on:
	// the tests step it instead of waiting.
	fake *clock.Fake
	// late is how late a waiter may get the lock, or a holder hear of its
	// loss, after the event that should make it so.
	late time.Duration
}

// now is the store's time: the fake clock's, or the real one.
func (s *suite) now() time.Time {
	if s.fake != nil {
		return s.fake.Now()
	}
	return time.Now()
}

// pass lets d go by: it steps the fake clock, or sleeps (in the tests
// where the passage of time is what is tested).
func (s *suite) pass(d time.Duration) {
	if s.fake != nil {
		s.fake.Advance(d)
		return
	}
	time.Sleep(d)
}

// letExpire makes a lease of d taken just now expire while l's waiter for
// key is queued: on the fake clock it waits for the waiter to queue and
// steps the clock; a store on real time expires it by itself.
func (s *suite) letExpire(t *testing.T, ctx context.Context, l *lock.Locker, key string, d time.Duration) {
	t.Helper()
	if s.fake == nil {
		return
	}
	waitWaiters(t, ctx, l, key, 1)
	s.fake.Advance(d)
}

// steppedClock is the fake clock as one Locker sees it: each timer the
// Locker sets (the watchdog's next renewal or retry, a top-up) is reported
// on due with the time it fires, so that a test steps the clock to exactly
// that moment, and only once the Locker waits for it.
type steppedClock struct {
	*clock.Fake
	due chan time.Time
}

func (c *steppedClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	tm := c.Fake.AfterFunc(d, f)
	select {
	case c.due <- c.Fake.Now().Add(d):
	default: // nobody steps this Locker's timers
	}
	return tm
}

// wait waits for the Locker to set its next timer and returns when it is
// due; it reports false if done closes first.
func (c *steppedClock) wait(t *testing.T, done <-chan struct{}) (time.Time, bool) {
	t.Helper()
	select {
	case at := <-c.due:
		return at, true
	case <-done:
		return time.Time{}, false
	case <-time.After(waitBound):
		t.Fatalf("the Locker set no timer within %v", waitBound)
		return time.Time{}, false
	}
}

// next waits for the Locker's next timer and steps the clock to it; it
// reports false, without stepping, if done closes first.
func (c *steppedClock) next(t *testing.T, done <-chan struct{}) bool {
	t.Helper()
	at, ok := c.wait(t, done)
	if ok {
		c.Advance(at.Sub(c.Now()))
	}
	return ok
}

// lateBound measures the store's round trip (the median of a few
// TryAcquire and Release pairs) and returns suite.late: lateRTTs of them,
// at least lateFloor, at most half the renewal period of waitLease.
func (s *suite) lateBound(t *testing.T) time.Duration {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	l := s.locker(t)
	key := newKey(t)
	rtts := make([]time.Duration, 11)
	for i := range rtts {
		start := time.Now()
		mustRelease(t, ctx, mustTry(t, ctx, l, key, lock.Options{TTL: 5 * time.Second}))
		rtts[i] = time.Since(start) / 2
	}
	rtt := median(rtts)
	late := min(max(lateFloor, lateRTTs*rtt), waitLease/6)
	t.Logf("store round trip %v (median of %d): waiters may be %v late", rtt, len(rtts), late)
	return late
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// locker returns a Locker over a new backend (a new "process").
func (s *suite) locker(t *testing.T) *lock.Locker {
	t.Helper()
	l, _ := s.lockerClock(t)
	return l
}

// lockerClock is locker that also returns, on the fake clock, the clock
// the Locker sees, to step its timers (nil on real time).
func (s *suite) lockerClock(t *testing.T) (*lock.Locker, *steppedClock) {
	t.Helper()
	b := s.newBackend(t)
	if b == nil {
		t.Fatal("newBackend returned nil")
	}
	return s.lockerOn(b)
}

// lockerOn returns a Locker over b on the suite's clock.
func (s *suite) lockerOn(b lock.Backend) (*lock.Locker, *steppedClock) {
	if s.fake == nil {
		return lock.New(b), nil
	}
	c := &steppedClock{Fake: s.fake, due: make(chan time.Time, 64)}
	return lock.New(b, lock.WithClock(c)), c
}

// lockers returns n Lockers, each over its own backend.
func (s *suite) lockers(t *testing.T, n int) []*lock.Locker {
	t.Helper()
	ls := make([]*lock.Locker, n)
	for i := range ls {
		ls[i] = s.locker(t)
	}
	return ls
}

// newKey returns a key no other subtest or run uses.
func newKey(t *testing.T) string {
	return "locktest/" + strings.ReplaceAll(t.Name(), "/", ".") + "/" + lock.NewToken()[:8]
}

// testCtx returns a context that ends with the test, or after d.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

type acquired struct {
	lease *lock.Lease
	err   error
	at    time.Time // when Acquire returned
}

// acquireAsync runs l.Acquire in a goroutine and delivers its result,
// with when it returned by the store's clock.
func (s *suite) acquireAsync(ctx context.Context, l *lock.Locker, key string, opts lock.Options) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, opts)
		ch <- acquired{lease: lease, err: err, at: s.now()}
	}()
	return ch
}

// receive waits at most d for an Acquire result.
func receive(t *testing.T, ch <-chan acquired, d time.Duration, what string) acquired {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("%s: Acquire did not return within %v", what, d)
		return acquired{}
	}
}

// notReturned fails the test if ch already has a result.
func notReturned(t *testing.T, ch <-chan acquired, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: Acquire returned early: lease=%v err=%v", what, r.lease != nil, r.err)
	default:
	}
}

// mustTry takes key with TryAcquire or fails the test.
func mustTry(t *testing.T, ctx context.Context, l *lock.Locker, key string, opts lock.Options) *lock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(ctx, key, opts)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", key, err)
	}
	return lease
}

// mustNotObtain checks that a TryAcquire of key fails with ErrNotObtained.
func mustNotObtain(t *testing.T, ctx context.Context, l *lock.Locker, key string) {
	t.Helper()
	lease, err := l.TryAcquire(ctx, key, lock.Options{TTL: 5 * time.Second})
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatalf("TryAcquire(%q) succeeded while the lock should be held", key)
	}
	if !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("TryAcquire(%q) = %v, want ErrNotObtained", key, err)
	}
}

// mustRelease releases lease or fails the test.
func mustRelease(t *testing.T, ctx context.Context, lease *lock.Lease) {
	t.Helper()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release(%q, fence %d): %v", lease.Key, lease.Fence, err)
	}
}

// inspector returns l's backend as an Inspector, if it is one.
func inspector(l *lock.Locker) (lock.Inspector, bool) {
	in, ok := l.Backend().(lock.Inspector)
	return in, ok
}

// waitWaiters polls the store until n waiters are queued for key. Without an
// Inspector there is nothing to observe and it returns at once.
func waitWaiters(t *testing.T, ctx context.Context, l *lock.Locker, key string, n int) {
	t.Helper()
	in, ok := inspector(l)
	if !ok {
		return
	}
	deadline := time.Now().Add(waitBound)
	for {
		got, err := in.Waiters(ctx, key)
		if err != nil {
			t.Fatalf("Waiters(%q): %v", key, err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Waiters(%q) = %d after %v, want %d", key, got, waitBound, n)
		}
		time.Sleep(pollEvery) // polling an external observable; nothing to select on
	}
}

// wantWaiters checks the queue length right now, if the backend can tell.
func wantWaiters(t *testing.T, ctx context.Context, l *lock.Locker, key string, n int) {
	t.Helper()
	in, ok := inspector(l)
	if !ok {
		return
	}
	got, err := in.Waiters(ctx, key)
	if err != nil {
		t.Fatalf("Waiters(%q): %v", key, err)
	}
	if got != n {
		t.Fatalf("Waiters(%q) = %d, want %d", key, got, n)
	}
}

func (s *suite) testTryAcquireFree(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l := s.locker(t)
	key := newKey(t)
	const ttl = 5 * time.Second
	before := time.Now()
	lease := mustTry(t, ctx, l, key, lock.Options{TTL: ttl})
	after := time.Now()

	if lease.Key != key {
		t.Errorf("Key = %q, want %q", lease.Key, key)
	}
	if lease.TTL != ttl {
		t.Errorf("TTL = %v, want %v", lease.TTL, ttl)
	}
	if lease.Fence == 0 {
		t.Errorf("Fence = 0, want > 0")
	}
	if len(lease.Token) != 32 {
		t.Errorf("Token %q has %d chars, want 32 hex chars", lease.Token, len(lease.Token))
	} else if _, err := hex.DecodeString(lease.Token); err != nil {
		t.Errorf("Token %q is not hex: %v", lease.Token, err)
	}
	vu := lease.ValidUntil()
	if lo, hi := before.Add(ttl-ttl/10), after.Add(ttl); vu.Before(lo) || vu.After(hi) {
		t.Errorf("ValidUntil is %v after the call, want between %v and %v", vu.Sub(after), lo.Sub(after), ttl)
	}
	if err := lease.Err(); err != nil {
		t.Errorf("Err() = %v while held, want nil", err)
	}
	select {
	case <-lease.Done():
		t.Errorf("Done() closed while held")
	default:
	}
	other := mustTry(t, ctx, s.locker(t), newKey(t), lock.Options{TTL: ttl})
	if other.Token == lease.Token {
		t.Errorf("two acquisitions got the same token %q", lease.Token)
	}
	mustRelease(t, ctx, other)
	mustRelease(t, ctx, lease)
}

func (s *suite) testTryAcquireHeld(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l, other := s.locker(t), s.locker(t)
	key := newKey(t)
	lease := mustTry(t, ctx, l, key, lock.Options{TTL: 5 * time.Second})
	for _, opts := range []lock.Options{{}, {TTL: time.Second}, {Fair: true}} {
		for name, ll := range map[string]*lock.Locker{"same": l, "other": other} {
			got, err := ll.TryAcquire(ctx, key, opts)
			if !errors.Is(err, lock.ErrNotObtained) {
				if got != nil {
					_ = got.Release(ctx)
				}
				t.Fatalf("TryAcquire from %s backend with %+v = %v, want ErrNotObtained", name, opts, err)
			}
			if got != nil {
				t.Fatalf("TryAcquire returned a lease along with error %v", err)
			}
		}
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("holder's Err() = %v after failed TryAcquires, want nil", err)
	}
	mustRelease(t, ctx, lease)
}

func (s *suite) testKeysAreIndependent(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l := s.locker(t)
	a, b := newKey(t), newKey(t)
	la := mustTry(t, ctx, l, a, lock.Options{TTL: 5 * time.Second})
	lb := mustTry(t, ctx, l, b, lock.Options{TTL: 5 * time.Second})
	mustRelease(t, ctx, la)
	mustNotObtain(t, ctx, l, b)
	mustRelease(t, ctx, lb)
}

func (s *suite) testReacquireFence(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l, other := s.locker(t), s.locker(t)
	key := newKey(t)
	first := mustTry(t, ctx, l, key, lock.Options{TTL: 5 * time.Second})
	mustRelease(t, ctx, first)
	second := mustTry(t, ctx, l, key, lock.Options{TTL: 5 * time.Second})
	if second.Fence <= first.Fence {
		t.Fatalf("fence after re-acquire = %d, want > %d", second.Fence, first.Fence)
	}
	if second.Token == first.Token {
		t.Fatalf("re-acquire reused token %q", first.Token)
	}
	mustRelease(t, ctx, second)
	third := mustTry(t, ctx, other, key, lock.Options{TTL: 5 * time.Second})
	if third.Fence <= second.Fence {
		t.Fatalf("fence of another backend's acquisition = %d, want > %d", third.Fence, second.Fence)
	}
	mustRelease(t, ctx, third)
}

func (s *suite) testDoubleRelease(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l := s.locker(t)
	key := newKey(t)
	lease := mustTry(t, ctx, l, key, lock.Options{TTL: 5 * time.Second})
	mustRelease(t, ctx, lease)
	next := mustTry(t, ctx, l, key, lock.Options{TTL: 5 * time.Second})
	if err := lease.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	if err := lease.Err(); err != lock.ErrReleased {
		t.Fatalf("Err() after second Release = %v, want ErrReleased (the first cause wins)", err)
	}
	if _, err := l.Backend().Extend(ctx, key, lease.Token, time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("backend Extend with a released token = %v, want ErrNotHeld", err)
	}
	mustNotObtain(t, ctx, l, key)
	mustRelease(t, ctx, next)
}

// takeOver leaves a short lease of a to expire and lets b take the lock with
// a blocking Acquire; it returns the stale lease and b's result.
func (s *suite) takeOver(t *testing.T, ctx context.Context, a, b *lock.Locker, key string) (stale *lock.Lease, fresh acquired) {
	t.Helper()
	const ttl = 150 * time.Millisecond
	stale = mustTry(t, ctx, a, key, lock.Options{TTL: ttl})
	ch := s.acquireAsync(ctx, b, key, lock.Options{TTL: 10 * time.Second})
	s.letExpire(t, ctx, b, key, ttl)
	fresh = receive(t, ch, waitBound, "taking over")
	if fresh.err != nil {
		t.Fatalf("Acquire after the holder's lease expired: %v", fresh.err)
	}
	if fresh.at.Before(stale.ValidUntil()) {
		t.Fatalf("lock taken over %v before the old lease's ValidUntil", stale.ValidUntil().Sub(fresh.at))
	}
	if fresh.lease.Fence <= stale.Fence {
		t.Fatalf("fence after takeover = %d, want > %d", fresh.lease.Fence, stale.Fence)
	}
	return stale, fresh
}

// wantLost checks that lease ended because the lock was lost.
func wantLost(t *testing.T, lease *lock.Lease) {
	t.Helper()
	select {
	case <-lease.Done():
	default:
		t.Fatalf("Done() not closed after the store said the lease is not held")
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Err() = %v, want an error wrapping ErrLost", err)
	}
}

func (s *suite) testReleaseStale(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	ls := s.lockers(t, 3)
	key := newKey(t)
	stale, fresh := s.takeOver(t, ctx, ls[0], ls[1], key)

	if err := stale.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Release of the stale lease = %v, want ErrNotHeld", err)
	}
	wantLost(t, stale)
	if err := ls[0].Backend().Release(ctx, key, stale.Token); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("backend Release with the stale token = %v, want ErrNotHeld", err)
	}
	// The new holder still holds.
	mustNotObtain(t, ctx, ls[2], key)
	if err := fresh.lease.Err(); err != nil {
		t.Fatalf("new holder's Err() = %v, want nil", err)
	}
	mustRelease(t, ctx, fresh.lease)
	mustRelease(t, ctx, mustTry(t, ctx, ls[2], key, lock.Options{TTL: time.Second}))
}

func (s *suite) testExtendStale(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	ls := s.lockers(t, 3)
	key := newKey(t)
	stale, fresh := s.takeOver(t, ctx, ls[0], ls[1], key)

	// A stale Extend that wrongly applied to the new holder would shorten
	// its lease to MinTTL; the waiter below would then get the lock.
	if err := stale.Extend(ctx, lock.MinTTL); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Extend of the stale lease = %v, want ErrNotHeld", err)
	}
	wantLost(t, stale)
	if _, err := ls[0].Backend().Extend(ctx, key, stale.Token, lock.MinTTL); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("backend Extend with the stale token = %v, want ErrNotHeld", err)
	}
	if s.fake != nil {
		s.fake.Advance(100 * lock.MinTTL)
		mustNotObtain(t, ctx, ls[2], key) // the stale Extend touched the new lease?
	} else {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if got, err := ls[2].Acquire(wctx, key, lock.Options{TTL: time.Second}); !errors.Is(err, context.DeadlineExceeded) {
			if got != nil {
				_ = got.Release(ctx)
			}
			t.Fatalf("Acquire by a third party while the new holder holds = %v, want DeadlineExceeded (the stale Extend touched the new lease?)", err)
		}
	}
	if err := fresh.lease.Extend(ctx, 0); err != nil {
		t.Fatalf("new holder's Extend: %v", err)
	}
	mustNotObtain(t, ctx, ls[2], key)
	mustRelease(t, ctx, fresh.lease)
}

func (s *suite) testExtendHeld(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l, other := s.locker(t), s.locker(t)
	key := newKey(t)
	const ttl = time.Second
	lease := mustTry(t, ctx, l, key, lock.Options{TTL: ttl})
	v1 := lease.ValidUntil()

	check := func(what string, got, before, after time.Time, d time.Duration) {
		t.Helper()
		if lo, hi := before.Add(d-d/10), after.Add(d); got.Before(lo) || got.After(hi) {
			t.Fatalf("%s: validity ends %v after the call, want between %v and %v", what, got.Sub(after), lo.Sub(after), d)
		}
	}
	before := s.now()
	if err := lease.Extend(ctx, 3*time.Second); err != nil {
		t.Fatalf("Extend(3s): %v", err)
	}
	after := s.now()
	v2 := lease.ValidUntil()
	if !v2.After(v1) {
		t.Fatalf("ValidUntil did not move forward: %v -> %v", v1, v2)
	}
	check("Extend(3s)", v2, before, after, 3*time.Second)

	before = s.now()
	until, err := l.Backend().Extend(ctx, key, lease.Token, 2*time.Second)
	after = s.now()
	if err != nil {
		t.Fatalf("backend Extend(2s): %v", err)
	}
	check("backend Extend(2s)", until, before, after, 2*time.Second)

	before = s.now()
	if err := lease.Extend(ctx, 0); err != nil {
		t.Fatalf("Extend(0): %v", err)
	}
	check("Extend(0) (the lease's TTL)", lease.ValidUntil(), before, s.now(), ttl)
	if err := lease.Err(); err != nil {
		t.Fatalf("Err() = %v after Extend, want nil", err)
	}
	mustNotObtain(t, ctx, other, key)
	mustRelease(t, ctx, lease)
}

func (s *suite) testExpiryHandOff(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			a, b := s.locker(t), s.locker(t)
			key := newKey(t)
			const ttl = 150 * time.Millisecond
			before := s.now()
			old := mustTry(t, ctx, a, key, lock.Options{TTL: ttl, Fair: fair})
			ch := s.acquireAsync(ctx, b, key, lock.Options{TTL: 5 * time.Second, WaiterLease: waitLease, Fair: fair})
			s.letExpire(t, ctx, b, key, ttl)
			r := receive(t, ch, waitBound, "waiter")
			if r.err != nil {
				t.Fatalf("waiter: %v", r.err)
			}
			defer mustRelease(t, ctx, r.lease)
			if r.at.Before(old.ValidUntil()) {
				t.Fatalf("waiter got the lock %v before the holder's ValidUntil", old.ValidUntil().Sub(r.at))
			}
			if late := r.at.Sub(before.Add(ttl)); late > s.late {
				t.Fatalf("waiter got the lock %v after the holder's lease expired, want within %v", late, s.late)
			}
			t.Logf("waiter got the lock %v after TTL", r.at.Sub(before.Add(ttl)))
			if r.lease.Fence <= old.Fence {
				t.Fatalf("waiter's fence %d, want > %d", r.lease.Fence, old.Fence)
			}
		})
	}
}

func (s *suite) testFenceSequence(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	ls := s.lockers(t, 2)
	key := newKey(t)
	const n = 50
	var fences []uint64
	var stale *lock.Lease // left to expire; the next acquisition takes over
	takeovers := 0
	for i := range n {
		l := ls[i%2]
		opts := lock.Options{TTL: 5 * time.Second}
		if i%3 == 2 {
			opts.TTL = 30 * time.Millisecond // left to expire
		}
		var lease *lock.Lease
		var err error
		switch {
		case stale != nil:
			actx, cancel := context.WithTimeout(ctx, waitBound)
			ch := s.acquireAsync(actx, l, key, opts)
			s.letExpire(t, ctx, l, key, 30*time.Millisecond)
			r := receive(t, ch, waitBound, fmt.Sprintf("acquisition %d", i))
			cancel()
			lease, err = r.lease, r.err
			if err == nil && r.at.Before(stale.ValidUntil()) {
				t.Fatalf("acquisition %d took over before the stale lease's ValidUntil", i)
			}
			stale = nil
			takeovers++
		case i%2 == 0:
			lease, err = l.TryAcquire(ctx, key, opts)
		default:
			lease, err = l.Acquire(ctx, key, opts)
		}
		if err != nil {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		fences = append(fences, lease.Fence)
		if i%3 == 2 {
			stale = lease
		} else {
			mustRelease(t, ctx, lease)
		}
	}
	if stale != nil {
		_ = stale.Release(ctx)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fence %d = %d is not above fence %d = %d; all: %v", i, fences[i], i-1, fences[i-1], fences)
		}
	}
	if takeovers < n/3-1 {
		t.Fatalf("only %d takeovers after expiry, want at least %d", takeovers, n/3-1)
	}
}

func (s *suite) testWokenByRelease(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			holder, waiter := s.locker(t), s.locker(t)
			key := newKey(t)
			// The TTL is far beyond the bound below: only the release can
			// explain a prompt hand-off.
			lease := mustTry(t, ctx, holder, key, lock.Options{TTL: 30 * time.Second, Fair: fair})

			type released struct {
				start time.Time
				err   error
			}
			release := make(chan struct{})
			done := make(chan released, 1)
			go func() {
				<-release
				start := time.Now()
				done <- released{start, lease.Release(ctx)}
			}()

			ch := s.acquireAsync(ctx, waiter, key, lock.Options{TTL: 5 * time.Second, WaiterLease: waitLease, Fair: fair})
			waitWaiters(t, ctx, waiter, key, 1)
			notReturned(t, ch, "waiter before release")
			close(release)
			var rel released
			select {
			case rel = <-done:
			case <-time.After(waitBound):
				t.Fatalf("Release did not return within %v", waitBound)
			}
			if rel.err != nil {
				t.Fatalf("Release: %v", rel.err)
			}
			r := receive(t, ch, waitBound, "waiter")
			if r.err != nil {
				t.Fatalf("waiter: %v", r.err)
			}
			defer mustRelease(t, ctx, r.lease)
			if r.at.Before(rel.start) {
				t.Fatalf("waiter returned before the release started")
			}
			if d := r.at.Sub(rel.start); d > s.late {
				t.Fatalf("waiter returned %v after the release started, want within %v", d, s.late)
			}
			if r.lease.Fence <= lease.Fence {
				t.Fatalf("waiter's fence %d, want > %d", r.lease.Fence, lease.Fence)
			}
			wantWaiters(t, ctx, waiter, key, 0)
			if st := holder.Stats(); st.Acquired != 1 || st.HandedOff != 0 {
				t.Errorf("holder's Stats %+v, want 1 acquired, none handed off", st)
			}
			// A backend with a queue hands the lock over; one without
			// (Redlock polls) lets the waiter take it.
			handOffs := int64(0)
			if _, queued := inspector(waiter); queued {
				handOffs = 1
			}
			if st := waiter.Stats(); st.Acquired != 1 || st.HandedOff != handOffs {
				t.Errorf("waiter's Stats %+v, want 1 acquired, %d by hand-off", st, handOffs)
			}
		})
	}
}

func (s *suite) testAcquireContextEnds(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			ls := s.lockers(t, 3)
			holder, waiter, third := ls[0], ls[1], ls[2]
			key := newKey(t)
			opts := lock.Options{TTL: 5 * time.Second, Fair: fair}
			lease := mustTry(t, ctx, holder, key, lock.Options{TTL: 30 * time.Second, Fair: fair})

			const wait = 150 * time.Millisecond
			start := time.Now()
			wctx, cancel := context.WithTimeout(ctx, wait)
			got, err := waiter.Acquire(wctx, key, opts)
			elapsed := time.Since(start)
			cancel()
			if err == nil {
				_ = got.Release(ctx)
				t.Fatalf("Acquire succeeded while the lock was held")
			}
			if !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Acquire with an expiring context = %v, want ErrNotObtained and DeadlineExceeded", err)
			}
			if got != nil {
				t.Fatalf("Acquire returned a lease along with error %v", err)
			}
			if elapsed < wait {
				t.Fatalf("Acquire gave up after %v, before its deadline of %v", elapsed, wait)
			}
			wantWaiters(t, ctx, waiter, key, 0)

			cctx, ccancel := context.WithCancel(ctx)
			ccancel()
			if _, err := waiter.Acquire(cctx, key, opts); !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Acquire with a cancelled context = %v, want ErrNotObtained and Canceled", err)
			}
			wantWaiters(t, ctx, waiter, key, 0)

			mustNotObtain(t, ctx, third, key)
			mustRelease(t, ctx, lease)
			// Nothing left in the store: a TryAcquire (which never jumps a
			// queue) gets the lock at once.
			next := mustTry(t, ctx, third, key, opts)
			if next.Fence <= lease.Fence {
				t.Fatalf("fence %d, want > %d", next.Fence, lease.Fence)
			}
			mustRelease(t, ctx, next)
			wantWaiters(t, ctx, third, key, 0)
		})
	}
}

func (s *suite) testCancelledWaiterDoesNotStrand(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			ls := s.lockers(t, 3)
			holder, w, other := ls[0], ls[1], ls[2]
			key := newKey(t)
			opts := lock.Options{TTL: 5 * time.Second, WaiterLease: waitLease, Fair: fair}
			lease := mustTry(t, ctx, holder, key, lock.Options{TTL: 30 * time.Second, Fair: fair})

			shortCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			first := s.acquireAsync(shortCtx, w, key, opts)
			waitWaiters(t, ctx, w, key, 1)
			sameProcess := s.acquireAsync(ctx, w, key, opts)
			otherProcess := s.acquireAsync(ctx, other, key, opts)

			r := receive(t, first, waitBound, "waiter with a deadline")
			if !errors.Is(r.err, context.DeadlineExceeded) {
				t.Fatalf("first waiter = %v, want DeadlineExceeded", r.err)
			}
			notReturned(t, sameProcess, "second waiter (same backend)")
			notReturned(t, otherProcess, "third waiter (other backend)")

			relStart := time.Now()
			mustRelease(t, ctx, lease)
			pending := map[string]<-chan acquired{"same backend": sameProcess, "other backend": otherProcess}
			for len(pending) > 0 {
				var got acquired
				var who string
				select {
				case got = <-sameProcess:
					who = "same backend"
				case got = <-otherProcess:
					who = "other backend"
				case <-time.After(waitBound):
					t.Fatalf("remaining waiters %v not served within %v", slices.Sorted(maps.Keys(pending)), waitBound)
				}
				if got.err != nil {
					t.Fatalf("waiter (%s): %v", who, got.err)
				}
				if d := got.at.Sub(relStart); d > s.late {
					t.Fatalf("waiter (%s) served %v after the release, want within %v", who, d, s.late)
				}
				delete(pending, who)
				relStart = time.Now()
				mustRelease(t, ctx, got.lease)
			}
		})
	}
}

func (s *suite) testCancelRacingHandOff(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			ls := s.lockers(t, 3)
			holder, waiter, other := ls[0], ls[1], ls[2]
			key := newKey(t)
			opts := lock.Options{TTL: 5 * time.Second, Fair: fair}
			const rounds = 20
			const deadline = 20 * time.Millisecond
			obtained := 0
			for i := range rounds {
				lease := mustTry(t, ctx, holder, key, opts)
				wctx, cancel := context.WithTimeout(ctx, deadline)
				ch := s.acquireAsync(wctx, waiter, key, opts)
				// Release around the moment the waiter gives up, to race the
				// hand-off against the cancellation (a timer makes the race,
				// it does not stand in for synchronisation).
				<-time.After(deadline + time.Duration(i%7-3)*3*time.Millisecond)
				mustRelease(t, ctx, lease)
				r := receive(t, ch, waitBound, fmt.Sprintf("round %d", i))
				cancel()
				if r.err == nil {
					obtained++
					mustRelease(t, ctx, r.lease)
				} else if !errors.Is(r.err, lock.ErrNotObtained) {
					t.Fatalf("round %d: waiter = %v, want success or ErrNotObtained", i, r.err)
				}
				// Whatever the outcome, nothing is left behind: the lock is
				// free and nobody is queued.
				wantWaiters(t, ctx, other, key, 0)
				next, err := other.TryAcquire(ctx, key, opts)
				if err != nil {
					t.Fatalf("round %d (waiter err=%v): TryAcquire after the race: %v", i, r.err, err)
				}
				mustRelease(t, ctx, next)
			}
			t.Logf("waiter obtained the lock in %d of %d races", obtained, rounds)
		})
	}
}

// fifo queues n waiters one after another, each on its own backend, and
// checks they are served in arrival order.
func (s *suite) fifo(t *testing.T, fair bool, n int) {
	ctx := testCtx(t, 60*time.Second)
	holder := s.locker(t)
	if _, ok := inspector(holder); !ok {
		t.Skip("backend is not a lock.Inspector: cannot tell when a waiter is queued")
	}
	key := newKey(t)
	lease := mustTry(t, ctx, holder, key, lock.Options{TTL: 30 * time.Second, Fair: fair})
	waiters := s.lockers(t, n)
	order := make(chan int, n)
	results := make(chan error, n)
	for i, w := range waiters {
		go func() {
			l, err := w.Acquire(ctx, key, lock.Options{TTL: 10 * time.Second, Fair: fair})
			if err != nil {
				results <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			order <- i // while holding the lock: channel order is acquisition order
			results <- l.Release(ctx)
		}()
		waitWaiters(t, ctx, holder, key, i+1)
	}
	mustRelease(t, ctx, lease)
	for range n {
		select {
		case err := <-results:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(waitBound):
			t.Fatalf("waiters not all served within %v", waitBound)
		}
	}
	close(order)
	var got []int
	for i := range order {
		got = append(got, i)
	}
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	if !slices.Equal(got, want) {
		t.Fatalf("served in order %v, want arrival order %v", got, want)
	}
	wantWaiters(t, ctx, holder, key, 0)
}

func (s *suite) testFIFOFair(t *testing.T) { s.fifo(t, true, 8) }

// testFIFOAcrossProcesses checks the non-fair promise: processes (here one
// waiter per backend) are still served in arrival order.
func (s *suite) testFIFOAcrossProcesses(t *testing.T) { s.fifo(t, false, 4) }

func (s *suite) testHandOffTopUp(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			holder, other := s.locker(t), s.locker(t)
			waiter, wclk := s.lockerClock(t)
			key := newKey(t)
			// The top-up comes halfway through the hand-off's grant: 300ms,
			// more than a busy machine stalls.
			const waiterLease = 600 * time.Millisecond
			opts := lock.Options{TTL: 10 * time.Second, WaiterLease: waiterLease, Fair: fair}
			lease := mustTry(t, ctx, holder, key, opts)
			ch := s.acquireAsync(ctx, waiter, key, opts)
			waitWaiters(t, ctx, waiter, key, 1)
			mustRelease(t, ctx, lease)
			r := receive(t, ch, waitBound, "waiter")
			if r.err != nil {
				t.Fatalf("waiter: %v", r.err)
			}
			// A hand-off may be granted for WaiterLease only; the Locker
			// tops it up to the TTL by itself, without a watchdog.
			if s.fake != nil && r.lease.ValidUntil().Before(s.now().Add(10*waiterLease)) {
				// Granted short: the top-up is due halfway through.
				wclk.next(t, r.lease.Done())
			}
			deadline := time.Now().Add(waitBound)
			for r.lease.ValidUntil().Before(s.now().Add(10 * waiterLease)) {
				if time.Now().After(deadline) {
					t.Fatalf("hand-off lease still valid for only %v after %v", r.lease.ValidUntil().Sub(s.now()), waitBound)
				}
				time.Sleep(pollEvery) // polling an observable; the top-up has no completion signal
			}
			// The store agrees: well past WaiterLease the lock is still held.
			if s.fake != nil {
				s.fake.Advance(3 * waiterLease)
				mustNotObtain(t, ctx, other, key)
			} else {
				wctx, cancel := context.WithTimeout(ctx, 3*waiterLease)
				defer cancel()
				if got, err := other.Acquire(wctx, key, opts); !errors.Is(err, context.DeadlineExceeded) {
					if got != nil {
						_ = got.Release(ctx)
					}
					t.Fatalf("Acquire by another %v after the hand-off = %v, want DeadlineExceeded", 3*waiterLease, err)
				}
			}
			if err := r.lease.Err(); err != nil {
				t.Fatalf("hand-off lease Err() = %v, want nil", err)
			}
			mustRelease(t, ctx, r.lease)
		})
	}
}

// testMixedWaiterLeases: waiters of one key may use different WaiterLeases.
// A waiter with a short lease that comes and goes must not cost a waiter
// with a long lease its place: the long one is still first in line, is
// handed the lock at the release, and no TryAcquire can jump ahead of it.
func (s *suite) testMixedWaiterLeases(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			ls := s.lockers(t, 4)
			holder, long, short, other := ls[0], ls[1], ls[2], ls[3]
			key := newKey(t)
			lease := mustTry(t, ctx, holder, key, lock.Options{TTL: 30 * time.Second, Fair: fair})

			// Long enough to renew reliably (see ShortWaiterLeaseKeepsPlace
			// for shorter ones); it must still not shorten the long lease.
			const shortLease = 300 * time.Millisecond
			longCh := s.acquireAsync(ctx, long, key, lock.Options{TTL: 5 * time.Second, WaiterLease: waitLease, Fair: fair})
			waitWaiters(t, ctx, holder, key, 1)
			sctx, cancel := context.WithTimeout(ctx, shortLease+50*time.Millisecond)
			defer cancel()
			shortCh := s.acquireAsync(sctx, short, key, lock.Options{TTL: 5 * time.Second, WaiterLease: shortLease, Fair: fair})
			if r := receive(t, shortCh, waitBound, "short-lease waiter"); !errors.Is(r.err, context.DeadlineExceeded) {
				t.Fatalf("short-lease waiter = %v, want DeadlineExceeded", r.err)
			}
			// Give anything tied to the short waiter's lease time to expire;
			// the long waiter must stay queued throughout.
			if in, ok := inspector(holder); ok && s.fake != nil {
				s.fake.Advance(3 * shortLease)
				if n, err := in.Waiters(ctx, key); err != nil || n != 1 {
					t.Errorf("Waiters = %d, %v %v after the short-lease waiter left, want 1: the long-lease waiter lost its place in the queue", n, err, 3*shortLease)
				}
			} else if ok {
				left := time.Now()
				for time.Since(left) < 3*shortLease {
					n, err := in.Waiters(ctx, key)
					if err != nil {
						t.Fatalf("Waiters: %v", err)
					}
					if n != 1 {
						t.Errorf("Waiters = %d %v after the short-lease waiter left, want 1: the long-lease waiter lost its place in the queue", n, time.Since(left).Round(time.Millisecond))
						break
					}
					time.Sleep(pollEvery) // watching an external observable over a window
				}
			}
			notReturned(t, longCh, "long-lease waiter")
			relStart := s.now()
			mustRelease(t, ctx, lease)
			// The lock went to the long waiter: it is not free for a TryAcquire.
			if jumped, err := other.TryAcquire(ctx, key, lock.Options{TTL: time.Second}); err == nil {
				t.Errorf("a TryAcquire right after the release got the lock ahead of the queued long-lease waiter")
				mustRelease(t, ctx, jumped)
			} else if !errors.Is(err, lock.ErrNotObtained) {
				t.Fatalf("TryAcquire: %v", err)
			}
			r := receive(t, longCh, waitBound, "long-lease waiter")
			if r.err != nil {
				t.Fatalf("long-lease waiter: %v", r.err)
			}
			defer mustRelease(t, ctx, r.lease)
			if d := r.at.Sub(relStart); d > s.late {
				t.Fatalf("long-lease waiter served %v after the release, want within %v", d, s.late)
			}
		})
	}
}

// testShortWaiterLease: a live waiter keeps its place however short its
// WaiterLease: after waiting several of their leases all waiters are still
// queued, and they are served in arrival order. The lease is short but
// still long against the scheduling stalls of a busy machine (renewals
// every 133ms, 267ms before the place would lapse): a waiter whose renewal
// is starved for longer is not live, and rightly loses its place.
func (s *suite) testShortWaiterLease(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			holder := s.locker(t)
			in, ok := inspector(holder)
			if !ok {
				t.Skip("backend is not a lock.Inspector: cannot tell when a waiter is queued")
			}
			key := newKey(t)
			lease := mustTry(t, ctx, holder, key, lock.Options{TTL: 30 * time.Second, Fair: fair})
			const n, waiterLease, window = 4, 400 * time.Millisecond, 1600 * time.Millisecond
			opts := lock.Options{TTL: 5 * time.Second, WaiterLease: waiterLease, Fair: fair}
			order := make(chan int, n)
			results := make(chan error, n)
			for i, w := range s.lockers(t, n) {
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
			}
			// Let the waiters wait for several of their leases. The store is
			// left alone meanwhile: polling it would keep a server busy and
			// hide timers that only fire on its idle ticks. (This wait is the
			// time under test, not a stand-in for synchronisation.)
			s.pass(window)
			if got, err := in.Waiters(ctx, key); err != nil {
				t.Fatalf("Waiters: %v", err)
			} else if got != n {
				t.Errorf("Waiters = %d after %v of waiting, want %d: a live waiter (WaiterLease %v) lost its place", got, window, n, waiterLease)
			}
			mustRelease(t, ctx, lease)
			for range n {
				select {
				case err := <-results:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(waitBound):
					t.Fatalf("waiters not all served within %v", waitBound)
				}
			}
			close(order)
			got := slices.Collect(chanValues(order))
			if want := []int{0, 1, 2, 3}; !slices.Equal(got, want) {
				t.Errorf("served in order %v, want arrival order %v", got, want)
			}
		})
	}
}

func chanValues[T any](ch <-chan T) func(func(T) bool) {
	return func(yield func(T) bool) {
		for v := range ch {
			if !yield(v) {
				return
			}
		}
	}
}

func (s *suite) testMutualExclusion(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			const goroutines, rounds, backends = 16, 50, 4
			ls := s.lockers(t, backends)
			key := newKey(t)
			opts := lock.Options{TTL: 10 * time.Second, Fair: fair}

			var (
				counter   int    // guarded by the lock under test only
				lastFence uint64 // guarded by the lock under test only
				badFences int    // guarded by the lock under test only
				inside    atomic.Int32
				overlaps  atomic.Int32
			)
			critical := func(lease *lock.Lease) {
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				if lease.Fence <= lastFence {
					badFences++
				}
				lastFence = lease.Fence
				c := counter
				runtime.Gosched()
				counter = c + 1
				inside.Add(-1)
			}
			errs := make(chan error, goroutines)
			var wg sync.WaitGroup
			for g := range goroutines {
				l := ls[g%backends]
				wg.Go(func() {
					for i := range rounds {
						if g%2 == 0 {
							err := l.Do(ctx, key, opts, func(_ context.Context, lease *lock.Lease) error {
								critical(lease)
								return nil
							})
							if err != nil {
								errs <- fmt.Errorf("goroutine %d round %d: Do: %w", g, i, err)
								return
							}
							continue
						}
						lease, err := l.Acquire(ctx, key, opts)
						if err != nil {
							errs <- fmt.Errorf("goroutine %d round %d: Acquire: %w", g, i, err)
							return
						}
						critical(lease)
						if err := lease.Release(ctx); err != nil {
							errs <- fmt.Errorf("goroutine %d round %d: Release: %w", g, i, err)
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
			if n := overlaps.Load(); n != 0 {
				t.Errorf("%d overlapping critical sections", n)
			}
			if badFences != 0 {
				t.Errorf("%d critical sections saw a fence not above the previous one", badFences)
			}
			if counter != goroutines*rounds {
				t.Errorf("counter = %d, want %d", counter, goroutines*rounds)
			}
		})
	}
}

func (s *suite) testDo(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l, other := s.locker(t), s.locker(t)
	key := newKey(t)
	opts := lock.Options{TTL: 5 * time.Second}

	type ctxKey struct{}
	parent := context.WithValue(ctx, ctxKey{}, "parent")
	var held *lock.Lease
	err := l.Do(parent, key, opts, func(fctx context.Context, lease *lock.Lease) error {
		held = lease
		if fctx == nil || fctx.Value(ctxKey{}) != "parent" {
			t.Errorf("fn's context does not derive from Do's")
		}
		if err := fctx.Err(); err != nil {
			t.Errorf("fn's context already done: %v", err)
		}
		if lease == nil || lease.Key != key || lease.Fence == 0 {
			t.Fatalf("fn got lease %+v", lease)
		}
		mustNotObtain(t, ctx, other, key)
		return nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if held == nil {
		t.Fatal("fn was not called")
	}
	if err := held.Err(); err != lock.ErrReleased {
		t.Fatalf("lease Err() after Do = %v, want ErrReleased", err)
	}
	mustRelease(t, ctx, mustTry(t, ctx, other, key, opts))

	// fn's error comes back, and the lock is released all the same.
	errFn := errors.New("fn failed")
	err = l.Do(ctx, key, opts, func(context.Context, *lock.Lease) error { return errFn })
	if !errors.Is(err, errFn) || errors.Is(err, lock.ErrLost) {
		t.Fatalf("Do with failing fn = %v, want fn's error and not ErrLost", err)
	}
	mustRelease(t, ctx, mustTry(t, ctx, other, key, opts))

	// Do waits for the lock, and gives up with the context without calling fn.
	lease := mustTry(t, ctx, other, key, opts)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	called := false
	err = l.Do(wctx, key, opts, func(context.Context, *lock.Lease) error { called = true; return nil })
	if called || !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do while held with a short deadline: called=%v err=%v, want not called, ErrNotObtained and DeadlineExceeded", called, err)
	}
	doErr := make(chan error, 1)
	entered := make(chan uint64, 1)
	go func() {
		doErr <- l.Do(ctx, key, opts, func(_ context.Context, lease *lock.Lease) error {
			entered <- lease.Fence
			return nil
		})
	}()
	waitWaiters(t, ctx, l, key, 1)
	select {
	case <-entered:
		t.Fatal("Do ran fn while another held the lock")
	default:
	}
	mustRelease(t, ctx, lease)
	select {
	case err := <-doErr:
		if err != nil {
			t.Fatalf("Do after release: %v", err)
		}
	case <-time.After(waitBound):
		t.Fatalf("Do did not get the lock within %v of its release", waitBound)
	}
	if f := <-entered; f <= lease.Fence {
		t.Fatalf("Do's fence %d, want > %d", f, lease.Fence)
	}
}

func (s *suite) testWatchdog(t *testing.T) {
	if s.fake != nil {
		s.watchdogStepped(t)
		return
	}
	ctx := testCtx(t, 30*time.Second)
	l, other := s.locker(t), s.locker(t)
	key := newKey(t)
	// The TTL is long against the scheduling stalls of a busy machine
	// (renewals come every 400ms, 800ms before the lease would run out);
	// the hold spans three TTLs, so only renewals explain a lock still held.
	const ttl, hold, probe = 1200 * time.Millisecond, 3600 * time.Millisecond, 100 * time.Millisecond
	err := l.Do(ctx, key, lock.Options{TTL: ttl}, func(fctx context.Context, lease *lock.Lease) error {
		first := lease.ValidUntil()
		timer := time.NewTimer(hold)
		defer timer.Stop()
		ticker := time.NewTicker(probe)
		defer ticker.Stop()
		probes := 0
		for {
			select {
			case <-fctx.Done():
				t.Fatalf("fn's context cancelled after %d probes: %v", probes, context.Cause(fctx))
			case <-ticker.C:
				mustNotObtain(t, ctx, other, key)
				probes++
			case <-timer.C:
				if probes < int(hold/probe)/4 {
					t.Fatalf("only %d probes in %v", probes, hold)
				}
				if got := lease.ValidUntil(); !got.After(first.Add(hold - 2*ttl)) {
					t.Fatalf("ValidUntil moved only %v in %v of renewals", got.Sub(first), hold)
				}
				if err := lease.Err(); err != nil {
					t.Fatalf("lease Err() = %v while held", err)
				}
				return nil
			}
		}
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	mustRelease(t, ctx, mustTry(t, ctx, other, key, lock.Options{TTL: time.Second}))
}

// watchdogStepped is testWatchdog on the fake clock: the clock is stepped
// to each renewal the watchdog waits for, nine of them (three TTLs), and
// each renewal must come exactly on its schedule (every TTL/3 from the
// acquisition) and extend the lease to exactly a TTL from then.
func (s *suite) watchdogStepped(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l, clk := s.lockerClock(t)
	other := s.locker(t)
	key := newKey(t)
	const ttl, renewals = 1200 * time.Millisecond, 9
	err := l.Do(ctx, key, lock.Options{TTL: ttl}, func(fctx context.Context, lease *lock.Lease) error {
		start := lease.ValidUntil().Add(-ttl)
		at, ok := clk.wait(t, fctx.Done())
		for i := 1; i <= renewals; i++ {
			if !ok {
				t.Fatalf("fn's context cancelled before renewal %d: %v", i, context.Cause(fctx))
			}
			if want := start.Add(time.Duration(i) * ttl / 3); !at.Equal(want) {
				t.Fatalf("renewal %d due %v after the acquisition, want %v", i, at.Sub(start), want.Sub(start))
			}
			clk.Advance(at.Sub(clk.Now()))
			// The renewal is done once the watchdog waits for the next.
			at, ok = clk.wait(t, fctx.Done())
			if got, want := lease.ValidUntil(), start.Add(time.Duration(i)*ttl/3+ttl); !got.Equal(want) {
				t.Fatalf("after renewal %d the lease is valid %v after the acquisition, want %v", i, got.Sub(start), want.Sub(start))
			}
			mustNotObtain(t, ctx, other, key)
		}
		if err := lease.Err(); err != nil {
			t.Fatalf("lease Err() = %v while held", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	mustRelease(t, ctx, mustTry(t, ctx, other, key, lock.Options{TTL: time.Second}))
}

// extendFailer wraps a Backend: its Extend works okCalls times, then fails
// with err.
type extendFailer struct {
	lock.Backend
	okCalls int
	err     error

	mu    sync.Mutex // protects calls
	calls int
}

func (f *extendFailer) Extend(ctx context.Context, key, token string, ttl time.Duration) (time.Time, error) {
	f.mu.Lock()
	f.calls++
	fail := f.calls > f.okCalls
	f.mu.Unlock()
	if fail {
		return time.Time{}, f.err
	}
	return f.Backend.Extend(ctx, key, token, ttl)
}

func (f *extendFailer) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// lostDo runs Do over a backend whose Extend fails after okCalls calls and
// waits for fn's context to be cancelled. It returns fn's lease, when the
// cancellation was seen and Do's error.
func (s *suite) lostDo(t *testing.T, ctx context.Context, f *extendFailer, key string, ttl time.Duration) (*lock.Lease, time.Time, error) {
	t.Helper()
	l, clk := s.lockerOn(f)
	var held *lock.Lease
	var cancelledAt time.Time
	err := l.Do(ctx, key, lock.Options{TTL: ttl}, func(fctx context.Context, lease *lock.Lease) error {
		held = lease
		if clk != nil {
			// Step to each renewal and retry the watchdog waits for,
			// until it gives up.
			for clk.next(t, fctx.Done()) {
			}
			cancelledAt = s.now()
		} else {
			select {
			case <-fctx.Done():
				cancelledAt = s.now()
			case <-time.After(waitBound):
				t.Fatalf("fn's context not cancelled within %v of failing renewals", waitBound)
			}
		}
		if cause := context.Cause(fctx); !errors.Is(cause, lock.ErrLost) {
			t.Errorf("fn's context cause = %v, want ErrLost", cause)
		}
		if err := lease.Err(); !errors.Is(err, lock.ErrLost) {
			t.Errorf("lease Err() = %v, want ErrLost", err)
		}
		return nil
	})
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Do = %v, want an error wrapping ErrLost", err)
	}
	return held, cancelledAt, err
}

func (s *suite) testLostNotHeld(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	key := newKey(t)
	const okCalls = 2
	f := &extendFailer{Backend: s.newBackend(t), okCalls: okCalls, err: lock.ErrNotHeld}
	// Long enough that the two good renewals (every 200ms) come before the
	// lease runs out even on a busy machine.
	_, _, err := s.lostDo(t, ctx, f, key, 600*time.Millisecond)
	if n := f.Calls(); n < okCalls+1 {
		t.Fatalf("Extend called %d times, want at least %d", n, okCalls+1)
	}
	t.Logf("Do = %v", err)
	// Do still released the real lock.
	mustRelease(t, ctx, mustTry(t, ctx, s.locker(t), key, lock.Options{TTL: time.Second}))
}

func (s *suite) testLostUnconfirmed(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	key := newKey(t)
	f := &extendFailer{Backend: s.newBackend(t), err: errors.New("injected: store unreachable")}
	// Long enough that the first renewal (at 333ms) and its retries come
	// before the lease runs out even on a busy machine; the retries'
	// backoff does not land on the end of the validity by itself.
	held, cancelledAt, err := s.lostDo(t, ctx, f, key, time.Second)
	t.Logf("Do = %v", err)
	// The renewals never got through, so the lease was valid until its
	// first ValidUntil: the holder must hear of the loss by then, not
	// long after (someone else may take the lock from that moment).
	vu := held.ValidUntil()
	if cancelledAt.Before(vu) {
		t.Fatalf("context cancelled %v before the lease's validity ran out", vu.Sub(cancelledAt))
	}
	if late := cancelledAt.Sub(vu); late > s.late {
		t.Fatalf("context cancelled %v after the lease's validity ran out, want within %v", late, s.late)
	}
	if n := f.Calls(); n < 2 {
		t.Fatalf("Extend called %d times: transient failures should be retried", n)
	}
}

func (s *suite) testDoneAfterRelease(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l := s.locker(t)
	key := newKey(t)
	lease := mustTry(t, ctx, l, key, lock.Options{TTL: 5 * time.Second})
	lctx, cancel := lease.Context(ctx)
	defer cancel()
	mustRelease(t, ctx, lease)
	select {
	case <-lease.Done():
	default:
		t.Fatal("Done() not closed after Release")
	}
	if err := lease.Err(); err != lock.ErrReleased {
		t.Fatalf("Err() after Release = %v, want ErrReleased", err)
	}
	select {
	case <-lctx.Done():
	case <-time.After(waitBound):
		t.Fatal("lease context not cancelled after Release")
	}
	if cause := context.Cause(lctx); cause != lock.ErrReleased {
		t.Fatalf("lease context cause = %v, want ErrReleased", cause)
	}
	if err := lease.Extend(ctx, 0); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Extend after Release = %v, want ErrNotHeld", err)
	}
	if err := lease.Err(); err != lock.ErrReleased {
		t.Fatalf("Err() after Extend of a released lease = %v, want ErrReleased still", err)
	}
	lease.Keepalive() // a no-op on an ended lease
	// A context taken after the end is cancelled at once.
	late, lateCancel := lease.Context(ctx)
	defer lateCancel()
	select {
	case <-late.Done():
	case <-time.After(waitBound):
		t.Fatal("context taken after Release was not cancelled")
	}
}

func (s *suite) testReleaseCancelledCtx(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l, other := s.locker(t), s.locker(t)
	key := newKey(t)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	dctx, dcancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer dcancel()
	for name, c := range map[string]context.Context{"cancelled": cctx, "past deadline": dctx} {
		lease := mustTry(t, ctx, l, key, lock.Options{TTL: 30 * time.Second})
		if err := lease.Release(c); err != nil {
			t.Fatalf("Release with a %s context: %v", name, err)
		}
		if err := lease.Err(); err != lock.ErrReleased {
			t.Fatalf("Err() = %v, want ErrReleased", err)
		}
		mustRelease(t, ctx, mustTry(t, ctx, other, key, lock.Options{TTL: time.Second}))
	}
}

func (s *suite) testInvalidOptions(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	l := s.locker(t)
	key := newKey(t)
	cases := []struct {
		name string
		key  string
		opts lock.Options
	}{
		{"TTL 1ms", key, lock.Options{TTL: time.Millisecond}},
		{"negative TTL", key, lock.Options{TTL: -time.Second}},
		{"WaiterLease 1ms", key, lock.Options{WaiterLease: time.Millisecond}},
		{"empty key", "", lock.Options{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if lease, err := l.TryAcquire(ctx, tc.key, tc.opts); !errors.Is(err, lock.ErrInvalidOptions) || lease != nil {
				t.Errorf("TryAcquire = %v, %v; want nil, ErrInvalidOptions", lease, err)
			}
			if lease, err := l.Acquire(ctx, tc.key, tc.opts); !errors.Is(err, lock.ErrInvalidOptions) || lease != nil {
				t.Errorf("Acquire = %v, %v; want nil, ErrInvalidOptions", lease, err)
			}
			called := false
			if err := l.Do(ctx, tc.key, tc.opts, func(context.Context, *lock.Lease) error { called = true; return nil }); !errors.Is(err, lock.ErrInvalidOptions) || called {
				t.Errorf("Do = %v (fn called: %v); want ErrInvalidOptions, fn not called", err, called)
			}
		})
	}
	// Nothing was taken by the invalid attempts; MinTTL itself is valid.
	lease := mustTry(t, ctx, l, key, lock.Options{TTL: 5 * time.Second})
	if err := lease.Extend(ctx, time.Millisecond); !errors.Is(err, lock.ErrInvalidOptions) {
		t.Fatalf("Extend(1ms) = %v, want ErrInvalidOptions", err)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("Err() = %v after a rejected Extend, want nil", err)
	}
	mustRelease(t, ctx, lease)
	if _, err := l.TryAcquire(ctx, key, lock.Options{TTL: lock.MinTTL}); err != nil {
		t.Fatalf("TryAcquire with TTL = MinTTL: %v", err)
	}
}

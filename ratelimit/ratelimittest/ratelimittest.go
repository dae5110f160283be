// Package ratelimittest is the conformance suite every ratelimit.Backend must pass.
//
// A backend's own tests call Run with a constructor; the suite drives the
// backend through the public ratelimit.Limiter API with real time and real
// goroutines, so it checks the whole limiter (validation, the Wait loop,
// the outage policy and the backend) and not a model of it. A backend that
// takes a clock also runs RunFakeClock: the tests where only the store's
// time matters, on a fake clock, with exact bounds.
//
// Every Limiter the suite builds sits on a thin wrapper around the backend
// that reports when an Enqueue left a request waiting: that is how the
// suite knows a waiter is in its lane before it queues the next one, on any
// backend, without polling. A backend (or a test wrapper around it) that
// also implements Inspector lets the suite check lane lengths directly.
package ratelimittest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/ratelimit"
)

// Timing bounds. A waiter that is never woken finds out by itself only
// when it renews its place, every waiterLease/3 = 10s; the bound on how
// late a woken waiter may be (suite.late) is measured at the start of Run
// from the store's round trip, with a floor that the scheduling stalls of a
// busy 2-core machine under -race do not reach, and stays far below that
// renewal, so a waiter that is not woken still fails the test.
const (
	// waitBound bounds every wait for something that should happen "now".
	waitBound = 10 * time.Second
	// lateFloor is the least suite.late can be.
	lateFloor = 2 * time.Second
	// lateRTTs is suite.late in median store round trips, when more.
	lateRTTs = 50
	// tol is the tolerance on RetryAfter and Reset against the values
	// computed from the test's own clock (the store may keep time in ms).
	tol = 3 * time.Millisecond
	// waiterLease is the Limiter's waiter lease: waiters renew every 10s,
	// so any wake-up well under that was not a renewal.
	waiterLease = 30 * time.Second
)

// Inspector is implemented by backends, or test wrappers around them, that
// can count the requests waiting in a lane. The suite uses it, when
// present, to check that waiters leave nothing queued behind them.
type Inspector interface {
	Waiters(ctx context.Context, lane string) (int, error)
}

// Run runs the conformance suite as subtests of t.
//
// newBackend is called at least once per subtest, with that subtest's t, and
// often several times to stand for several replicas. Every backend it
// returns during one Run must share one store, so that they see each
// other's limits; a networked backend should return a new client each time.
// Each subtest uses its own scopes, so the store need not be empty.
func Run(t *testing.T, newBackend func(t *testing.T) ratelimit.Backend) {
	s := &suite{newBackend: newBackend}
	s.late = s.lateBound(t)
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"BurstThenRefill", s.testBurstThenRefill},
		{"BurstDefaultsToWindow", s.testBurstDefault},
		{"TokensMixedCosts", s.testTokensMixedCosts},
		{"CostAboveBurstImpossible", s.testImpossible},
		{"AtomicAcrossScopes", s.testAtomicity},
		{"SameScopeTwoLimitsOfOneKind", s.testSameScopeSameKind},
		{"ScopesAreBytes", s.testScopesAreBytes},
		{"SubMillisecondWindow", s.testSubMillisecondWindow},
		{"LargeLimits", s.testLargeLimits},
		{"SettleChargesAndRefunds", s.testSettle},
		{"SettleIdempotent", s.testSettleIdempotent},
		{"Refund", s.testRefund},
		{"UnknownReservation", s.testUnknownReservation},
		{"ReservationExpiresAndExtends", s.testReservationHold},
		{"ExpirySettlesAtRecordedUsage", s.testExpirySettlesAtUsage},
		{"ConcurrencyPermits", s.testConcurrency},
		{"ConcurrencyPermitExpiresAfterHold", s.testPermitExpiry},
		{"ConcurrencyExtendKeepsPermit", s.testPermitExtend},
		{"WaitWokenBySettle", s.testWaitWokenBySettle},
		{"WaitWokenByRefill", s.testWaitWokenByRefill},
		{"WaitDefersAdmissionToItsTokens", s.testWaitDefers},
		{"WaitWokenByPermitExpiry", s.testWaitWokenByPermitExpiry},
		{"WaitWokenByExpiryRefund", s.testWaitWokenByExpiryRefund},
		{"SettleWakesEveryBlockedLane", s.testSettleWakesEveryLane},
		{"WaitArrivalOrder", s.testWaitArrivalOrder},
		{"WaitPriorityClasses", s.testWaitPriority},
		{"WaitOwnScopeDoesNotBlockOthers", s.testOwnScopeDoesNotBlock},
		{"WaitSharedScopeKeepsOrder", s.testSharedScopeKeepsOrder},
		{"WaitDeadline", s.testWaitDeadline},
		{"WaitDeadlineRacingAdmission", s.testWaitDeadlineRace},
		{"AllowDoesNotJumpQueue", s.testAllowNoJump},
		{"Cooldown", s.testCooldown},
		{"CooldownWakesWaiter", s.testCooldownWakesWaiter},
		{"Observe", s.testObserve},
		{"Learn", s.testLearn},
		{"LearnExpires", s.testLearnExpires},
		{"LearnWaiterAtLearnedRate", s.testLearnWaiter},
		{"StoreOutage", s.testStoreOutage},
		{"Invalid", s.testInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct {
	newBackend func(t *testing.T) ratelimit.Backend
	// fake, when set, is the clock the backends run on: the tests that use
	// s.now, s.sleep and friends step it instead of waiting.
	fake *clock.Fake
	// late is how late a waiter may be admitted, or give up, after the
	// event that should make it do so (a Settle, a refill, its deadline).
	late time.Duration
}

// RunFakeClock runs, as subtests of t, the tests of the suite in which
// time passes only for the store (nothing waits in a queue): refills,
// holds, cooldowns and learned limits. Every backend newBackend returns must
// read the time from clk; the tests step clk instead of sleeping, so each
// bound is exact however slow the machine. Wait runs on the real clock, so
// the waiting tests are left to Run.
func RunFakeClock(t *testing.T, clk *clock.Fake, newBackend func(t *testing.T) ratelimit.Backend) {
	s := &suite{newBackend: newBackend, fake: clk, late: lateFloor}
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"BurstThenRefill", s.testBurstThenRefill},
		{"BurstDefaultsToWindow", s.testBurstDefault},
		{"ReservationExpiresAndExtends", s.testReservationHold},
		{"ExpirySettlesAtRecordedUsage", s.testExpirySettlesAtUsage},
		{"ConcurrencyPermitExpiresAfterHold", s.testPermitExpiry},
		{"ConcurrencyExtendKeepsPermit", s.testPermitExtend},
		{"Cooldown", s.testCooldown},
		{"LearnExpires", s.testLearnExpires},
	} {
		t.Run(tc.name, tc.fn)
	}
}

// now is the time of the store's clock: the fake one, or the real one.
func (s *suite) now() time.Time {
	if s.fake != nil {
		return s.fake.Now()
	}
	return time.Now()
}

func (s *suite) since(t time.Time) time.Duration { return s.now().Sub(t) }

func (s *suite) until(t time.Time) time.Duration { return t.Sub(s.now()) }

// sleep lets d pass: it steps the fake clock, or sleeps (in the tests
// where the passage of time is what is tested).
func (s *suite) sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	if s.fake != nil {
		s.fake.Advance(d)
		return
	}
	time.Sleep(d)
}

// lateBound measures the store's round trip (the median of a few
// admissions) and returns suite.late: lateRTTs of them, at least lateFloor,
// at most half the waiters' renewal period (beyond that the tests could
// not tell a woken waiter from one that renewed).
func (s *suite) lateBound(t *testing.T) time.Duration {
	t.Helper()
	c := s.client(t)
	ctx := testCtx(t, 30*time.Second)
	A := newScope(t, "rtt")
	rtts := make([]time.Duration, 11)
	for i := range rtts {
		start := time.Now()
		if _, err := c.Allow(ctx, one(A, rph(1000), 1)); err != nil {
			t.Fatalf("measuring the store's round trip: %v", err)
		}
		rtts[i] = time.Since(start)
	}
	rtt := median(rtts)
	late := min(max(lateFloor, lateRTTs*rtt), waiterLease/6)
	t.Logf("store round trip %v (median of %d): waiters may be %v late", rtt, len(rtts), late)
	return late
}

// client is one replica: a Limiter over its own backend, through a spy.
type client struct {
	*ratelimit.Limiter
	spy *spy
}

// client returns a Limiter over a new backend (a new "replica").
func (s *suite) client(t *testing.T) *client {
	t.Helper()
	b := s.newBackend(t)
	if b == nil {
		t.Fatal("newBackend returned nil")
	}
	sp := &spy{Backend: b, queued: make(map[string]chan struct{})}
	return &client{Limiter: ratelimit.New(sp, ratelimit.WithWaiterLease(waiterLease)), spy: sp}
}

// errDown is what the spy returns while the "store" is down.
// errDown is what a backend reports when its store cannot be reached.
var errDown = fmt.Errorf("%w: ratelimittest: injected store outage", ratelimit.ErrStoreUnavailable)

// spy wraps a Backend: it reports when an Enqueue leaves a request
// waiting, and fails every call while down is set.
type spy struct {
	ratelimit.Backend
	down atomic.Bool

	mu     sync.Mutex               // protects queued, hints and spans
	queued map[string]chan struct{} // request ID -> closed once it waits in its lane
	hints  map[string]time.Duration // request ID -> hint of its first Enqueue
	spans  map[string]span          // request ID -> its last Enqueue call
}

// span is when a store call started and returned.
type span struct{ start, end time.Time }

// span returns when the last Enqueue of id started and returned.
func (p *spy) span(id string) span {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.spans[id]
}

// queuedCh returns a channel closed once an Enqueue of id has returned
// without admitting it: from then on it has a place in its lane.
func (p *spy) queuedCh(id string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := p.queued[id]
	if ch == nil {
		ch = make(chan struct{})
		p.queued[id] = ch
	}
	return ch
}

// hint returns the hint the first Enqueue of id returned.
func (p *spy) hint(id string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hints[id]
}

func (p *spy) Admit(ctx context.Context, r *ratelimit.Request) (ratelimit.Decision, error) {
	if p.down.Load() {
		return ratelimit.Decision{}, errDown
	}
	return p.Backend.Admit(ctx, r)
}

func (p *spy) Enqueue(ctx context.Context, r *ratelimit.Request, lease time.Duration) (ratelimit.Decision, bool, time.Duration, error) {
	if p.down.Load() {
		return ratelimit.Decision{}, false, 0, errDown
	}
	start := time.Now()
	d, ok, hint, err := p.Backend.Enqueue(ctx, r, lease)
	end := time.Now()
	p.mu.Lock()
	if p.spans == nil {
		p.spans = make(map[string]span)
	}
	p.spans[r.ID] = span{start, end}
	p.mu.Unlock()
	if err == nil && !ok {
		p.mu.Lock()
		ch := p.queued[r.ID]
		if ch == nil {
			ch = make(chan struct{})
			p.queued[r.ID] = ch
		}
		select {
		case <-ch:
		default:
			close(ch)
			if p.hints == nil {
				p.hints = make(map[string]time.Duration)
			}
			p.hints[r.ID] = hint
		}
		p.mu.Unlock()
	}
	return d, ok, hint, err
}

func (p *spy) Await(ctx context.Context, r *ratelimit.Request, timeout time.Duration) (ratelimit.Decision, bool, error) {
	if p.down.Load() {
		return ratelimit.Decision{}, false, errDown
	}
	return p.Backend.Await(ctx, r, timeout)
}

func (p *spy) Abandon(ctx context.Context, r *ratelimit.Request) error {
	if p.down.Load() {
		return errDown
	}
	return p.Backend.Abandon(ctx, r)
}

func (p *spy) Settle(ctx context.Context, id string, actual []int64) error {
	if p.down.Load() {
		return errDown
	}
	return p.Backend.Settle(ctx, id, actual)
}

func (p *spy) Extend(ctx context.Context, id string, hold time.Duration, used []int64) error {
	if p.down.Load() {
		return errDown
	}
	return p.Backend.Extend(ctx, id, hold, used)
}

func (p *spy) Cooldown(ctx context.Context, scope string, d time.Duration) (time.Duration, error) {
	if p.down.Load() {
		return 0, errDown
	}
	return p.Backend.Cooldown(ctx, scope, d)
}

func (p *spy) Observe(ctx context.Context, scope string, l ratelimit.Limit, remaining int64) error {
	if p.down.Load() {
		return errDown
	}
	return p.Backend.Observe(ctx, scope, l, remaining)
}

func (p *spy) Learn(ctx context.Context, scope string, l ratelimit.Limit, x ratelimit.Learned) error {
	if p.down.Load() {
		return errDown
	}
	return p.Backend.Learn(ctx, scope, l, x)
}

// ---------------------------------------------------------------------------
// Helpers

func randHex(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// newScope returns a scope no other subtest or run uses.
func newScope(t *testing.T, name string) string {
	return "rltest/" + strings.ReplaceAll(t.Name(), "/", ".") + "/" + randHex(8) + "/" + name
}

// newID returns a fresh request ID.
func newID(name string) string { return name + "-" + randHex(12) }

// testCtx returns a context that ends with the test, or after d.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// Common limits. Minute windows refill slowly enough for tests that compute
// their bounds from the time they took; hour windows so slowly that no pause
// of a busy machine moves a bucket by a unit; the tests about refilling use
// short windows of their own.
func rpm(n int64) ratelimit.Limit {
	return ratelimit.Limit{Kind: ratelimit.Requests, Limit: n, Window: time.Minute}
}

func tpm(n int64) ratelimit.Limit {
	return ratelimit.Limit{Kind: ratelimit.Tokens, Limit: n, Window: time.Minute}
}

func rph(n int64) ratelimit.Limit {
	return ratelimit.Limit{Kind: ratelimit.Requests, Limit: n, Window: time.Hour}
}

func tph(n int64) ratelimit.Limit {
	return ratelimit.Limit{Kind: ratelimit.Tokens, Limit: n, Window: time.Hour}
}

func conc(n int64) ratelimit.Limit { return ratelimit.Limit{Kind: ratelimit.Concurrency, Limit: n} }

// rateP is the time a rate limit takes to regain one unit.
func rateP(l ratelimit.Limit) time.Duration { return l.Window / time.Duration(l.Limit) }

// one is a request with a single charge.
func one(scope string, l ratelimit.Limit, cost int64) ratelimit.Request {
	return ratelimit.Request{Charges: []ratelimit.Charge{{Scope: scope, Limit: l, Cost: cost}}}
}

func mustAllow(t *testing.T, ctx context.Context, c *client, r ratelimit.Request, what string) ratelimit.Decision {
	t.Helper()
	d, err := c.Allow(ctx, r)
	if err != nil {
		t.Fatalf("%s: Allow: %v", what, err)
	}
	if !d.Allowed {
		t.Fatalf("%s: Allow refused (denied by %q %v, retry after %v, limits %+v), want admitted", what, d.DeniedBy, d.DeniedKind, d.RetryAfter, d.Limits)
	}
	if d.ID == "" {
		t.Fatalf("%s: admitted with an empty ID", what)
	}
	if r.ID != "" && d.ID != r.ID && !shardID(d.ID, r.ID) {
		t.Fatalf("%s: ID = %q, want the request's %q", what, d.ID, r.ID)
	}
	if len(d.Limits) != len(r.Charges) {
		t.Fatalf("%s: %d statuses for %d charges", what, len(d.Limits), len(r.Charges))
	}
	if d.Degraded {
		t.Fatalf("%s: Degraded with a working store", what)
	}
	return d
}

func mustDeny(t *testing.T, ctx context.Context, c *client, r ratelimit.Request, what string) ratelimit.Decision {
	t.Helper()
	d, err := c.Allow(ctx, r)
	if err != nil {
		t.Fatalf("%s: Allow: %v", what, err)
	}
	if d.Allowed {
		t.Fatalf("%s: Allow admitted (limits %+v), want refused", what, d.Limits)
	}
	if len(d.Limits) != len(r.Charges) {
		t.Fatalf("%s: %d statuses for %d charges", what, len(d.Limits), len(r.Charges))
	}
	return d
}

func mustSettle(t *testing.T, ctx context.Context, c *client, id string, actual []int64) {
	t.Helper()
	if err := c.Settle(ctx, id, actual); err != nil {
		t.Fatalf("Settle(%s, %v): %v", id, actual, err)
	}
}

func mustRefund(t *testing.T, ctx context.Context, c *client, id string) {
	t.Helper()
	if err := c.Refund(ctx, id); err != nil {
		t.Fatalf("Refund(%s): %v", id, err)
	}
}

// remaining reads what scope's limit l has left now, without changing it:
// a zero-cost Tokens request, or a Requests/Concurrency request that is
// refunded at once. It uses a lane of its own, so waiters do not hold it up.
func remaining(t *testing.T, ctx context.Context, c *client, scope string, l ratelimit.Limit) int64 {
	t.Helper()
	r := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: scope, Limit: l}}, Lane: scope + "#probe"}
	d, err := c.Allow(ctx, r)
	if err != nil {
		t.Fatalf("probe %q: %v", scope, err)
	}
	if len(d.Limits) != 1 {
		t.Fatalf("probe %q: %d statuses", scope, len(d.Limits))
	}
	rem := d.Limits[0].Remaining
	if d.Allowed {
		if l.Kind != ratelimit.Tokens {
			rem++ // the probe itself took one
		}
		mustRefund(t, ctx, c, d.ID)
	}
	return rem
}

// wantRemaining checks remaining(scope) is in [lo, hi].
func wantRemaining(t *testing.T, ctx context.Context, c *client, scope string, l ratelimit.Limit, lo, hi int64, what string) {
	t.Helper()
	if got := remaining(t, ctx, c, scope, l); got < lo || got > hi {
		if lo == hi {
			t.Fatalf("%s: %s has %d left, want %d", what, l.Kind, got, lo)
		}
		t.Fatalf("%s: %s has %d left, want between %d and %d", what, l.Kind, got, lo, hi)
	}
}

// wantRefilled checks that scope has between base and base plus what a
// bucket refilling at rate's pace regains from from until the store
// answered (the bound is taken after the probe, however slow its reply).
func wantRefilled(t *testing.T, ctx context.Context, c *client, scope string, l, rate ratelimit.Limit, base int64, from time.Time, what string) {
	t.Helper()
	got := remaining(t, ctx, c, scope, l)
	if hi := base + refilled(rate, time.Since(from)); got < base || got > hi {
		t.Fatalf("%s: %s has %d left, want between %d and %d", what, l.Kind, got, base, hi)
	}
}

// refilled is how many whole units a bucket of l regains in d.
func refilled(l ratelimit.Limit, d time.Duration) int64 {
	return int64(float64(d) * float64(l.Limit) / float64(l.Window))
}

// wantDuration checks lo <= got <= hi.
func wantDuration(t *testing.T, got, lo, hi time.Duration, what string) {
	t.Helper()
	if got < lo || got > hi {
		t.Fatalf("%s = %v, want between %v and %v", what, got, lo, hi)
	}
}

type waited struct {
	d   ratelimit.Decision
	err error
	at  time.Time // when Wait returned
}

// waitAsync runs c.Wait in a goroutine and delivers its result.
func waitAsync(ctx context.Context, c *client, r ratelimit.Request) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		d, err := c.Wait(ctx, r)
		ch <- waited{d, err, time.Now()}
	}()
	return ch
}

// queue starts c.Wait(r) and returns once r waits in its lane. r.ID must be set.
func queue(t *testing.T, ctx context.Context, c *client, r ratelimit.Request, what string) <-chan waited {
	t.Helper()
	if r.ID == "" {
		t.Fatal("queue needs a request ID")
	}
	ch := waitAsync(ctx, c, r)
	select {
	case <-c.spy.queuedCh(r.ID):
	case w := <-ch:
		t.Fatalf("%s: Wait returned before queueing: allowed=%v err=%v", what, w.d.Allowed, w.err)
	case <-time.After(waitBound):
		t.Fatalf("%s: not queued within %v", what, waitBound)
	}
	return ch
}

// receive waits at most d for a Wait result and fails unless admitted.
func receive(t *testing.T, ch <-chan waited, d time.Duration, what string) waited {
	t.Helper()
	select {
	case w := <-ch:
		if w.err != nil {
			t.Fatalf("%s: Wait: %v", what, w.err)
		}
		if !w.d.Allowed {
			t.Fatalf("%s: Wait returned a refusal without an error", what)
		}
		return w
	case <-time.After(d):
		t.Fatalf("%s: Wait did not return within %v", what, d)
		return waited{}
	}
}

// notReturned fails the test if ch already has a result.
func notReturned(t *testing.T, ch <-chan waited, what string) {
	t.Helper()
	select {
	case w := <-ch:
		t.Fatalf("%s: Wait returned early: allowed=%v err=%v", what, w.d.Allowed, w.err)
	default:
	}
}

// stillBlocked checks that ch gives nothing for d: the waiter stays queued.
func stillBlocked(t *testing.T, ch <-chan waited, d time.Duration, what string) {
	t.Helper()
	select {
	case w := <-ch:
		t.Fatalf("%s: Wait returned while it should still wait: allowed=%v err=%v", what, w.d.Allowed, w.err)
	case <-time.After(d):
	}
}

// wantWaiters checks the lane's length if the backend can tell.
func wantWaiters(t *testing.T, ctx context.Context, c *client, lane string, n int) {
	t.Helper()
	in, ok := c.spy.Backend.(Inspector)
	if !ok {
		return
	}
	got, err := in.Waiters(ctx, lane)
	if err != nil {
		t.Fatalf("Waiters(%q): %v", lane, err)
	}
	if got != n {
		t.Fatalf("Waiters(%q) = %d, want %d", lane, got, n)
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// ---------------------------------------------------------------------------
// Buckets

// testBurstThenRefill: a bucket of n admits n at once; the refusal that
// follows names the exact time until the next unit; one unit per
// window/n later exactly one more fits; statuses track it.
func (s *suite) testBurstThenRefill(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	scope := newScope(t, "dep")
	const n = 10
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: n, Window: 4 * time.Second}
	period := rateP(lim) // 400ms per request

	start := s.now()
	for i := range int64(n) {
		d := mustAllow(t, ctx, c, one(scope, lim, 0), fmt.Sprintf("request %d of the burst", i))
		elapsed := s.since(start)
		st := d.Limits[0]
		if st.Scope != scope || st.Kind != ratelimit.Requests || st.Limit != n {
			t.Fatalf("status %+v, want scope %q kind requests limit %d", st, scope, n)
		}
		if want := n - (i + 1); st.Remaining < want || st.Remaining > want+refilled(lim, elapsed) {
			t.Fatalf("request %d: Remaining = %d, want %d", i, st.Remaining, want)
		}
		// Reset: i+1 units to refill, less what flowed in since the first.
		wantDuration(t, st.Reset, time.Duration(i+1)*period-elapsed-tol, time.Duration(i+1)*period+tol, fmt.Sprintf("request %d: Reset", i))
	}
	denySent := s.now()
	d := mustDeny(t, ctx, c, one(scope, lim, 0), "request after the burst")
	since := s.since(start)
	if since > period/2 {
		t.Logf("the burst took %v (slow machine); bounds widen accordingly", since)
	}
	// The bucket was full at the first admission (at or after start) and
	// has refilled continuously since: the next unit is due period after it.
	wantDuration(t, d.RetryAfter, period-since-tol, period+tol, "RetryAfter after the burst")
	if d.DeniedBy != scope || d.DeniedKind != ratelimit.Requests {
		t.Fatalf("denied by %q %v, want %q requests", d.DeniedBy, d.DeniedKind, scope)
	}
	if d.Limits[0].Remaining != 0 {
		t.Fatalf("Remaining after the burst = %d, want 0", d.Limits[0].Remaining)
	}
	wantDuration(t, d.Limits[0].Reset, n*period-since-tol, n*period+tol, "Reset after the burst")

	// Exactly when RetryAfter said, one more fits, and only one. The store
	// decided the refusal between denySent and its reply, so the unit was
	// due between denySent+RetryAfter and now+RetryAfter: wait for the
	// latter, measure how late from the former (a reply slowed on a busy
	// machine moves only the test's clock, not the store's).
	earliest := denySent.Add(d.RetryAfter)
	s.sleep(d.RetryAfter) // the passage of time is what is tested
	d = mustAllow(t, ctx, c, one(scope, lim, 0), "request at RetryAfter")
	if st := d.Limits[0]; st.Remaining != 0 {
		t.Fatalf("Remaining after the refilled request = %d, want 0", st.Remaining)
	}
	d = mustDeny(t, ctx, c, one(scope, lim, 0), "second request at RetryAfter")
	late := s.since(earliest)
	// The refusal came at most late past the due instant; the next unit is
	// period after the due instant.
	wantDuration(t, d.RetryAfter, period-late-tol, period+tol, "RetryAfter after one refill")
}

// testBurstDefault: Burst 0 means one full window; an explicit burst is
// honoured, also above the limit; a quiet window restores the whole
// allowance, and never more.
func (s *suite) testBurstDefault(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	for _, tc := range []struct {
		name  string
		burst int64
		want  int64
	}{
		{"default", 0, 6},
		{"below limit", 2, 2},
		{"above limit", 20, 20},
	} {
		scope := newScope(t, tc.name)
		lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 6, Window: time.Minute, Burst: tc.burst}
		start := s.now()
		for i := range tc.want {
			d := mustAllow(t, ctx, c, one(scope, lim, 1), fmt.Sprintf("%s: request %d", tc.name, i))
			if got, want := d.Limits[0].Remaining, tc.want-i-1; got != want {
				t.Fatalf("%s: request %d: Remaining = %d, want %d", tc.name, i, got, want)
			}
		}
		d := mustDeny(t, ctx, c, one(scope, lim, 1), tc.name+": request after the burst")
		wantDuration(t, d.RetryAfter, 10*time.Second-s.since(start)-tol, 10*time.Second+tol, tc.name+": RetryAfter")
	}

	// A quiet window later the full allowance is back, and not more.
	scope := newScope(t, "quiet")
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 5, Window: 250 * time.Millisecond}
	for i := range 5 {
		mustAllow(t, ctx, c, one(scope, lim, 1), fmt.Sprintf("first burst %d", i))
	}
	s.sleep(3 * lim.Window) // quiet: three windows' worth would flow in, uncapped
	d := mustAllow(t, ctx, c, one(scope, lim, 1), "after the quiet period")
	if got := d.Limits[0].Remaining; got != 4 {
		t.Fatalf("Remaining after a quiet period and one request = %d, want 4 (the bucket caps at its burst)", got)
	}
	if d.Limits[0].Reset <= 0 || d.Limits[0].Reset > rateP(lim)+tol {
		t.Fatalf("Reset = %v, want (0, %v]", d.Limits[0].Reset, rateP(lim))
	}
	for i := range 4 {
		mustAllow(t, ctx, c, one(scope, lim, 1), fmt.Sprintf("second burst %d", i))
	}
}

// testTokensMixedCosts: a tokens bucket is charged each request's cost and
// refuses a cost it cannot cover, with RetryAfter for exactly the missing
// tokens; requests and tokens of one scope are separate buckets.
func (s *suite) testTokensMixedCosts(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	scope := newScope(t, "dep")
	lim := tpm(1200) // 20 tokens/s
	per := rateP(lim)
	start := time.Now()
	left := int64(1200)
	for i, cost := range []int64{500, 400, 250} {
		d := mustAllow(t, ctx, c, one(scope, lim, cost), fmt.Sprintf("request %d (%d tokens)", i, cost))
		left -= cost
		if got := d.Limits[0].Remaining; got < left || got > left+refilled(lim, time.Since(start)) {
			t.Fatalf("Remaining after %d tokens = %d, want %d", cost, got, left)
		}
	}
	// 50 left: 100 is refused for the 50 missing tokens.
	d := mustDeny(t, ctx, c, one(scope, lim, 100), "100 tokens with 50 left")
	since := time.Since(start)
	wantDuration(t, d.RetryAfter, 50*per-since-tol, 50*per+tol, "RetryAfter for 50 missing tokens")
	if d.DeniedKind != ratelimit.Tokens || d.DeniedBy != scope {
		t.Fatalf("denied by %q %v, want %q tokens", d.DeniedBy, d.DeniedKind, scope)
	}
	d = mustDeny(t, ctx, c, one(scope, lim, 60), "60 tokens with 50 left")
	wantDuration(t, d.RetryAfter, 10*per-time.Since(start)-tol, 10*per+tol, "RetryAfter for 10 missing tokens")
	mustAllow(t, ctx, c, one(scope, lim, 50), "50 tokens with 50 left")

	// The scope's requests bucket is another bucket.
	rl := rpm(3)
	req := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: scope, Limit: rl}, {Scope: scope, Limit: lim, Cost: 1000}}}
	d = mustDeny(t, ctx, c, req, "request+tokens with no tokens left")
	if d.DeniedKind != ratelimit.Tokens || d.Limits[0].Remaining != 3 {
		t.Fatalf("denied by %v with requests remaining %d, want tokens and 3", d.DeniedKind, d.Limits[0].Remaining)
	}
	other := newScope(t, "other")
	req.Charges[0].Scope, req.Charges[1].Scope = other, other
	d = mustAllow(t, ctx, c, req, "request+tokens on a fresh scope")
	charged := time.Now()
	if d.Limits[0].Remaining != 2 || d.Limits[1].Remaining != 200 {
		t.Fatalf("statuses %+v, want 2 requests and 200 tokens left", d.Limits)
	}
	// Zero tokens always fit and charge nothing.
	d = mustAllow(t, ctx, c, one(other, lim, 0), "zero tokens")
	if got := d.Limits[0].Remaining; got < 200 || got > 200+refilled(lim, time.Since(charged)) {
		t.Fatalf("Remaining after a zero-token request = %d, want 200", got)
	}
}

// testImpossible: a cost above the burst, or a limit below one, can never
// be admitted; Allow and Wait say so at once and charge nothing.
func (s *suite) testImpossible(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	scope, other := newScope(t, "dep"), newScope(t, "other")
	small := ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 1000, Window: time.Minute, Burst: 100}
	for _, tc := range []struct {
		name string
		ch   ratelimit.Charge
	}{
		{"tokens above burst", ratelimit.Charge{Scope: scope, Limit: small, Cost: 101}},
		{"tokens above default burst", ratelimit.Charge{Scope: scope, Limit: tpm(50), Cost: 51}},
		{"requests above burst", ratelimit.Charge{Scope: scope, Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: 5, Window: time.Second, Burst: 1}, Cost: 2}},
		{"zero limit", ratelimit.Charge{Scope: scope, Limit: rpm(0)}},
		{"negative limit", ratelimit.Charge{Scope: scope, Limit: tpm(-5), Cost: 1}},
		{"zero permits", ratelimit.Charge{Scope: scope, Limit: conc(0)}},
	} {
		req := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: other, Limit: rpm(10)}, tc.ch}}
		if _, err := c.Allow(ctx, req); !errors.Is(err, ratelimit.ErrImpossible) {
			t.Fatalf("%s: Allow = %v, want ErrImpossible", tc.name, err)
		}
		wctx, cancel := context.WithTimeout(ctx, waitBound)
		_, err := c.Wait(wctx, req)
		cancel()
		if !errors.Is(err, ratelimit.ErrImpossible) {
			t.Fatalf("%s: Wait = %v, want ErrImpossible at once", tc.name, err)
		}
	}
	wantRemaining(t, ctx, c, scope, small, 100, 100, "after impossible requests")
	wantRemaining(t, ctx, c, other, rpm(10), 10, 10, "the other charge of impossible requests")
	// The cost equal to the burst is possible.
	mustAllow(t, ctx, c, one(scope, small, 100), "tokens equal to the burst")
}

// testAtomicity: a request refused by one scope charges none of the
// others, whichever of its charges refuses it.
func (s *suite) testAtomicity(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	tokens, reqs, permits := tph(1000), rph(2), conc(3)
	A, B, C := newScope(t, "A-tokens"), newScope(t, "B-requests"), newScope(t, "C-permits")
	three := func(a, b, c string, cost int64) ratelimit.Request {
		return ratelimit.Request{Charges: []ratelimit.Charge{
			{Scope: a, Limit: tokens, Cost: cost}, {Scope: b, Limit: reqs}, {Scope: c, Limit: permits},
		}}
	}
	check := func(what string, d ratelimit.Decision, by string, kind ratelimit.Kind, a, b, cc string, aLeft, bLeft, cLeft int64) {
		t.Helper()
		if d.DeniedBy != by || d.DeniedKind != kind {
			t.Fatalf("%s: denied by %q %v, want %q %v", what, d.DeniedBy, d.DeniedKind, by, kind)
		}
		if got := []int64{d.Limits[0].Remaining, d.Limits[1].Remaining, d.Limits[2].Remaining}; !slices.Equal(got, []int64{aLeft, bLeft, cLeft}) {
			t.Fatalf("%s: statuses say %v left, want %v", what, got, []int64{aLeft, bLeft, cLeft})
		}
		// Another replica sees the same.
		wantRemaining(t, ctx, other, a, tokens, aLeft, aLeft, what+": A")
		wantRemaining(t, ctx, other, b, reqs, bLeft, bLeft, what+": B")
		wantRemaining(t, ctx, other, cc, permits, cLeft, cLeft, what+": C")
	}

	// Refused by the requests scope (the middle charge).
	mustAllow(t, ctx, c, one(B, reqs, 1), "B 1")
	mustAllow(t, ctx, c, one(B, reqs, 1), "B 2")
	d := mustDeny(t, ctx, c, three(A, B, C, 100), "refused by requests")
	if d.RetryAfter < 29*time.Minute || d.RetryAfter > 30*time.Minute+tol {
		t.Fatalf("RetryAfter = %v, want ~30m (one request at 2/h)", d.RetryAfter)
	}
	check("refused by requests", d, B, ratelimit.Requests, A, B, C, 1000, 0, 3)

	// Refused by the concurrency scope (the last charge).
	B2 := newScope(t, "B2-requests")
	var held []string
	for i := range 3 {
		held = append(held, mustAllow(t, ctx, c, one(C, permits, 1), fmt.Sprintf("permit %d", i)).ID)
	}
	d = mustDeny(t, ctx, c, three(A, B2, C, 100), "refused by permits")
	// A full concurrency limit reports when the permit that must go expires
	// at the latest (a release frees one sooner): within the request's Hold.
	if d.RetryAfter <= 0 || d.RetryAfter > ratelimit.DefaultHold {
		t.Fatalf("RetryAfter = %v when refused by a concurrency limit, want the earliest permit's expiry, in (0, %v]", d.RetryAfter, ratelimit.DefaultHold)
	}
	check("refused by permits", d, C, ratelimit.Concurrency, A, B2, C, 1000, 2, 0)

	// Refused by the tokens scope (the first charge).
	C2 := newScope(t, "C2-permits")
	mustAllow(t, ctx, c, one(A, tokens, 950), "drain A")
	d = mustDeny(t, ctx, c, three(A, B2, C2, 100), "refused by tokens")
	check("refused by tokens", d, A, ratelimit.Tokens, A, B2, C2, 50, 2, 3)

	// Refused by two: the first refusing charge is named; the retry is the longer wait.
	B3 := newScope(t, "B3-requests")
	for i := range 2 {
		mustAllow(t, ctx, c, one(B3, reqs, 1), fmt.Sprintf("B3 %d", i))
	}
	d = mustDeny(t, ctx, c, three(A, B3, C2, 100), "refused by tokens and requests")
	if d.DeniedBy != A {
		t.Fatalf("denied by %q, want the first refusing charge %q", d.DeniedBy, A)
	}
	if d.RetryAfter < 29*time.Minute {
		t.Fatalf("RetryAfter = %v, want the longer of the two waits (~30m for requests, ~3m for tokens)", d.RetryAfter)
	}
	for _, id := range held {
		mustRefund(t, ctx, c, id)
	}
	mustAllow(t, ctx, c, three(newScope(t, "A2"), B2, C, 100), "all fit")
}

// testSameScopeSameKind: two limits of one kind on one scope (a
// deployment's requests per minute and per day) are two separate limits,
// or the request is refused as invalid; a request is never charged twice
// on one bucket, and charges that together exceed a bucket are never all
// admitted.
func (s *suite) testSameScopeSameKind(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	S := newScope(t, "dep")
	rpd := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 100, Window: 24 * time.Hour}
	both := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: S, Limit: rpm(10)}, {Scope: S, Limit: rpd}}}
	admitted := 0
	for i := range 20 {
		d, err := c.Allow(ctx, both)
		if errors.Is(err, ratelimit.ErrInvalid) && i == 0 {
			t.Logf("RPM and RPD on one scope refused as invalid: %v", err)
			break
		}
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 0 && admitted != 10 {
		t.Errorf("RPM 10 and RPD 100 on one scope admitted %d requests, want 10 (each request counted once per limit)", admitted)
	}

	T := newScope(t, "tokens")
	twice := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: T, Limit: tpm(100), Cost: 60}, {Scope: T, Limit: tpm(100), Cost: 60}}}
	d, err := c.Allow(ctx, twice)
	if err == nil && d.Allowed {
		t.Errorf("two charges of 60 tokens on one bucket of 100 were both admitted (statuses %+v): 120 tokens out of 100", d.Limits)
	} else if err != nil && !errors.Is(err, ratelimit.ErrInvalid) && !errors.Is(err, ratelimit.ErrImpossible) {
		t.Errorf("two charges on one bucket: %v", err)
	}
}

// testScopesAreBytes: scopes are byte strings: two that differ only in
// bytes that are not valid UTF-8 (a tenant name from a header, say) are
// two limits, unless such scopes are refused as invalid.
func (s *suite) testScopesAreBytes(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	prefix := newScope(t, "tenant-")
	a, b := prefix+"\xff", prefix+"\xfe"
	d, err := c.Allow(ctx, one(a, rpm(1), 1))
	if errors.Is(err, ratelimit.ErrInvalid) {
		t.Logf("scopes that are not UTF-8 are refused: %v", err)
		return
	}
	if err != nil || !d.Allowed {
		t.Fatalf("Allow on %q = %+v, %v", a, d, err)
	}
	d, err = c.Allow(ctx, one(b, rpm(1), 1))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed {
		t.Errorf("the only request on scope %q was refused (denied by %q) after one on %q: the two scopes share a limit", b, d.DeniedBy, a)
	}
}

// testSubMillisecondWindow: a window is honoured to the nanosecond, not
// rounded down to the millisecond (which would refill faster than the
// provider does).
func (s *suite) testSubMillisecondWindow(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	mustAllow(t, ctx, c, one(newScope(t, "warm-up"), rpm(1), 1), "warm-up") // loads what needs loading
	lim := ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 1000, Window: 4999 * time.Microsecond}
	// A 4.999ms window rounded down to 4ms would tell RetryAfter <= 4ms; the
	// right answer is 4.999ms less the time between the two requests.
	for attempt := range 5 {
		S := newScope(t, fmt.Sprintf("S%d", attempt))
		start := time.Now()
		mustAllow(t, ctx, c, one(S, lim, 1000), "the whole bucket")
		d, err := c.Allow(ctx, one(S, lim, 1000))
		elapsed := time.Since(start)
		if err != nil {
			t.Fatalf("the whole bucket again: Allow: %v", err)
		}
		if d.Allowed {
			// Right only if the window had passed between the two (a
			// stalled machine): the bucket was full again.
			if elapsed < lim.Window {
				t.Fatalf("the whole bucket again %v after it was drained: admitted (limits %+v), want refused within the %v window", elapsed, d.Limits, lim.Window)
			}
			t.Logf("attempt %d: two requests took %v, more than the window: the second was admitted, rightly", attempt, elapsed)
			continue
		}
		if len(d.Limits) != 1 {
			t.Fatalf("the whole bucket again: %d statuses for 1 charge", len(d.Limits))
		}
		if elapsed > 800*time.Microsecond {
			t.Logf("attempt %d: two requests took %v; too slow to tell a 4.999ms window from a 4ms one", attempt, elapsed)
			continue
		}
		if lo := lim.Window - elapsed - 20*time.Microsecond; d.RetryAfter < lo || d.RetryAfter > lim.Window+tol {
			t.Errorf("RetryAfter = %v for a bucket of 1000 refilling 1000 per %v, %v after it was drained: want between %v and %v (a window rounded down to whole ms refills faster than configured)", d.RetryAfter, lim.Window, elapsed, lo, lim.Window)
		}
		return
	}
	t.Skip("requests too slow on this machine to check sub-millisecond windows")
}

// testLargeLimits: limits up to 2^50 (a "practically unlimited" TPM, or a
// monthly token quota of a large tenant) are counted exactly, and never
// turn into degraded (unchecked) admissions.
func (s *suite) testLargeLimits(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	for _, n := range []int64{1e13, 1e14, 1e15, 1 << 50} {
		S := newScope(t, fmt.Sprint(n))
		lim := ratelimit.Limit{Kind: ratelimit.Tokens, Limit: n, Window: 30 * 24 * time.Hour}
		d, err := c.Allow(ctx, one(S, lim, 1500))
		if err != nil || !d.Allowed || d.Degraded {
			t.Errorf("limit %d: Allow = allowed %v, degraded %v, err %v; want admitted and checked (store errors so far: %d)", n, d.Allowed, d.Degraded, err, c.Stats().StoreErrors)
			continue
		}
		if got := d.Limits[0].Remaining; got < n-1500 || got > n-1500+refilled(lim, time.Second) {
			t.Errorf("limit %d: Remaining = %d, want %d", n, got, n-1500)
		}
	}
}

// ---------------------------------------------------------------------------
// Reserve and settle

// testSettle: Settle replaces the reserved estimate with the actual cost:
// charging more (even into debt) or refunding less, never above the burst.
func (s *suite) testSettle(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	A := newScope(t, "A")
	lim := tph(1000)

	r1 := mustAllow(t, ctx, c, one(A, lim, 100), "reserve 100")
	wantRemaining(t, ctx, other, A, lim, 900, 901, "after reserving 100")
	mustSettle(t, ctx, c, r1.ID, []int64{150})
	wantRemaining(t, ctx, other, A, lim, 850, 851, "after settling 150 for 100")
	r2 := mustAllow(t, ctx, c, one(A, lim, 100), "reserve 100 again")
	mustSettle(t, ctx, other, r2.ID, []int64{40}) // another replica settles
	wantRemaining(t, ctx, c, A, lim, 810, 812, "after settling 40 for 100")

	// Several charges: each actual replaces its own charge; Requests and
	// Concurrency charges are left as reserved / released.
	B, C := newScope(t, "B"), newScope(t, "C")
	req := ratelimit.Request{Charges: []ratelimit.Charge{
		{Scope: A, Limit: lim, Cost: 200}, {Scope: B, Limit: rph(10)}, {Scope: C, Limit: conc(1)},
	}}
	r3 := mustAllow(t, ctx, c, req, "three charges")
	mustSettle(t, ctx, c, r3.ID, []int64{60, 1, 1})
	wantRemaining(t, ctx, other, A, lim, 750, 753, "A after settling 60 for 200")
	wantRemaining(t, ctx, other, B, rph(10), 9, 9, "B after settling")
	wantRemaining(t, ctx, other, C, conc(1), 1, 1, "C's permit after settling")

	// Fewer actuals than charges: the rest stand as reserved.
	r4 := mustAllow(t, ctx, c, req, "three charges again")
	mustSettle(t, ctx, c, r4.ID, nil)
	wantRemaining(t, ctx, other, A, lim, 550, 553, "A after settling with no actuals")
	wantRemaining(t, ctx, other, C, conc(1), 1, 1, "C's permit after settling with no actuals")

	// Charging more than the bucket has leaves a debt the refill must pay.
	D := newScope(t, "D")
	r5 := mustAllow(t, ctx, c, one(D, lim, 1000), "reserve the whole bucket")
	mustSettle(t, ctx, c, r5.ID, []int64{1300})
	d := mustDeny(t, ctx, c, one(D, lim, 100), "100 tokens after a 300-token debt")
	if d.Limits[0].Remaining != 0 {
		t.Fatalf("Remaining in debt = %d, want 0", d.Limits[0].Remaining)
	}
	// 400 tokens at 1000/h: 24m.
	if d.RetryAfter < 23*time.Minute || d.RetryAfter > 24*time.Minute+tol {
		t.Fatalf("RetryAfter = %v, want ~24m (300 of debt + 100)", d.RetryAfter)
	}

	// A refund never fills the bucket above its burst.
	E := newScope(t, "E")
	fast := ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 100, Window: 200 * time.Millisecond} // 1 token per 2ms
	r6 := mustAllow(t, ctx, c, one(E, fast, 80), "reserve 80 of 100")
	time.Sleep(2 * fast.Window) // refills to full while the reservation is out
	mustSettle(t, ctx, c, r6.ID, []int64{0})
	wantRemaining(t, ctx, other, E, fast, 100, 100, "after refunding into a full bucket")
}

// testSettleIdempotent: a second Settle is a no-op, whatever it says.
func (s *suite) testSettleIdempotent(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	A, C := newScope(t, "A"), newScope(t, "C")
	lim := tph(1000)
	req := ratelimit.Request{ID: newID("settle-twice"), Charges: []ratelimit.Charge{{Scope: A, Limit: lim, Cost: 100}, {Scope: C, Limit: conc(1)}}}
	mustAllow(t, ctx, c, req, "reserve")
	mustSettle(t, ctx, c, req.ID, []int64{300, 1})
	wantRemaining(t, ctx, other, A, lim, 700, 701, "after the first Settle")
	for i, actual := range [][]int64{{300, 1}, {10, 1}, nil} {
		if err := other.Settle(ctx, req.ID, actual); err != nil {
			t.Fatalf("Settle #%d: %v, want nil (no-op)", i+2, err)
		}
	}
	if err := c.Refund(ctx, req.ID); err != nil {
		t.Fatalf("Refund after Settle: %v, want nil (no-op)", err)
	}
	wantRemaining(t, ctx, other, A, lim, 700, 701, "after repeated Settles and a Refund")
	// The permit was released once: exactly one is free.
	hold := mustAllow(t, ctx, c, one(C, conc(1), 1), "the released permit")
	mustDeny(t, ctx, c, one(C, conc(1), 1), "a second permit")
	mustRefund(t, ctx, c, hold.ID)
}

// testRefund: Refund gives everything back and frees permits; it is idempotent.
func (s *suite) testRefund(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	A, B, C := newScope(t, "A"), newScope(t, "B"), newScope(t, "C")
	req := ratelimit.Request{Charges: []ratelimit.Charge{
		{Scope: A, Limit: tpm(1000), Cost: 400}, {Scope: B, Limit: rpm(5)}, {Scope: C, Limit: conc(1)},
	}}
	d := mustAllow(t, ctx, c, req, "reserve")
	mustDeny(t, ctx, other, one(C, conc(1), 1), "permit while held")
	mustRefund(t, ctx, other, d.ID)
	wantRemaining(t, ctx, c, A, tpm(1000), 1000, 1000, "A after Refund")
	wantRemaining(t, ctx, c, B, rpm(5), 5, 5, "B after Refund")
	wantRemaining(t, ctx, c, C, conc(1), 1, 1, "C after Refund")
	mustRefund(t, ctx, c, d.ID)
	if err := c.Settle(ctx, d.ID, []int64{400, 1, 1}); err != nil {
		t.Fatalf("Settle after Refund: %v, want nil (no-op)", err)
	}
	wantRemaining(t, ctx, c, A, tpm(1000), 1000, 1000, "A after a Settle that followed the Refund")
}

// testUnknownReservation: IDs never admitted are unknown to Settle, Refund and Extend.
func (s *suite) testUnknownReservation(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	id := newID("never")
	if err := c.Settle(ctx, id, []int64{1}); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Settle of an unknown ID = %v, want ErrUnknownReservation", err)
	}
	if err := c.Refund(ctx, id); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Refund of an unknown ID = %v, want ErrUnknownReservation", err)
	}
	if err := c.Extend(ctx, id, time.Second); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Extend of an unknown ID = %v, want ErrUnknownReservation", err)
	}
	// A refused request leaves no reservation either.
	A := newScope(t, "A")
	mustAllow(t, ctx, c, one(A, rpm(1), 1), "the only request")
	d := mustDeny(t, ctx, c, ratelimit.Request{ID: newID("refused"), Charges: []ratelimit.Charge{{Scope: A, Limit: rpm(1)}}}, "refused")
	if err := c.Settle(ctx, d.ID, []int64{1}); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Settle of a refused request = %v, want ErrUnknownReservation", err)
	}
	// A settled reservation cannot be extended.
	ok := mustAllow(t, ctx, c, one(newScope(t, "B"), rpm(1), 1), "to settle")
	mustSettle(t, ctx, c, ok.ID, []int64{1})
	if err := c.Extend(ctx, ok.ID, time.Second); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Extend of a settled reservation = %v, want ErrUnknownReservation", err)
	}
}

// testReservationHold: an unsettled reservation is dropped after its Hold
// (its estimate stands), unless extended.
func (s *suite) testReservationHold(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	A := newScope(t, "A")
	lim := tph(1000)
	const hold = 200 * time.Millisecond
	r := one(A, lim, 300)
	r.Hold = hold
	dropped := mustAllow(t, ctx, c, r, "reservation to drop")
	kept := mustAllow(t, ctx, c, r, "reservation to extend")
	if err := c.Extend(ctx, kept.ID, 5*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	s.sleep(hold + 100*time.Millisecond) // let the hold pass
	if err := c.Settle(ctx, dropped.ID, []int64{0}); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Settle after the hold = %v, want ErrUnknownReservation", err)
	}
	// The estimate of the dropped one stands; the extended one settles.
	wantRemaining(t, ctx, c, A, lim, 400, 401, "after the hold")
	mustSettle(t, ctx, c, kept.ID, []int64{0})
	wantRemaining(t, ctx, c, A, lim, 700, 701, "after settling the extended reservation")
}

// ---------------------------------------------------------------------------
// Concurrency

// testConcurrency: n permits are granted, the next is refused (with no
// retry-after: it depends on a release), Settle and Refund release them,
// and replicas share them.
func (s *suite) testConcurrency(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	C := newScope(t, "C")
	lim := conc(3)
	var ids []string
	for i := range int64(3) {
		cl := c
		if i == 1 {
			cl = other
		}
		d := mustAllow(t, ctx, cl, one(C, lim, 0), fmt.Sprintf("permit %d", i))
		if st := d.Limits[0]; st.Remaining != 2-i || st.Kind != ratelimit.Concurrency || st.Limit != 3 || st.Reset != 0 {
			t.Fatalf("permit %d: status %+v, want %d remaining, kind concurrency, limit 3, reset 0", i, st, 2-i)
		}
		ids = append(ids, d.ID)
	}
	for _, cl := range []*client{c, other} {
		d := mustDeny(t, ctx, cl, one(C, lim, 1), "fourth permit")
		if d.DeniedBy != C || d.DeniedKind != ratelimit.Concurrency || d.RetryAfter <= 0 || d.RetryAfter > ratelimit.DefaultHold || d.Limits[0].Remaining != 0 {
			t.Fatalf("fourth permit: %+v, want denied by %q concurrency, RetryAfter within the hold, 0 remaining", d, C)
		}
	}
	mustSettle(t, ctx, other, ids[0], []int64{1})
	ids[0] = mustAllow(t, ctx, c, one(C, lim, 1), "after a Settle").ID
	mustDeny(t, ctx, c, one(C, lim, 1), "after the Settle's permit was taken")
	mustRefund(t, ctx, c, ids[1])
	ids[1] = mustAllow(t, ctx, other, one(C, lim, 1), "after a Refund").ID
	mustDeny(t, ctx, c, one(C, lim, 1), "after the Refund's permit was taken")
	for _, id := range ids {
		mustRefund(t, ctx, c, id)
	}
	wantRemaining(t, ctx, c, C, lim, 3, 3, "after releasing all")
}

// testPermitExpiry: an unsettled permit is dropped after its Hold, not before.
func (s *suite) testPermitExpiry(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	C := newScope(t, "C")
	const hold = 300 * time.Millisecond
	r := one(C, conc(1), 1)
	r.Hold = hold
	start := s.now()
	mustAllow(t, ctx, c, r, "permit with a short hold")
	admitted := s.now() // the permit expires between start+hold and admitted+hold
	mustDeny(t, ctx, other, one(C, conc(1), 1), "while held")
	if wait := s.until(start.Add(hold - 100*time.Millisecond)); wait > 0 {
		s.sleep(wait)
		if s.since(start) < hold-50*time.Millisecond { // checked in time
			mustDeny(t, ctx, other, one(C, conc(1), 1), "just before the hold ends")
		}
	}
	s.sleep(s.until(admitted.Add(hold + 20*time.Millisecond)))
	mustAllow(t, ctx, other, one(C, conc(1), 1), "after the hold")
}

// testPermitExtend: Extend keeps a permit alive beyond its original Hold.
func (s *suite) testPermitExtend(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	C := newScope(t, "C")
	const hold = 300 * time.Millisecond
	r := one(C, conc(1), 1)
	r.Hold = hold
	d := mustAllow(t, ctx, c, r, "permit with a short hold")
	if err := other.Extend(ctx, d.ID, 3*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	s.sleep(hold + 200*time.Millisecond) // past the original hold
	mustDeny(t, ctx, other, one(C, conc(1), 1), "after the original hold, extended")
	if err := c.Extend(ctx, d.ID, 3*time.Second); err != nil {
		t.Fatalf("second Extend: %v", err)
	}
	mustSettle(t, ctx, c, d.ID, []int64{1})
	mustAllow(t, ctx, other, one(C, conc(1), 1), "after Settle")
}

// ---------------------------------------------------------------------------
// Waiting

// testWaitWokenBySettle: Wait blocks while the permit is held and returns
// right after the Settle that frees it (far sooner than its 1s renewal).
func (s *suite) testWaitWokenBySettle(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	holder, waiter := s.client(t), s.client(t)
	C := newScope(t, "C")
	const rounds = 5
	var lat []time.Duration
	for i := range rounds {
		h := mustAllow(t, ctx, holder, one(C, conc(1), 1), fmt.Sprintf("round %d: holder", i))
		r := one(C, conc(1), 1)
		r.ID = newID("waiter")
		ch := queue(t, ctx, waiter, r, fmt.Sprintf("round %d", i))
		if i == 0 {
			stillBlocked(t, ch, 100*time.Millisecond, "waiter while the permit is held")
		}
		notReturned(t, ch, "waiter before the Settle")
		wantWaiters(t, ctx, waiter, C, 1)
		start := time.Now()
		mustSettle(t, ctx, holder, h.ID, []int64{1})
		w := receive(t, ch, waitBound, fmt.Sprintf("round %d: waiter", i))
		lat = append(lat, w.at.Sub(start))
		if w.d.ID != r.ID {
			t.Fatalf("admitted ID %q, want %q", w.d.ID, r.ID)
		}
		if len(w.d.Limits) != 1 || w.d.Limits[0].Remaining != 0 {
			t.Fatalf("waiter's statuses %+v, want the permit taken", w.d.Limits)
		}
		wantWaiters(t, ctx, waiter, C, 0)
		mustSettle(t, ctx, waiter, w.d.ID, []int64{1})
	}
	t.Logf("Settle-to-admission latency over %d rounds: median %v, max %v", rounds, median(lat), slices.Max(lat))
	if m := median(lat); m > s.late {
		t.Fatalf("median Settle-to-admission latency %v, want below %v (is the waiter woken, or does it renew?)", m, s.late)
	}
	if st := waiter.Stats(); st.Waited != rounds {
		t.Fatalf("Stats().Waited = %d, want %d", st.Waited, rounds)
	}
}

// testWaitWokenByRefill: waiters blocked on a rate limit are admitted when
// the refill makes room for each, within a few ms: the first is told
// exactly when, and each admission tells the next.
func (s *suite) testWaitWokenByRefill(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	drainer := s.client(t)
	A := newScope(t, "A")
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 4, Window: time.Second} // one per 250ms
	period := rateP(lim)
	start := time.Now()
	var firstBack time.Time
	for i := range 4 {
		mustAllow(t, ctx, drainer, one(A, lim, 1), fmt.Sprintf("drain %d", i))
		if i == 0 {
			firstBack = time.Now()
		}
	}
	const n = 3
	chs := make([]<-chan waited, n)
	ids := make([]string, n)
	waiters := make([]*client, n)
	for i := range n {
		waiters[i] = s.client(t)
		r := one(A, lim, 1)
		r.ID = newID(fmt.Sprintf("w%d", i))
		ids[i] = r.ID
		chs[i] = queue(t, ctx, waiters[i], r, fmt.Sprintf("waiter %d", i))
	}
	if elapsed := time.Since(start); elapsed > period-20*time.Millisecond {
		t.Skipf("queueing took %v, too close to the first refill at %v to tell when waiters were admitted", elapsed, period)
	}
	hint := waiters[0].spy.hint(ids[0])
	// The bucket was full at the first admission, at a time t1 between
	// start and firstBack; waiter k fits at t1 + (k+1)*period.
	for k := range n {
		w := receive(t, chs[k], waitBound, fmt.Sprintf("waiter %d", k))
		if early := start.Add(time.Duration(k+1) * period).Sub(w.at); early > 2*time.Millisecond {
			t.Fatalf("waiter %d admitted %v before the refill made room", k, early)
		}
		late := w.at.Sub(firstBack.Add(time.Duration(k+1) * period))
		t.Logf("waiter %d admitted %v after its refill (first waiter's hint was %v)", k, late.Round(10*time.Microsecond), hint)
		if late > s.late {
			t.Fatalf("waiter %d admitted %v after the refill made room (first hint %v), want within %v", k, late, hint, s.late)
		}
		mustSettle(t, ctx, waiters[k], w.d.ID, []int64{1})
	}
}

// testWaitWokenByPermitExpiry: a permit whose holder never settles (it
// crashed) frees at the end of its Hold; a waiter for it is admitted then,
// not at its next renewal a second later.
func (s *suite) testWaitWokenByPermitExpiry(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	crashed, w := s.client(t), s.client(t)
	C := newScope(t, "C")
	const hold = 400 * time.Millisecond
	r := one(C, conc(1), 1)
	r.Hold = hold
	start := time.Now()
	mustAllow(t, ctx, crashed, r, "holder that never settles")
	admitted := time.Now() // the permit expires between start+hold and admitted+hold
	wr := one(C, conc(1), 1)
	wr.ID = newID("waiter")
	got := receive(t, queue(t, ctx, w, wr, "waiter"), waitBound, "waiter for an abandoned permit")
	if early := start.Add(hold).Sub(got.at); early > 2*time.Millisecond {
		t.Fatalf("waiter admitted %v before the abandoned permit expired", early)
	}
	late := got.at.Sub(admitted.Add(hold))
	t.Logf("waiter admitted %v after the abandoned permit expired (its hint: %v)", late.Round(10*time.Microsecond), w.spy.hint(wr.ID))
	if late > s.late {
		t.Errorf("waiter admitted %v after the abandoned permit expired, want within %v: the walk knows when the permit expires but gives no hint, so the waiter finds out at its next renewal (every %v)", late, s.late, waiterLease/3)
	}
}

// testSettleWakesEveryLane: a refund that makes room on a tenant's limit
// wakes the waiters of every lane blocked on it, however many lanes
// (here ten deployments) there are.
func (s *suite) testSettleWakesEveryLane(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	holder := s.client(t)
	T := newScope(t, "tenant")
	lim := tph(100)
	h := mustAllow(t, ctx, holder, one(T, lim, 100), "drain the tenant")
	const lanes = 10
	chs := make([]<-chan waited, lanes)
	clients := make([]*client, lanes)
	for i := range lanes {
		clients[i] = s.client(t)
		r := ratelimit.Request{ID: newID(fmt.Sprintf("w%d", i)), Charges: []ratelimit.Charge{
			{Scope: newScope(t, fmt.Sprintf("dep%d", i)), Limit: rpm(100)}, {Scope: T, Limit: lim, Cost: 10},
		}}
		chs[i] = queue(t, ctx, clients[i], r, fmt.Sprintf("waiter in lane %d", i))
	}
	start := time.Now()
	mustRefund(t, ctx, holder, h.ID)
	var slow []string
	for i, ch := range chs {
		w := receive(t, ch, waitBound, fmt.Sprintf("waiter in lane %d", i))
		if d := w.at.Sub(start); d > s.late {
			slow = append(slow, fmt.Sprintf("lane %d after %v", i, d.Round(time.Millisecond)))
		}
	}
	if len(slow) > 0 {
		t.Errorf("%d of %d waiters were not woken by the refund that made room for all of them: %s (a settle walks at most 8 lanes, and forgets the others)", len(slow), lanes, strings.Join(slow, ", "))
	}
	wantRemaining(t, ctx, holder, T, lim, 0, 1, "tenant after all waiters")
}

// serveInOrder starts each waiter of reqs on its own client, in order, each
// queued before the next; then frees the single permit that blocks them
// and returns the order in which they were admitted (each admitted waiter
// records itself and settles, which admits the next).
func (s *suite) serveInOrder(t *testing.T, ctx context.Context, C string, reqs []ratelimit.Request) []int {
	t.Helper()
	holder := s.client(t)
	h := mustAllow(t, ctx, holder, one(C, conc(1), 1), "holder")
	order := make(chan int, len(reqs))
	errs := make(chan error, len(reqs))
	lane := reqs[0].Lane
	if lane == "" {
		lane = reqs[0].Charges[0].Scope
	}
	for i, r := range reqs {
		c := s.client(t)
		go func() {
			d, err := c.Wait(ctx, r)
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			order <- i
			errs <- c.Settle(ctx, d.ID, []int64{1, 1})
		}()
		select {
		case <-c.spy.queuedCh(r.ID):
		case err := <-errs:
			t.Fatalf("waiter %d returned before queueing: %v", i, err)
		case <-time.After(waitBound):
			t.Fatalf("waiter %d not queued within %v", i, waitBound)
		}
		wantWaiters(t, ctx, c, lane, i+1)
	}
	mustSettle(t, ctx, holder, h.ID, []int64{1})
	for range reqs {
		select {
		case err := <-errs:
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
	wantWaiters(t, ctx, holder, lane, 0)
	return got
}

// testWaitArrivalOrder: waiters of one class, each on its own replica, are
// served in arrival order.
func (s *suite) testWaitArrivalOrder(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	C := newScope(t, "C")
	const n = 6
	reqs := make([]ratelimit.Request, n)
	for i := range reqs {
		reqs[i] = one(C, conc(1), 1)
		reqs[i].ID = newID(fmt.Sprintf("w%d", i))
	}
	if got, want := s.serveInOrder(t, ctx, C, reqs), []int{0, 1, 2, 3, 4, 5}; !slices.Equal(got, want) {
		t.Fatalf("served in order %v, want %v", got, want)
	}
}

// testWaitPriority: interactive waiters are served before batch ones that
// queued earlier; each class in arrival order.
func (s *suite) testWaitPriority(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	C := newScope(t, "C")
	prios := []ratelimit.Priority{ratelimit.Batch, ratelimit.Batch, ratelimit.Interactive, ratelimit.Interactive, ratelimit.Batch, ratelimit.Interactive}
	reqs := make([]ratelimit.Request, len(prios))
	for i, p := range prios {
		reqs[i] = one(C, conc(1), 1)
		reqs[i].ID = newID(fmt.Sprintf("w%d", i))
		reqs[i].Priority = p
	}
	if got, want := s.serveInOrder(t, ctx, C, reqs), []int{2, 3, 5, 0, 1, 4}; !slices.Equal(got, want) {
		t.Fatalf("served in order %v, want %v (interactive first, then batch, each by arrival)", got, want)
	}
}

// testOwnScopeDoesNotBlock: in one deployment lane, a waiter held back only
// by its own tenant's limit does not hold up another tenant's waiter behind
// it; it is admitted as soon as its tenant's permit is released.
func (s *suite) testOwnScopeDoesNotBlock(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	holder, wa, wb := s.client(t), s.client(t), s.client(t)
	dep, ta, tb := newScope(t, "dep"), newScope(t, "tenant-a"), newScope(t, "tenant-b")
	h := mustAllow(t, ctx, holder, one(ta, conc(1), 1), "tenant a's holder")
	reqA := ratelimit.Request{ID: newID("a"), Charges: []ratelimit.Charge{{Scope: dep, Limit: rph(100)}, {Scope: ta, Limit: conc(1)}}}
	chA := queue(t, ctx, wa, reqA, "tenant a's waiter")
	reqB := ratelimit.Request{ID: newID("b"), Charges: []ratelimit.Charge{{Scope: dep, Limit: rph(100)}, {Scope: tb, Limit: conc(1)}}}
	start := time.Now()
	b := receive(t, waitAsync(ctx, wb, reqB), waitBound, "tenant b's waiter behind a")
	if d := b.at.Sub(start); d > s.late {
		t.Fatalf("tenant b's waiter admitted after %v, want at once", d)
	}
	notReturned(t, chA, "tenant a's waiter while its tenant's permit is held")
	wantWaiters(t, ctx, wa, dep, 1)
	// Releasing tenant a's permit (a request of another lane) wakes it.
	start = time.Now()
	mustSettle(t, ctx, holder, h.ID, []int64{1})
	a := receive(t, chA, waitBound, "tenant a's waiter")
	if d := a.at.Sub(start); d > s.late {
		t.Fatalf("tenant a's waiter admitted %v after its tenant's permit was released, want within %v", d, s.late)
	}
	wantRemaining(t, ctx, holder, dep, rph(100), 98, 98, "deployment after both")
	mustSettle(t, ctx, wa, a.d.ID, []int64{1, 1})
	mustSettle(t, ctx, wb, b.d.ID, []int64{1, 1})
}

// testSharedScopeKeepsOrder: a waiter held back by the deployment's own
// bucket holds up the waiters behind it on that bucket, even those that
// would fit on their own; both are served, in order, once it fills.
func (s *suite) testSharedScopeKeepsOrder(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, wa, wb := s.client(t), s.client(t), s.client(t)
	dep := newScope(t, "dep")
	lim := tph(100)
	drain := mustAllow(t, ctx, c, one(dep, lim, 80), "drain to 20")
	reqA := one(dep, lim, 50)
	reqA.ID = newID("big")
	chA := queue(t, ctx, wa, reqA, "big waiter")
	reqB := one(dep, lim, 10)
	reqB.ID = newID("small")
	chB := queue(t, ctx, wb, reqB, "small waiter behind it")
	wantWaiters(t, ctx, c, dep, 2)
	stillBlocked(t, chB, 50*time.Millisecond, "small waiter behind a big one")
	notReturned(t, chA, "big waiter")
	mustRefund(t, ctx, c, drain.ID)
	a := receive(t, chA, waitBound, "big waiter after the refund")
	b := receive(t, chB, waitBound, "small waiter after the refund")
	// One walk admits both, and their goroutines wake in any order: the
	// order of admission is in what each left in the bucket.
	if len(a.d.Limits) != 1 || len(b.d.Limits) != 1 {
		t.Fatalf("decisions without the bucket's status: big %+v, small %+v", a.d, b.d)
	}
	if ra, rb := a.d.Limits[0].Remaining, b.d.Limits[0].Remaining; rb >= ra {
		t.Fatalf("small waiter admitted before the big one ahead of it: %d left after the small one, %d after the big one", rb, ra)
	}
	wantRemaining(t, ctx, c, dep, lim, 40, 41, "after both")
}

// testWaitDeadline: a Wait whose context ends first, or whose MaxWait
// passes, returns ErrLimited and the context's error, with the last
// refusal; it leaves nothing charged and nothing queued (a later, smaller
// request goes straight through).
func (s *suite) testWaitDeadline(t *testing.T) {
	t.Run("context", func(t *testing.T) { s.waitDeadline(t, false) })
	t.Run("MaxWait", func(t *testing.T) { s.waitDeadline(t, true) })
}

func (s *suite) waitDeadline(t *testing.T, maxWait bool) {
	ctx := testCtx(t, 30*time.Second)
	c, w := s.client(t), s.client(t)
	A, B := newScope(t, "A"), newScope(t, "B")
	lim := tph(100)
	mustAllow(t, ctx, c, one(A, lim, 80), "drain A to 20")
	req := ratelimit.Request{ID: newID("gives-up"), Charges: []ratelimit.Charge{{Scope: A, Limit: lim, Cost: 50}, {Scope: B, Limit: rph(10)}}}
	const deadline = 200 * time.Millisecond
	wctx := ctx
	if maxWait {
		req.MaxWait = deadline
	} else {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, deadline)
		defer cancel()
	}
	start := time.Now()
	d, err := w.Wait(wctx, req)
	took := time.Since(start)
	if !errors.Is(err, ratelimit.ErrLimited) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline = %v, want ErrLimited and DeadlineExceeded", err)
	}
	wantDuration(t, took, deadline-time.Millisecond, deadline+s.late, "Wait returned after")
	if d.Allowed || d.ID != req.ID || d.DeniedBy != A || d.DeniedKind != ratelimit.Tokens {
		t.Fatalf("decision %+v, want not allowed, ID %q, denied by %q tokens", d, req.ID, A)
	}
	// 30 tokens short at 100/h: 18m.
	if d.RetryAfter < 17*time.Minute || d.RetryAfter > 18*time.Minute+tol {
		t.Fatalf("RetryAfter = %v, want ~18m", d.RetryAfter)
	}
	if st := w.Stats(); st.Denied != 1 || st.Admitted != 0 {
		t.Fatalf("Stats = %+v, want 1 denied", st)
	}
	wantWaiters(t, ctx, c, A, 0)
	wantRemaining(t, ctx, c, A, lim, 20, 20, "A after the waiter gave up")
	wantRemaining(t, ctx, c, B, rph(10), 10, 10, "B after the waiter gave up")
	if err := c.Settle(ctx, req.ID, []int64{50, 1}); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Settle of the request that gave up = %v, want ErrUnknownReservation", err)
	}
	// Nothing left in the lane: a smaller request is admitted at once.
	mustAllow(t, ctx, c, one(A, lim, 10), "smaller request after the waiter gave up")

	// A context that has already ended queues nothing.
	dead, cancelDead := context.WithCancel(ctx)
	cancelDead()
	if _, err := w.Wait(dead, req); !errors.Is(err, ratelimit.ErrLimited) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with an ended context = %v, want ErrLimited and Canceled", err)
	}
	wantWaiters(t, ctx, c, A, 0)
}

// testWaitDeadlineRace: a waiter's deadline races the Settle that admits
// it. Whatever wins, the outcome is consistent: admitted and holding the
// permit, or refused with the permit free and nothing queued.
func (s *suite) testWaitDeadlineRace(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	holder, w := s.client(t), s.client(t)
	C := newScope(t, "C")
	won, lost := 0, 0
	for i := range 12 {
		h := mustAllow(t, ctx, holder, one(C, conc(1), 1), fmt.Sprintf("round %d: holder", i))
		r := one(C, conc(1), 1)
		r.ID = newID("racer")
		wctx, cancel := context.WithTimeout(ctx, 60*time.Millisecond)
		ch := queue(t, wctx, w, r, fmt.Sprintf("round %d", i))
		time.Sleep(time.Duration(40+i*3) * time.Millisecond) // race the Settle against the deadline
		mustSettle(t, ctx, holder, h.ID, []int64{1})
		var res waited
		select {
		case res = <-ch:
		case <-time.After(waitBound):
			t.Fatalf("round %d: waiter did not return", i)
		}
		cancel()
		if res.err == nil {
			won++
			if !res.d.Allowed {
				t.Fatalf("round %d: Wait returned no error and no admission", i)
			}
			mustDeny(t, ctx, holder, one(C, conc(1), 1), fmt.Sprintf("round %d: permit held by the waiter", i))
			mustSettle(t, ctx, w, res.d.ID, []int64{1})
		} else {
			lost++
			if !errors.Is(res.err, ratelimit.ErrLimited) {
				t.Fatalf("round %d: Wait = %v, want ErrLimited", i, res.err)
			}
		}
		wantWaiters(t, ctx, holder, C, 0)
		wantRemaining(t, ctx, holder, C, conc(1), 1, 1, fmt.Sprintf("round %d: permit after the race", i))
	}
	t.Logf("admitted %d times, gave up %d times", won, lost)
}

// testAllowNoJump: Allow does not take capacity a queued waiter is waiting for.
func (s *suite) testAllowNoJump(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, w, other := s.client(t), s.client(t), s.client(t)
	A := newScope(t, "A")
	lim := tph(100)
	drain := mustAllow(t, ctx, c, one(A, lim, 80), "drain to 20")
	r := one(A, lim, 50)
	r.ID = newID("queued")
	ch := queue(t, ctx, w, r, "waiter for 50")
	for _, cl := range []*client{c, other} {
		d := mustDeny(t, ctx, cl, one(A, lim, 10), "10 tokens behind a waiter for 50")
		if d.DeniedBy != A {
			t.Fatalf("denied by %q, want %q", d.DeniedBy, A)
		}
	}
	notReturned(t, ch, "waiter")
	mustRefund(t, ctx, c, drain.ID)
	got := receive(t, ch, waitBound, "waiter after the refund")
	if rem := got.d.Limits[0].Remaining; rem < 50 || rem > 51 {
		t.Fatalf("Remaining after the waiter = %d, want 50 (the refused Allows took nothing)", rem)
	}
	mustAllow(t, ctx, c, one(A, lim, 10), "10 tokens once nobody waits")
}

// ---------------------------------------------------------------------------
// Provider feedback

// testCooldown: a cooldown holds back every charge on its scope on every
// replica, with RetryAfter the time left; a shorter one never shortens it,
// a longer one extends it; it ends on time. The cooldowns that must still
// be on when the test looks are seconds long, so that no stall of a busy
// machine between two steps outlasts them.
func (s *suite) testCooldown(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	a, b := s.client(t), s.client(t)
	S, other := newScope(t, "S"), newScope(t, "other")
	const first = 5 * time.Second
	start := s.now()
	left, err := a.Cooldown(ctx, S, first)
	if err != nil {
		t.Fatal(err)
	}
	wantDuration(t, left, first-tol, first, "Cooldown's time left")
	for _, tc := range []struct {
		name string
		ch   ratelimit.Charge
	}{
		{"requests", ratelimit.Charge{Scope: S, Limit: rpm(100)}},
		{"tokens", ratelimit.Charge{Scope: S, Limit: tpm(1000), Cost: 10}},
		{"permits", ratelimit.Charge{Scope: S, Limit: conc(5)}},
	} {
		req := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: other, Limit: rpm(100)}, tc.ch}}
		d := mustDeny(t, ctx, b, req, "cooling "+tc.name)
		if d.DeniedBy != S {
			t.Fatalf("%s: denied by %q, want %q", tc.name, d.DeniedBy, S)
		}
		wantDuration(t, d.RetryAfter, first-s.since(start)-tol, first+tol, tc.name+": RetryAfter in a cooldown")
	}
	wantRemaining(t, ctx, b, other, rpm(100), 100, 100, "the other scope of refused requests")

	// A shorter cooldown from another replica returns the longer one's rest.
	left, err = b.Cooldown(ctx, S, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	wantDuration(t, left, first-s.since(start)-tol, first+tol, "shorter Cooldown's answer")
	s.sleep(200 * time.Millisecond) // past the shorter one
	d := mustDeny(t, ctx, a, one(S, rpm(100), 1), "after the shorter cooldown would have ended")
	wantDuration(t, d.RetryAfter, first-s.since(start)-tol, first-200*time.Millisecond+tol, "RetryAfter after a shorter Cooldown")

	// A longer one extends it.
	const longer = 10 * time.Second
	extended := s.now()
	left, err = b.Cooldown(ctx, S, longer)
	if err != nil {
		t.Fatal(err)
	}
	wantDuration(t, left, longer-tol, longer, "longer Cooldown's answer")
	d = mustDeny(t, ctx, a, one(S, rpm(100), 1), "after the longer cooldown")
	wantDuration(t, d.RetryAfter, longer-s.since(extended)-tol, longer+tol, "RetryAfter after a longer Cooldown")

	// It ends on time.
	E := newScope(t, "E")
	if _, err := a.Cooldown(ctx, E, time.Second); err != nil {
		t.Fatal(err)
	}
	d = mustDeny(t, ctx, b, one(E, rpm(100), 1), "in a short cooldown")
	s.sleep(d.RetryAfter + 5*time.Millisecond)
	mustAllow(t, ctx, b, one(E, rpm(100), 1), "after the cooldown")
}

// testCooldownWakesWaiter: a waiter held back by a cooldown is admitted
// when it ends, without renewing first.
func (s *suite) testCooldownWakesWaiter(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	a, w := s.client(t), s.client(t)
	S := newScope(t, "S")
	const cd = 300 * time.Millisecond
	start := time.Now()
	if _, err := a.Cooldown(ctx, S, cd); err != nil {
		t.Fatal(err)
	}
	set := time.Now() // the cooldown ends between start+cd and set+cd
	r := one(S, rpm(100), 1)
	r.ID = newID("waiter")
	got := receive(t, queue(t, ctx, w, r, "waiter in a cooldown"), waitBound, "waiter in a cooldown")
	if early := start.Add(cd).Sub(got.at); early > 2*time.Millisecond {
		t.Fatalf("admitted %v before the cooldown ended", early)
	}
	late := got.at.Sub(set.Add(cd))
	t.Logf("admitted %v after the cooldown ended (hint %v)", late.Round(10*time.Microsecond), w.spy.hint(r.ID))
	if late > s.late {
		t.Fatalf("admitted %v after the cooldown ended, want within %v", late, s.late)
	}
}

// testObserve: what the provider says is left lowers the shared bucket
// (and RetryAfter follows), but never raises it.
func (s *suite) testObserve(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	a, b := s.client(t), s.client(t)
	S := newScope(t, "S")
	lim := tpm(1000) // 1 token per 60ms
	start := time.Now()
	if err := a.Observe(ctx, S, lim, 100); err != nil {
		t.Fatal(err)
	}
	wantRefilled(t, ctx, b, S, lim, lim, 100, start, "after Observe(100)")
	d := mustDeny(t, ctx, b, one(S, lim, 150), "150 tokens after Observe(100)")
	wantDuration(t, d.RetryAfter, 3*time.Second-time.Since(start)-tol, 3*time.Second+tol, "RetryAfter for 50 missing tokens")
	if err := b.Observe(ctx, S, lim, 900); err != nil {
		t.Fatal(err)
	}
	wantRefilled(t, ctx, a, S, lim, lim, 100, start, "after Observe(900): never raised")
	emptied := time.Now()
	if err := b.Observe(ctx, S, lim, -5); err != nil {
		t.Fatal(err)
	}
	d = mustDeny(t, ctx, a, one(S, lim, 1), "1 token after Observe(-5)")
	wantDuration(t, d.RetryAfter, 60*time.Millisecond-time.Since(emptied)-tol, 60*time.Millisecond+tol, "RetryAfter for 1 token after Observe(0)")

	R := newScope(t, "R")
	observed := time.Now()
	if err := a.Observe(ctx, R, rpm(60), 1); err != nil {
		t.Fatal(err)
	}
	mustAllow(t, ctx, b, one(R, rpm(60), 1), "the one request left")
	d = mustDeny(t, ctx, b, one(R, rpm(60), 1), "requests after Observe(1)")
	wantDuration(t, d.RetryAfter, time.Second-time.Since(observed)-tol, time.Second+tol, "RetryAfter after Observe(1) and one request")
	if err := a.Observe(ctx, R, conc(1), 0); !errors.Is(err, ratelimit.ErrInvalid) {
		t.Fatalf("Observe of a concurrency limit = %v, want ErrInvalid", err)
	}
}

// testLearn: a limit learned from the provider holds every replica's
// charges on that bucket to its rate and its bucket, starting from what the
// provider said was left; settles and refunds never raise the bucket above
// it; a charge costing more than the learned bucket waits for a full one;
// other kinds, windows and scopes keep their own limits; a later Learn
// replaces it, also with a higher limit.
func (s *suite) testLearn(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	a, b := s.client(t), s.client(t)
	S, T, other := newScope(t, "S"), newScope(t, "T"), newScope(t, "other")

	// Configured for 100 a second; the provider really allows 60 a minute
	// and has 2 left.
	lim := rpm(6000)
	start := time.Now()
	if err := a.Learn(ctx, S, lim, ratelimit.Learned{Limit: 60, Remaining: 2}); err != nil {
		t.Fatal(err)
	}
	wantRefilled(t, ctx, b, S, lim, rpm(60), 2, start, "on another replica after Learn(60, 2 left)")
	mustAllow(t, ctx, b, one(S, lim, 1), "first of the 2 left")
	mustAllow(t, ctx, b, one(S, lim, 1), "second of the 2 left")
	d := mustDeny(t, ctx, b, one(S, lim, 1), "a third request")
	wantDuration(t, d.RetryAfter, time.Second-time.Since(start)-tol, time.Second+tol, "RetryAfter at the learned rate (1/s, not 100/s)")
	if d.DeniedBy != S || d.DeniedKind != ratelimit.Requests {
		t.Fatalf("denied by %q %v, want %q requests", d.DeniedBy, d.DeniedKind, S)
	}
	// The same scope's other kinds and windows, and other scopes, keep
	// their own limits.
	wantRemaining(t, ctx, b, S, tpm(6000), 6000, 6000, "tokens of the scope")
	wantRemaining(t, ctx, b, S, rph(6000), 6000, 6000, "requests per hour of the scope")
	wantRemaining(t, ctx, b, other, lim, 6000, 6000, "another scope")

	// Remaining not told: a full bucket of the learned limit.
	tlim := tph(100_000) // hour windows: the learned 50 an hour refill nothing here
	if err := b.Learn(ctx, T, tlim, ratelimit.Learned{Limit: 50, Remaining: -1}); err != nil {
		t.Fatal(err)
	}
	wantRemaining(t, ctx, a, T, tlim, 50, 50, "after Learn(50, remaining not told)")
	d = mustAllow(t, ctx, a, one(T, tlim, 20), "20 of the 50")
	if got := d.Limits[0].Remaining; got != 30 {
		t.Fatalf("Remaining after 20 of a learned 50 = %d, want 30", got)
	}
	mustRefund(t, ctx, a, d.ID)
	wantRemaining(t, ctx, b, T, tlim, 50, 50, "after the refund: never above the learned bucket")
	// A charge of 80, more than the learned bucket of 50, is admitted
	// from a full one and takes its cost.
	mustAllow(t, ctx, b, one(T, tlim, 80), "80 tokens from a full learned bucket of 50")
	d = mustDeny(t, ctx, a, one(T, tlim, 1), "1 token after the 80")
	if d.RetryAfter < 30*time.Minute {
		t.Fatalf("RetryAfter %v for 31 tokens at 50 an hour, want about 37m", d.RetryAfter)
	}
	// A higher learned limit replaces it: the charge's own limit again
	// (the bucket is not raised; it refills at 100,000 an hour).
	if err := a.Learn(ctx, T, tlim, ratelimit.Learned{Limit: 1_000_000, Remaining: -1}); err != nil {
		t.Fatal(err)
	}
	d = mustDeny(t, ctx, b, one(T, tlim, 1), "1 token after a higher Learn")
	if most := time.Duration(float64(31*time.Hour)/100_000) + tol; d.RetryAfter > most {
		t.Fatalf("RetryAfter %v after a higher Learn, want at most %v (the charge's own rate)", d.RetryAfter, most)
	}
	wantRemaining(t, ctx, a, T, tph(100_000), 0, 0, "not raised by a higher Learn")
}

// testLearnExpires: a learned limit holds for its TTL; then the charge's
// own limit applies again.
func (s *suite) testLearnExpires(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	a, b := s.client(t), s.client(t)
	S := newScope(t, "S")
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 100, Window: time.Second} // one per 10ms
	const ttl = 300 * time.Millisecond
	before := s.now()
	if err := a.Learn(ctx, S, lim, ratelimit.Learned{Limit: 1, Remaining: 0, TTL: ttl}); err != nil { // one a second, none left
		t.Fatal(err)
	}
	learned := s.now()
	d := mustDeny(t, ctx, b, one(S, lim, 1), "while the learned limit holds")
	wantDuration(t, d.RetryAfter, time.Second-s.since(before)-tol, time.Second+tol, "RetryAfter at the learned rate")
	// Time itself is the subject: let the learned limit end, and 200ms
	// more at the charge's own rate (20 requests' worth).
	s.sleep(s.until(learned.Add(ttl + 200*time.Millisecond)))
	lo := refilled(lim, s.since(learned)-ttl)
	got := remaining(t, ctx, b, S, lim)
	// Under the learned limit, its bucket of 1 would be all there is.
	if hi := 2 + refilled(lim, s.since(before)-ttl); got < lo || got > hi {
		t.Fatalf("%d requests left %v after the learned limit ended, want between %d and %d (the charge's own rate)", got, ttl, lo, hi)
	}
}

// testLearnWaiter: a waiter on a bucket whose limit was learned is admitted
// when the learned rate has refilled its cost, not sooner, without renewing.
func (s *suite) testLearnWaiter(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	a, w := s.client(t), s.client(t)
	S := newScope(t, "S")
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 1000, Window: time.Second}
	start := time.Now()
	// The provider allows 4 a second (one per 250ms) and has none left.
	if err := a.Learn(ctx, S, lim, ratelimit.Learned{Limit: 4, Remaining: 0}); err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	r := one(S, lim, 1)
	r.ID = newID("waiter")
	got := receive(t, queue(t, ctx, w, r, "waiter on a learned bucket"), waitBound, "waiter on a learned bucket")
	const period = 250 * time.Millisecond
	if early := start.Add(period).Sub(got.at); early > 2*time.Millisecond {
		t.Fatalf("admitted %v before the learned rate had refilled one request", early)
	}
	if late := got.at.Sub(set.Add(period)); late > s.late {
		t.Fatalf("admitted %v after the learned rate refilled one request, want within %v", late, s.late)
	}
	mustDeny(t, ctx, a, one(S, lim, 1), "right after the waiter")
}

// ---------------------------------------------------------------------------
// Outages and validation

// testStoreOutage: with the store unreachable, fail-open requests are
// admitted as Degraded and counted; a request with any fail-closed limit is
// refused with ErrStoreUnavailable; the limiter recovers with the store.
func (s *suite) testStoreOutage(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	A, B := newScope(t, "A"), newScope(t, "B")
	open := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: A, Limit: rpm(10)}, {Scope: B, Limit: tpm(100), Cost: 10}}}
	closedLim := tpm(100)
	closedLim.FailClosed = true
	closed := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: A, Limit: rpm(10)}, {Scope: B, Limit: closedLim, Cost: 10}}}

	c.spy.down.Store(true)
	d, err := c.Allow(ctx, open)
	if err != nil || !d.Allowed || !d.Degraded || d.ID == "" {
		t.Fatalf("fail-open Allow in an outage = %+v, %v; want admitted, Degraded, with an ID", d, err)
	}
	if st := c.Stats(); st.StoreErrors != 1 || st.FailedOpen != 1 || st.FailedClosed != 0 {
		t.Fatalf("Stats after a fail-open outage = %+v", st)
	}
	d, err = c.Allow(ctx, closed)
	if !errors.Is(err, ratelimit.ErrStoreUnavailable) || d.Allowed || d.Degraded {
		t.Fatalf("fail-closed Allow in an outage = %+v, %v; want refused with ErrStoreUnavailable", d, err)
	}
	if !errors.Is(err, errDown) {
		t.Fatalf("fail-closed error %v does not wrap the store's error", err)
	}
	wctx, cancel := context.WithTimeout(ctx, waitBound)
	defer cancel()
	d, err = c.Wait(wctx, open)
	if err != nil || !d.Allowed || !d.Degraded {
		t.Fatalf("fail-open Wait in an outage = %+v, %v; want admitted, Degraded", d, err)
	}
	if _, err = c.Wait(wctx, closed); !errors.Is(err, ratelimit.ErrStoreUnavailable) {
		t.Fatalf("fail-closed Wait in an outage = %v, want ErrStoreUnavailable", err)
	}
	if st := c.Stats(); st.StoreErrors != 4 || st.FailedOpen != 2 || st.FailedClosed != 2 {
		t.Fatalf("Stats after the outage = %+v, want 4 store errors, 2 failed open, 2 failed closed", st)
	}
	if err := c.Settle(ctx, d.ID, []int64{1, 10}); err == nil {
		t.Fatalf("Settle in an outage = nil, want an error")
	}
	if err := c.Learn(ctx, A, rpm(10), ratelimit.Learned{Limit: 5, Remaining: 0}); !errors.Is(err, ratelimit.ErrStoreUnavailable) {
		t.Fatalf("Learn in an outage = %v, want ErrStoreUnavailable", err)
	}

	c.spy.down.Store(false)
	d = mustAllow(t, ctx, c, closed, "fail-closed request after the outage")
	mustSettle(t, ctx, c, d.ID, []int64{1, 10})
	wantRemaining(t, ctx, c, A, rpm(10), 9, 9, "A after the outage: degraded admissions were not recorded")
}

// testInvalid: malformed requests are refused with ErrInvalid before
// reaching the store.
func (s *suite) testInvalid(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	S := newScope(t, "S")
	ok := ratelimit.Charge{Scope: S, Limit: rpm(10)}
	for _, tc := range []struct {
		name string
		r    ratelimit.Request
	}{
		{"no charges", ratelimit.Request{}},
		{"no scope", ratelimit.Request{Charges: []ratelimit.Charge{{Limit: rpm(10)}}}},
		{"no kind", ratelimit.Request{Charges: []ratelimit.Charge{ok, {Scope: S, Limit: ratelimit.Limit{Limit: 10, Window: time.Minute}}}}},
		{"unknown kind", ratelimit.Request{Charges: []ratelimit.Charge{{Scope: S, Limit: ratelimit.Limit{Kind: 9, Limit: 10, Window: time.Minute}}}}},
		{"negative cost", ratelimit.Request{Charges: []ratelimit.Charge{{Scope: S, Limit: tpm(10), Cost: -1}}}},
		{"negative requests cost", ratelimit.Request{Charges: []ratelimit.Charge{{Scope: S, Limit: rpm(10), Cost: -1}}}},
		{"concurrency cost 2", ratelimit.Request{Charges: []ratelimit.Charge{{Scope: S, Limit: conc(5), Cost: 2}}}},
		{"no window", ratelimit.Request{Charges: []ratelimit.Charge{{Scope: S, Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: 10}}}}},
		{"negative window", ratelimit.Request{Charges: []ratelimit.Charge{{Scope: S, Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 10, Window: -time.Second}}}}},
		{"window below 1ms", ratelimit.Request{Charges: []ratelimit.Charge{{Scope: S, Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 10, Window: 500 * time.Microsecond}}}}},
		{"hold below 1ms", ratelimit.Request{Hold: 500 * time.Microsecond, Charges: []ratelimit.Charge{ok}}},
	} {
		if _, err := c.Allow(ctx, tc.r); !errors.Is(err, ratelimit.ErrInvalid) {
			t.Errorf("%s: Allow = %v, want ErrInvalid", tc.name, err)
		}
		if _, err := c.Wait(ctx, tc.r); !errors.Is(err, ratelimit.ErrInvalid) {
			t.Errorf("%s: Wait = %v, want ErrInvalid", tc.name, err)
		}
	}
	d := mustAllow(t, ctx, c, ratelimit.Request{Charges: []ratelimit.Charge{ok}}, "valid request")
	if err := c.Settle(ctx, d.ID, []int64{-1}); !errors.Is(err, ratelimit.ErrInvalid) {
		t.Errorf("Settle with a negative cost = %v, want ErrInvalid", err)
	}
	if err := c.Extend(ctx, d.ID, 500*time.Microsecond); !errors.Is(err, ratelimit.ErrInvalid) {
		t.Errorf("Extend below 1ms = %v, want ErrInvalid", err)
	}
	for _, cd := range []struct {
		scope string
		d     time.Duration
	}{{"", time.Second}, {S, 0}, {S, -time.Second}} {
		if _, err := c.Cooldown(ctx, cd.scope, cd.d); !errors.Is(err, ratelimit.ErrInvalid) {
			t.Errorf("Cooldown(%q, %v) = %v, want ErrInvalid", cd.scope, cd.d, err)
		}
	}
	if err := c.Observe(ctx, "", rpm(10), 1); !errors.Is(err, ratelimit.ErrInvalid) {
		t.Errorf("Observe with no scope = %v, want ErrInvalid", err)
	}
	if err := c.Observe(ctx, S, ratelimit.Limit{Kind: ratelimit.Requests, Limit: 10}, 1); !errors.Is(err, ratelimit.ErrInvalid) {
		t.Errorf("Observe with no window = %v, want ErrInvalid", err)
	}
	for _, tc := range []struct {
		name  string
		scope string
		lim   ratelimit.Limit
		x     ratelimit.Learned
	}{
		{"no scope", "", rpm(10), ratelimit.Learned{Limit: 5}},
		{"concurrency", S, conc(10), ratelimit.Learned{Limit: 5}},
		{"no window", S, ratelimit.Limit{Kind: ratelimit.Requests, Limit: 10}, ratelimit.Learned{Limit: 5}},
		{"learned 0", S, rpm(10), ratelimit.Learned{Limit: 0}},
		{"learned negative", S, rpm(10), ratelimit.Learned{Limit: -5}},
		{"learned above MaxAmount", S, rpm(10), ratelimit.Learned{Limit: ratelimit.MaxAmount + 1}},
		{"TTL below 1ms", S, rpm(10), ratelimit.Learned{Limit: 5, TTL: 500 * time.Microsecond}},
		{"negative TTL", S, rpm(10), ratelimit.Learned{Limit: 5, TTL: -time.Second}},
	} {
		if err := c.Learn(ctx, tc.scope, tc.lim, tc.x); !errors.Is(err, ratelimit.ErrInvalid) {
			t.Errorf("Learn with %s = %v, want ErrInvalid", tc.name, err)
		}
	}
	// Nothing invalid reached the store.
	if st := c.Stats(); st.StoreErrors != 0 {
		t.Errorf("Stats = %+v after invalid requests", st)
	}
	wantRemaining(t, ctx, c, S, rpm(10), 9, 9, "after invalid requests")
	mustRefund(t, ctx, c, d.ID)
}

// testWaitDefers: with a bucket of one, a waiter may be admitted up to
// MaxDefer before its token exists and starts exactly when it does, so the
// latency of waking it costs no capacity: a run of Waits keeps the exact
// rate. Allow is never deferred, nothing is admitted beyond the bucket, and
// a waiter whose context ends while it holds off is refunded.
func (s *suite) testWaitDefers(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := s.client(t)
	// A is the scope; each attempt below takes a new one.
	var A string
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 40, Window: time.Second, Burst: 1} // one per 25ms
	period := rateP(lim)
	if period > ratelimit.MaxDefer {
		t.Fatalf("test limit refills every %v, beyond MaxDefer %v", period, ratelimit.MaxDefer)
	}

	// Empty the bucket. If the machine stalls for a period between the two
	// Allows, the second legitimately finds a new token: start again.
	var took time.Time
	var d ratelimit.Decision
	for attempt := 1; ; attempt++ {
		A = newScope(t, "A")
		took = time.Now()
		mustAllow(t, ctx, c, one(A, lim, 1), "the one token")
		var err error
		if d, err = c.Allow(ctx, one(A, lim, 1)); err != nil {
			t.Fatalf("Allow with the bucket empty: %v", err)
		}
		if !d.Allowed {
			break
		}
		if since := time.Since(took); since < period-3*time.Millisecond {
			t.Fatalf("Allow with the bucket empty admitted %v after the only token was taken (one per %v)", since, period)
		}
		if attempt == 5 {
			t.Fatalf("the machine stalled for a period between two Allows %d times in a row", attempt)
		}
	}
	if d.Delay != 0 || d.RetryAfter <= 0 || d.RetryAfter > period {
		t.Fatalf("refused Allow: Delay %v, RetryAfter %v; want no delay and a retry within %v", d.Delay, d.RetryAfter, period)
	}
	// The next token is less than MaxDefer away: Wait is admitted at once,
	// told to hold off, and returns when the token exists.
	if w, err := c.Wait(ctx, one(A, lim, 1)); err != nil || !w.Allowed {
		t.Fatalf("Wait = %+v, %v", w, err)
	}
	if back := time.Since(took); back < period-3*time.Millisecond {
		t.Fatalf("Wait returned %v after the bucket was emptied, before its token existed (one per %v)", back, period)
	}
	// Nothing beyond the bucket: the bucket was full (one token) no earlier
	// than took and gains one per period, and two were taken. A third may
	// be admitted only if the machine stalled here for a period.
	if d, err := c.Allow(ctx, one(A, lim, 1)); err != nil {
		t.Fatalf("Allow right after the deferred admission: %v", err)
	} else if d.Allowed {
		if since := time.Since(took); since < 2*period-3*time.Millisecond {
			t.Fatalf("Allow right after the deferred admission was admitted %v after the bucket was emptied: 3 admissions when at most %d tokens existed", since, 1+int(since/period))
		}
		t.Logf("Allow right after the deferred admission was admitted: the machine stalled for %v, a token had accrued", time.Since(took))
	}

	// A run of Waits keeps the rate: n admissions take about n periods.
	// The only capacity they may lose is what the machine's stalls cost,
	// measured around each store call: the time a call spent in the store,
	// and the time by which the next call came later than the token after
	// the one this call was given (deferral absorbs anything less). A Wait
	// that may have reached the store after its token existed (it returned
	// more than a period after the previous one could have been given its
	// token) came late and need not be deferred.
	const n = 20
	runStart := time.Now()
	deferred, late := 0, 0
	var excused time.Duration
	var prev span
	var prevDelay time.Duration
	for i := range n {
		r := one(A, lim, 1)
		r.ID = newID(fmt.Sprintf("w%d", i))
		w, err := c.Wait(ctx, r)
		if err != nil || !w.Allowed {
			t.Fatalf("wait %d: %+v, %v", i, w, err)
		}
		if w.Delay > 0 {
			deferred++
		}
		sp := c.spy.span(r.ID)
		excused += sp.end.Sub(sp.start)
		if i == 0 || sp.end.Sub(prev.start)-prevDelay > period {
			late++
		}
		if i > 0 {
			if stall := sp.start.Sub(prev.end) - prevDelay - period; stall > 0 {
				excused += stall
			}
		}
		prev, prevDelay = sp, w.Delay
	}
	run := time.Since(runStart)
	if deferred < (n-late)/2 {
		t.Fatalf("only %d of %d Waits (%d of them came late) were admitted ahead of their token; the rest paid the wake-up latency", deferred, n, late)
	}
	if least := time.Duration(n-1) * period; run < least-5*time.Millisecond {
		t.Fatalf("%d Waits took %v: faster than one per %v, over the limit", n, run, period)
	}
	if most := time.Duration(n+1)*period + excused + 200*time.Millisecond; run > most {
		t.Fatalf("%d Waits took %v, want about %v plus the %v the machine's stalls cost: wake-up latency wastes capacity", n, run, time.Duration(n)*period, excused)
	}
	t.Logf("%d Waits at one per %v took %v", n, period, run)

	// A waiter cancelled while it holds off gives its token back. The
	// bucket is emptied first, so that the Wait holds off for up to a
	// period; on a loaded machine its token may still come before the
	// cancel does, and then the attempt is made again.
	for attempt := 1; ; attempt++ {
		for {
			d, err := c.Allow(ctx, one(A, lim, 1))
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				break
			}
		}
		cctx, cancel := context.WithCancel(ctx)
		stop := time.AfterFunc(period/3, cancel)
		w, err := c.Wait(cctx, one(A, lim, 1))
		stop.Stop()
		cancel()
		if err == nil && attempt < 5 {
			continue // admitted before the cancel came
		}
		if !errors.Is(err, ratelimit.ErrLimited) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait cancelled while holding off = %+v, %v; want ErrLimited and Canceled (attempt %d)", w, err, attempt)
		}
		break
	}
	time.Sleep(period + 5*time.Millisecond) // let the token accrue: time itself is the subject
	mustAllow(t, ctx, c, one(A, lim, 1), "Allow after the cancelled waiter's refund")
}

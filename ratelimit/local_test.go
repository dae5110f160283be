package ratelimit_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/memory"
)

// countingBackend counts the store calls a Limiter makes.
type countingBackend struct {
	ratelimit.Backend
	admits, settles atomic.Int64
	onSettle        func() // called after each Settle, if set before use
}

func (c *countingBackend) Admit(ctx context.Context, r *ratelimit.Request) (ratelimit.Decision, error) {
	c.admits.Add(1)
	return c.Backend.Admit(ctx, r)
}

func (c *countingBackend) Settle(ctx context.Context, id string, actual []int64) error {
	c.settles.Add(1)
	err := c.Backend.Settle(ctx, id, actual)
	if c.onSettle != nil {
		c.onSettle()
	}
	return err
}

const scopeDep = "deployment:key1/gpt-4.1"

// window is long enough that the limits in these tests refill less than
// one unit while they run: what the store has left shows what was charged.
const window = 1000 * time.Hour

// gatewayLike is a request's charges as the gateway makes them: requests
// and tokens of the deployment, requests of the tenant.
func gatewayLike(requests, tokens, cost int64) ratelimit.Request {
	return ratelimit.Request{Charges: []ratelimit.Charge{
		{Scope: scopeDep, Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: requests, Window: window}},
		{Scope: scopeDep, Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: tokens, Window: window}, Cost: cost},
		{Scope: "tenant:a", Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: requests, Window: window}},
	}}
}

func newLocal(t *testing.T, q ratelimit.LocalQuota) (*ratelimit.Limiter, *countingBackend, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b := &countingBackend{Backend: memory.New(clk)}
	l := ratelimit.New(b, ratelimit.WithLocalQuota(q), ratelimit.WithClock(clk))
	t.Cleanup(func() {
		if err := l.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l, b, clk
}

// probe reads the store's remaining on every limit, before the probe's own
// charge, with a request that cannot come from a block (it has its own ID).
// A refused probe reads the limits as they are.
func probe(t *testing.T, l *ratelimit.Limiter, req ratelimit.Request, id string) []int64 {
	t.Helper()
	req.ID = id
	for i := range req.Charges {
		req.Charges[i].Cost = 0
	}
	d, err := l.Allow(context.Background(), req)
	if err != nil || len(d.Limits) != len(req.Charges) {
		t.Fatalf("probe: %+v, %v", d, err)
	}
	if d.Allowed {
		if err := l.Refund(context.Background(), d.ID); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]int64, len(d.Limits))
	for i, s := range d.Limits {
		out[i] = s.Remaining
		if s.Kind == ratelimit.Requests && d.Allowed {
			out[i]++ // the probe counted as one request
		}
	}
	return out
}

// TestLocalQuotaSettlesExactly: a thousand requests, each settled with less
// than its estimate, make a few dozen store calls, and once their blocks
// are back the store holds exactly what per-request settles would leave.
func TestLocalQuotaSettlesExactly(t *testing.T) {
	ctx := context.Background()
	l, b, clk := newLocal(t, ratelimit.LocalQuota{})
	const n, est, used = 1000, 100, 37
	for i := range n {
		d, err := l.Allow(ctx, gatewayLike(1_000_000, 1_000_000_000, est))
		if err != nil || !d.Allowed {
			t.Fatalf("request %d: %+v, %v", i, d, err)
		}
		if len(d.Limits) != 3 || d.Limits[1].Remaining <= 0 {
			t.Fatalf("request %d: limits %+v", i, d.Limits)
		}
		if err := l.Settle(ctx, d.ID, []int64{1, used, 1}); err != nil {
			t.Fatalf("settle %d: %v", i, err)
		}
		if i%100 == 99 {
			clk.Advance(ratelimit.DefaultLocalWindow / 2) // some blocks end by time
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	if st.Admitted != n || st.Local < n*9/10 {
		t.Errorf("stats %+v: want %d admitted, most of them locally", st, n)
	}
	if a := b.admits.Load(); a > n/10 {
		t.Errorf("%d store admissions for %d requests", a, n)
	}
	// 500 ms passed: the tokens refilled 138, the requests less than one.
	got := probe(t, l, gatewayLike(1_000_000, 1_000_000_000, 0), "probe")
	want := []int64{1_000_000 - n, 1_000_000_000 - n*used + 138, 1_000_000 - n}
	for i := range want {
		if got[i] < want[i]-1 || got[i] > want[i]+1 {
			t.Errorf("limit %d: store has %d left, want %d", i, got[i], want[i])
		}
	}
}

// TestLocalQuotaNeverExceeds: concurrent requests that are never settled
// get exactly the limits' capacity, no more, blocks or not.
func TestLocalQuotaNeverExceeds(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLocal(t, ratelimit.LocalQuota{})
	const rpm, tokens = 2000, 7
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 1000 {
				d, err := l.Allow(ctx, gatewayLike(rpm, rpm*tokens, tokens))
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					return
				}
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != rpm {
		t.Errorf("admitted %d, want exactly %d (the clock stood still)", got, rpm)
	}
	if st := l.Stats(); st.Local == 0 {
		t.Errorf("no local admissions: %+v", st)
	}
}

// TestLocalQuotaReturnsUnusedAtWindowEnd: a block's unused part goes back
// to the store when its window ends, so another replica can use it.
func TestLocalQuotaReturnsUnusedAtWindowEnd(t *testing.T) {
	ctx := context.Background()
	l, b, clk := newLocal(t, ratelimit.LocalQuota{Window: time.Second})
	returned := make(chan struct{}, 100)
	b.onSettle = func() { returned <- struct{}{} }
	req := gatewayLike(1000, 1_000_000, 10)
	var ids []string
	for range 10 { // two to start blocks, then blocks
		d, err := l.Allow(ctx, req)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		ids = append(ids, d.ID)
	}
	if l.Stats().Local == 0 {
		t.Fatal("no block was taken")
	}
	for _, id := range ids {
		if err := l.Settle(ctx, id, []int64{1, 10, 1}); err != nil {
			t.Fatal(err)
		}
	}
	for len(returned) > 0 { // blocks that went back when their last request settled
		<-returned
	}
	clk.Advance(time.Second) // window over: the last block goes back
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("no block went back to the store after its window")
	}
	if got := probe(t, l, req, "probe"); got[0] != 990 || got[1] != 1_000_000-100 || got[2] != 990 {
		t.Errorf("store has %v left, want [990 999900 990]", got)
	}
}

// TestLocalQuotaRetiredByCooldown: after a Cooldown on a scope, no block
// admits on it; the store's cooldown refuses.
func TestLocalQuotaRetiredByCooldown(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLocal(t, ratelimit.LocalQuota{})
	req := gatewayLike(100_000, 100_000_000, 10)
	for range 20 {
		if d, err := l.Allow(ctx, req); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	if l.Stats().Local == 0 {
		t.Fatal("no block was taken")
	}
	if _, err := l.Cooldown(ctx, scopeDep, time.Minute); err != nil {
		t.Fatal(err)
	}
	d, err := l.Allow(ctx, req)
	if err != nil || d.Allowed || d.DeniedBy != scopeDep {
		t.Fatalf("after cooldown: %+v, %v; want denied by %s", d, err, scopeDep)
	}
}

// TestLocalQuotaRetiredByLearn: after a Learn on a scope, no block admits
// on it, and the blocks reserved before it, also those whose requests are
// still running, give nothing of the learned bucket back when they return
// (the provider's count said what is left), while the other limits they
// charged get their unused part back as usual.
func TestLocalQuotaRetiredByLearn(t *testing.T) {
	ctx := context.Background()
	l, _, _ := newLocal(t, ratelimit.LocalQuota{})
	req := gatewayLike(100_000, 100_000_000, 10)
	var ids []string
	for range 20 {
		d, err := l.Allow(ctx, req)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		ids = append(ids, d.ID)
	}
	if l.Stats().Local == 0 {
		t.Fatal("no block was taken")
	}
	if err := l.Learn(ctx, scopeDep, req.Charges[0].Limit, ratelimit.Learned{Limit: 50, Remaining: 0}); err != nil {
		t.Fatal(err)
	}
	d, err := l.Allow(ctx, req)
	if err != nil || d.Allowed || d.DeniedBy != scopeDep || d.DeniedKind != ratelimit.Requests {
		t.Fatalf("after Learn: %+v, %v; want denied by %s requests", d, err, scopeDep)
	}
	for _, id := range ids {
		if err := l.Settle(ctx, id, []int64{1, 10, 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := probe(t, l, req, "probe"); got[0] != 0 || got[1] != 100_000_000-200 || got[2] != 100_000-20 {
		t.Errorf("store has %v left, want [0 %d %d]: nothing back on the learned bucket, the rest exact", got, 100_000_000-200, 100_000-20)
	}
}

// TestLocalQuotaIDs: settling a local reservation twice is a no-op, also
// after its block went back; Extend works until it is settled; requests
// with their own ID or a concurrency charge always go to the store.
func TestLocalQuotaIDs(t *testing.T) {
	ctx := context.Background()
	l, b, _ := newLocal(t, ratelimit.LocalQuota{})
	req := gatewayLike(100_000, 100_000_000, 10)
	var local []ratelimit.Decision
	for range 10 {
		d, err := l.Allow(ctx, req)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		local = append(local, d)
	}
	d := local[len(local)-1]
	if l.Stats().Local == 0 {
		t.Fatal("no block was taken")
	}
	if err := l.Extend(ctx, d.ID, time.Minute); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	for range 2 {
		if err := l.Settle(ctx, d.ID, []int64{1, 5, 1}); err != nil {
			t.Fatalf("Settle: %v", err)
		}
	}
	if err := l.Extend(ctx, d.ID, time.Minute); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Extend after Settle: %v", err)
	}
	for _, d := range local {
		if err := l.Refund(ctx, d.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Settle(ctx, d.ID, []int64{1, 5, 1}); err != nil {
		t.Fatalf("Settle after the block went back: %v", err)
	}

	before := l.Stats().Local
	admits := b.admits.Load()
	own := req
	own.ID = "mine"
	if d, err := l.Allow(ctx, own); err != nil || !d.Allowed || d.ID != "mine" {
		t.Fatalf("own ID: %+v, %v", d, err)
	}
	conc := req
	conc.Charges = append(append([]ratelimit.Charge(nil), req.Charges...),
		ratelimit.Charge{Scope: scopeDep, Limit: ratelimit.Limit{Kind: ratelimit.Concurrency, Limit: 100}})
	for range 5 {
		if d, err := l.Allow(ctx, conc); err != nil || !d.Allowed {
			t.Fatalf("concurrency: %+v, %v", d, err)
		}
	}
	if got := l.Stats().Local; got != before {
		t.Errorf("%d local admissions for requests that must go to the store", got-before)
	}
	if got := b.admits.Load() - admits; got != 6 {
		t.Errorf("%d store admissions, want 6", got)
	}
}

// TestLocalQuotaStaysOffNearALimit: with less than Headroom blocks' worth
// left, every request is decided by the store.
func TestLocalQuotaStaysOffNearALimit(t *testing.T) {
	ctx := context.Background()
	l, b, _ := newLocal(t, ratelimit.LocalQuota{Headroom: 8})
	req := gatewayLike(15, 1_000_000, 1) // 15 left: a block of 2 needs 16
	for range 15 {
		if d, err := l.Allow(ctx, req); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	if got := l.Stats().Local; got != 0 {
		t.Errorf("%d local admissions near the limit", got)
	}
	if got := b.admits.Load(); got != 15 {
		t.Errorf("%d store admissions, want 15", got)
	}
}

// TestLocalQuotaUnsettledGoesBackAfterHold: requests that are never
// settled count at their estimates once their hold is over, as in the
// store, and the unused part of their block comes back then.
func TestLocalQuotaUnsettledGoesBackAfterHold(t *testing.T) {
	ctx := context.Background()
	l, _, clk := newLocal(t, ratelimit.LocalQuota{Window: time.Second})
	req := gatewayLike(1000, 1_000_000, 10)
	req.Hold = time.Minute
	const n = 10
	for range n {
		if d, err := l.Allow(ctx, req); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	if l.Stats().Local == 0 {
		t.Fatal("no block was taken")
	}
	clk.Advance(time.Second) // the window ends; its requests are still running
	if got := probe(t, l, req, "probe-1"); got[0] >= 1000-n {
		t.Fatalf("store has %v left with %d requests unsettled: the blocks went back too early", got, n)
	}
	clk.Advance(time.Minute)             // their hold is over: the blocks go back
	if err := l.Close(ctx); err != nil { // waits for blocks going back
		t.Fatal(err)
	}
	// 61s refilled 16.9 tokens and no request.
	if got := probe(t, l, req, "probe-2"); got[0] != 1000-n || got[1] < 1_000_000-n*10+16 || got[1] > 1_000_000-n*10+17 {
		t.Errorf("store has %v left, want %d requests and %d tokens: the estimates of the %d unsettled requests, no more",
			got, 1000-n, 1_000_000-n*10+16, n)
	}
}

// TestLocalQuotaConcurrentMix: many goroutines admit, settle, refund and
// extend at random while blocks end every few milliseconds and cooldowns
// retire them; the limits are never exceeded, and once everything is
// settled and the blocks are back, the store holds exactly what the
// settles say.
func TestLocalQuotaConcurrentMix(t *testing.T) {
	ctx := context.Background()
	b := memory.New(nil)
	l := ratelimit.New(b, ratelimit.WithLocalQuota(ratelimit.LocalQuota{Window: 5 * time.Millisecond, MaxBlock: 16}))
	const limit, tokenLimit = 3000, 1_500_000 // tokens bind first (700 each)
	req := func() ratelimit.Request { return gatewayLike(limit, tokenLimit, 700) }
	var (
		admitted, refunded, tokens atomic.Int64
		inUse                      atomic.Int64 // admitted and not refunded
		tokensHeld                 atomic.Int64 // estimates of the unsettled, actuals of the settled
		wg                         sync.WaitGroup
	)
	for g := range 16 {
		wg.Go(func() {
			for i := range 400 {
				var d ratelimit.Decision
				var err error
				if (g+i)%5 == 0 {
					wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
					d, err = l.Wait(wctx, req())
					cancel()
					if errors.Is(err, ratelimit.ErrLimited) {
						continue
					}
				} else {
					d, err = l.Allow(ctx, req())
				}
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					continue
				}
				admitted.Add(1)
				if n := inUse.Add(1); n > limit {
					t.Errorf("%d requests hold the limit of %d", n, limit)
				}
				if n := tokensHeld.Add(700); n > tokenLimit {
					t.Errorf("%d tokens held, over the limit of %d", n, tokenLimit)
				}
				switch i % 7 {
				case 0:
					inUse.Add(-1) // before the capacity can go back
					tokensHeld.Add(-700)
					if err := l.Refund(ctx, d.ID); err != nil {
						t.Error(err)
					}
					refunded.Add(1)
					continue
				case 1:
					if err := l.Extend(ctx, d.ID, time.Minute); err != nil {
						t.Error(err)
					}
				}
				used := int64(i % 700)     // at most the estimate: more is the caller's overshoot, not the limiter's
				tokensHeld.Add(used - 700) // before the capacity can go back
				if err := l.Settle(ctx, d.ID, []int64{1, used, 1}); err != nil {
					t.Error(err)
				}
				tokens.Add(used)
			}
		})
	}
	wg.Go(func() {
		for range 5 {
			if _, err := l.Cooldown(ctx, "tenant:other", time.Millisecond); err != nil {
				t.Error(err)
			}
			_, _ = l.Cooldown(ctx, scopeDep, time.Microsecond) // retires the blocks on it
			time.Sleep(3 * time.Millisecond)                   // spread over the run, not synchronisation
		}
	})
	wg.Wait()
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if l.Stats().Local == 0 {
		t.Error("no request was admitted from a block")
	}
	got := probe(t, l, req(), "probe")
	n := admitted.Load() - refunded.Load()
	// The window is long: refill is under one request and a few tokens.
	want := []int64{limit - n, tokenLimit - tokens.Load(), limit - n}
	for i := range want {
		if got[i] < want[i] || got[i] > want[i]+2 {
			t.Errorf("limit %d: store has %d left, want %d (admitted %d, refunded %d)", i, got[i], want[i], admitted.Load(), refunded.Load())
		}
	}
}

// TestSettleNow: SettleNow settles on the spot what needs no store call (a
// request from a block still in use), exactly as Settle would; it leaves a
// request whose block must go back, and one the store holds, to Settle.
func TestSettleNow(t *testing.T) {
	ctx := context.Background()
	l, _, clk := newLocal(t, ratelimit.LocalQuota{})
	const n, est, used = 200, 100, 37
	now, later := 0, 0
	for i := range n {
		d, err := l.Allow(ctx, gatewayLike(1_000_000, 1_000_000_000, est))
		if err != nil || !d.Allowed {
			t.Fatalf("request %d: %+v, %v", i, d, err)
		}
		if i%50 == 49 {
			clk.Advance(ratelimit.DefaultLocalWindow) // this request's block has ended
		}
		done, err := l.SettleNow(d.ID, []int64{1, used, 1})
		if err != nil {
			t.Fatalf("SettleNow %d: %v", i, err)
		}
		if done {
			now++
			if again, err := l.SettleNow(d.ID, []int64{1, 0, 1}); !again || err != nil {
				t.Fatalf("a second SettleNow of %d: %v, %v; want a no-op", i, again, err)
			}
			continue
		}
		later++
		if err := l.Settle(ctx, d.ID, []int64{1, used, 1}); err != nil {
			t.Fatalf("settle %d: %v", i, err)
		}
	}
	if now < n*9/10 || later == 0 {
		t.Errorf("%d settled now and %d by Settle, want most now and those of ended blocks later", now, later)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The tokens refilled while the clock moved; the requests less than one.
	refill := int64(1_000_000_000 * (n / 50 * ratelimit.DefaultLocalWindow) / window)
	got := probe(t, l, gatewayLike(1_000_000, 1_000_000_000, 0), "probe")
	want := []int64{1_000_000 - n, 1_000_000_000 - n*used + refill, 1_000_000 - n}
	for i := range want {
		if got[i] < want[i]-1 || got[i] > want[i]+1 {
			t.Errorf("limit %d: store has %d left, want %d", i, got[i], want[i])
		}
	}

	// Without blocks: the store's own reservation. The memory backend is
	// in this process, so SettleNow settles it; behind a wrapper that is
	// not an InProcessBackend it is left to Settle.
	for _, tc := range []struct {
		name    string
		backend ratelimit.Backend
		now     bool
	}{
		{"in process", memory.New(clk), true},
		{"store", &countingBackend{Backend: memory.New(clk)}, false},
	} {
		l := ratelimit.New(tc.backend, ratelimit.WithClock(clk))
		d, err := l.Allow(ctx, gatewayLike(10, 1000, est))
		if err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", tc.name, d, err)
		}
		done, err := l.SettleNow(d.ID, []int64{1, used, 1})
		if done != tc.now || err != nil {
			t.Errorf("%s: SettleNow = %v, %v; want %v", tc.name, done, err, tc.now)
		}
		if !done {
			if err := l.Settle(ctx, d.ID, []int64{1, used, 1}); err != nil {
				t.Fatal(err)
			}
		}
		if got := probe(t, l, gatewayLike(10, 1000, 0), "probe-"+tc.name); got[1] != 1000-used {
			t.Errorf("%s: %d tokens left, want %d", tc.name, got[1], 1000-used)
		}
		_ = l.Close(ctx)
	}
}

// TestPeek: Peek reports what the store has left, other replicas' use
// included, charges nothing and is not counted; a request admitted from a
// local block shows in it once the block is taken from the store.
func TestPeek(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := memory.New(clk)
	a := ratelimit.New(store, ratelimit.WithClock(clk))
	b := ratelimit.New(store, ratelimit.WithClock(clk))
	req := gatewayLike(100, 10_000, 40)
	for range 3 {
		d, err := b.Allow(ctx, req)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	req.Charges = append(req.Charges, ratelimit.Charge{Scope: scopeDep, Limit: ratelimit.Limit{Kind: ratelimit.Concurrency, Limit: 1}, Cost: 1})
	for range 2 {
		st, err := a.Peek(ctx, req.Charges)
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 3 || st[0].Remaining != 97 || st[1].Remaining != 10_000-120 || st[2].Remaining != 97 {
			t.Fatalf("Peek = %+v; want 97 requests and 9880 tokens left (the concurrency limit left out)", st)
		}
	}
	if s := a.Stats(); s.Admitted != 0 || s.Denied != 0 {
		t.Errorf("peeks counted in Stats: %+v", s)
	}
}

// TestLocalQuotaOverGroups: over a Sharded backend, a block for requests
// that span two groups is taken in both; exactly the limit is admitted,
// and once every request is settled each group has exactly what the
// requests really used charged.
func TestLocalQuotaOverGroups(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	groups := map[string]*countingBackend{"dep": {Backend: memory.New(clk)}, "tenant": {Backend: memory.New(clk)}}
	groupOf := func(scope string) string {
		if strings.HasPrefix(scope, "tenant:") {
			return "tenant"
		}
		return "dep"
	}
	sh := ratelimit.NewSharded(groupOf, func(g string) ratelimit.Backend { return groups[g] })
	l := ratelimit.New(sh, ratelimit.WithLocalQuota(ratelimit.LocalQuota{}), ratelimit.WithClock(clk))
	const rpm, tokens, used = 2000, 7, 3
	var (
		mu  sync.Mutex
		ids []string
		wg  sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for range 1000 {
				d, err := l.Allow(ctx, gatewayLike(rpm, rpm*tokens, tokens))
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					return
				}
				mu.Lock()
				ids = append(ids, d.ID)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Two requests racing for the last units may each take a part the
	// other needs, and both be refused: what is left is then admitted one
	// at a time. Never more than the limit, and nothing lost.
	for len(ids) < rpm+1 {
		d, err := l.Allow(ctx, gatewayLike(rpm, rpm*tokens, tokens))
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		ids = append(ids, d.ID)
	}
	if len(ids) != rpm {
		t.Fatalf("admitted %d, want exactly %d (the clock stood still)", len(ids), rpm)
	}
	if st := l.Stats(); st.Local == 0 {
		t.Fatalf("no local admissions: %+v", st)
	}
	if a, b := groups["dep"].admits.Load(), groups["tenant"].admits.Load(); a == 0 || a != b {
		t.Fatalf("%d store decisions in the deployment's group and %d in the tenant's, want as many, some", a, b)
	}
	for _, id := range ids {
		if err := l.Settle(ctx, id, []int64{1, used, 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := l.Peek(ctx, gatewayLike(rpm, rpm*tokens, tokens).Charges)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := []int64{st[0].Remaining, st[1].Remaining, st[2].Remaining}, []int64{0, rpm * (tokens - used), 0}; !slices.Equal(got, want) {
		t.Fatalf("left in the store after every settle: %v, want %v", got, want)
	}
}

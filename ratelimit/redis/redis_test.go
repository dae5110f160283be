package redis_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/ratelimittest"
	"github.com/llmgate/llmgate/ratelimit/redis"
)

// base is the key base of the default prefix and group: every key of the
// limiter starts with it (see lib.lua).
const base = redis.DefaultPrefix + "{" + redis.DefaultGroup + "}"

// laneKey is the zset of a lane's waiters.
func laneKey(lane string) string { return base + ":q:" + lane }

// inspected is the Redis backend with a lane inspector reading the lane's
// zset through the raw client, for the conformance suite.
type inspected struct {
	*redis.Backend
	c rueidis.Client
}

var _ ratelimittest.Inspector = inspected{}

func (b inspected) Waiters(ctx context.Context, lane string) (int, error) {
	n, err := b.c.Do(ctx, b.c.B().Zcard().Key(laneKey(lane)).Build()).AsInt64()
	return int(n), err
}

func TestConformance(t *testing.T) {
	r := testutil.StartRedis(t)
	ratelimittest.Run(t, func(t *testing.T) ratelimit.Backend {
		c := r.Client(t)
		return inspected{Backend: redis.New(c, redis.Config{}), c: c}
	})
}

// TestConformanceSharded runs the cross-group cases on one server, each
// group under its own hash tag.
func TestConformanceSharded(t *testing.T) {
	r := testutil.StartRedis(t)
	ratelimittest.RunSharded(t, func(t *testing.T, g string) ratelimit.Backend {
		c := r.Client(t)
		return inspectedGroup{Backend: redis.New(c, redis.Config{Group: g}), c: c, group: g}
	})
}

// ---------------------------------------------------------------------------
// Helpers

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func randHex() string { return strconv.FormatUint(rand.Uint64(), 16) }

func newScope(t *testing.T, name string) string {
	return "redistest/" + strings.ReplaceAll(t.Name(), "/", ".") + "/" + randHex() + "/" + name
}

// newLimiter returns a Limiter on its own client: a separate replica.
func newLimiter(t *testing.T, r *testutil.Redis, opts ...ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	return ratelimit.New(redis.New(r.Client(t), redis.Config{}), opts...)
}

func rpm(n int64) ratelimit.Limit {
	return ratelimit.Limit{Kind: ratelimit.Requests, Limit: n, Window: time.Minute}
}

func conc(n int64) ratelimit.Limit { return ratelimit.Limit{Kind: ratelimit.Concurrency, Limit: n} }

func one(scope string, l ratelimit.Limit, cost int64) ratelimit.Request {
	return ratelimit.Request{Charges: []ratelimit.Charge{{Scope: scope, Limit: l, Cost: cost}}}
}

func mustAllow(t *testing.T, ctx context.Context, l *ratelimit.Limiter, r ratelimit.Request, what string) ratelimit.Decision {
	t.Helper()
	d, err := l.Allow(ctx, r)
	if err != nil || !d.Allowed {
		t.Fatalf("%s: Allow = %+v, %v; want admitted", what, d, err)
	}
	return d
}

func mustDeny(t *testing.T, ctx context.Context, l *ratelimit.Limiter, r ratelimit.Request, what string) ratelimit.Decision {
	t.Helper()
	d, err := l.Allow(ctx, r)
	if err != nil || d.Allowed {
		t.Fatalf("%s: Allow = %+v, %v; want refused", what, d, err)
	}
	return d
}

// waitLane polls Redis until lane has n waiters.
func waitLane(t *testing.T, r *testutil.Redis, lane string, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := r.Int(t, "ZCARD", laneKey(lane))
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ZCARD %s = %d after 10s, want %d", laneKey(lane), got, n)
		}
		time.Sleep(time.Millisecond) // polling an external observable: nothing to select on
	}
}

// keys lists the keys matching pattern.
func keys(t *testing.T, c rueidis.Client, pattern string) []string {
	t.Helper()
	var out []string
	cursor := uint64(0)
	for range 10_000 {
		e, err := c.Do(t.Context(), c.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatalf("SCAN %s: %v", pattern, err)
		}
		out = append(out, e.Elements...)
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	slices.Sort(out)
	return out
}

type waited struct {
	d   ratelimit.Decision
	err error
	at  time.Time
}

func waitAsync(ctx context.Context, l *ratelimit.Limiter, r ratelimit.Request) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		d, err := l.Wait(ctx, r)
		ch <- waited{d, err, time.Now()}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan waited, d time.Duration, what string) waited {
	t.Helper()
	select {
	case w := <-ch:
		if w.err != nil || !w.d.Allowed {
			t.Fatalf("%s: Wait = %+v, %v", what, w.d, w.err)
		}
		return w
	case <-time.After(d):
		t.Fatalf("%s: Wait did not return within %v", what, d)
		return waited{}
	}
}

// ---------------------------------------------------------------------------
// Helper process

// Environment of the helper process (see TestHelperProcess).
const envCfg = "LLMGATE_RL_HELPER_CFG" // JSON helperCfg

// helperCfg configures a helper process.
type helperCfg struct {
	Scope       string        `json:"scope"`
	Hold        time.Duration `json:"hold,omitempty"`
	WaiterLease time.Duration `json:"waiter_lease,omitempty"`
	ID          string        `json:"id,omitempty"`
	Cost        int64         `json:"cost,omitempty"`
	Hammer      hammerCfg     `json:"hammer"`
}

func startHelper(t *testing.T, ctx context.Context, r *testutil.Redis, mode string, cfg helperCfg) *testutil.Child {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return testutil.StartHelper(t, ctx, r, mode, envCfg+"="+string(raw))
}

// TestHelperProcess is not a test: it is the body of the child processes
// the other tests start (startHelper) in mode hammer, hold, wait, reserve or
// probe.
func TestHelperProcess(t *testing.T) {
	mode, ctx, c := testutil.Helper(t)
	var cfg helperCfg
	if err := json.Unmarshal([]byte(os.Getenv(envCfg)), &cfg); err != nil {
		t.Fatal(err)
	}
	var opts []ratelimit.Option
	if cfg.WaiterLease > 0 {
		opts = append(opts, ratelimit.WithWaiterLease(cfg.WaiterLease))
	}
	l := ratelimit.New(redis.New(c, redis.Config{}), opts...)
	say := testutil.Say
	switch mode {
	case "hammer":
		say("ready")
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil {
			t.Fatalf("read go line: %v", err)
		}
		var startNS, endNS int64
		if _, err := fmt.Sscanf(line, "go %d %d", &startNS, &endNS); err != nil {
			t.Fatalf("go line %q: %v", line, err)
		}
		res := hammer(ctx, l, cfg.Hammer, time.Unix(0, startNS), time.Unix(0, endNS))
		raw, _ := json.Marshal(res)
		say("result %s", raw)
	case "hold": // take a permit and never give it back
		before := time.Now()
		r := one(cfg.Scope, conc(1), 1)
		r.Hold = cfg.Hold
		if _, err := l.Allow(ctx, r); err != nil {
			t.Fatal(err)
		}
		say("held %d", before.UnixNano())
		<-ctx.Done() // until killed
	case "reserve": // reserve tokens and never settle
		before := time.Now()
		r := one(cfg.Scope, ratelimit.Limit{Kind: ratelimit.Tokens, Limit: cfg.Cost, Window: time.Second}, cfg.Cost)
		r.Hold, r.ID = cfg.Hold, cfg.ID
		d, err := l.Allow(ctx, r)
		if err != nil || !d.Allowed {
			t.Fatalf("Allow = %+v, %v", d, err)
		}
		say("reserved %d", before.UnixNano())
		<-ctx.Done()
	case "wait": // queue for a permit; hold it forever if admitted
		r := one(cfg.Scope, conc(1), 1)
		r.Hold, r.ID = cfg.Hold, cfg.ID
		say("waiting")
		if _, err := l.Wait(ctx, r); err != nil {
			t.Fatal(err)
		}
		say("admitted")
		<-ctx.Done()
	case "probe": // what does this replica see of a cooldown?
		d, err := l.Allow(ctx, one(cfg.Scope, rpm(100), 1))
		if err != nil {
			t.Fatal(err)
		}
		left, err := l.Cooldown(ctx, cfg.Scope, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		say("probe %v %d %q %d", d.Allowed, d.RetryAfter, d.DeniedBy, left)
	default:
		t.Fatalf("unknown helper mode %q", mode)
	}
}

// ---------------------------------------------------------------------------
// (a) Accuracy across replicas

// hammerCfg is one client's part in an accuracy run.
type hammerCfg struct {
	Limit   ratelimit.Limit `json:"limit"`
	Scope   string          `json:"scope"`
	MaxCost int64           `json:"max_cost"` // 1: every request costs 1; else uniform in 1..MaxCost
	Wait    bool            `json:"wait"`     // Wait (until the end) instead of Allow
	Workers int             `json:"workers"`
}

// hammerResult is what one client did.
type hammerResult struct {
	Admitted   int64  `json:"admitted"` // requests
	Units      int64  `json:"units"`    // units of the limit they took
	Attempts   int64  `json:"attempts"`
	FirstStart int64  `json:"first_start"` // unix ns when the first admitted call started; 0: none
	FirstEnd   int64  `json:"first_end"`   // unix ns when the first admitted call returned; 0: none
	LastEnd    int64  `json:"last_end"`    // unix ns: the last admitted call's return, or the run's end
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
}

func (h *hammerResult) add(o hammerResult) {
	h.Admitted += o.Admitted
	h.Units += o.Units
	h.Attempts += o.Attempts
	h.Errors += o.Errors
	if o.FirstStart != 0 && (h.FirstStart == 0 || o.FirstStart < h.FirstStart) {
		h.FirstStart = o.FirstStart
	}
	if o.FirstEnd != 0 && (h.FirstEnd == 0 || o.FirstEnd < h.FirstEnd) {
		h.FirstEnd = o.FirstEnd
	}
	h.LastEnd = max(h.LastEnd, o.LastEnd)
	if h.FirstError == "" {
		h.FirstError = o.FirstError
	}
}

// maxAttempts bounds every worker's loop whatever the clock does.
const maxAttempts = 2_000_000

// hammer sends requests as fast as one round trip allows from start until
// end (wall clock, shared by every process on this machine).
func hammer(ctx context.Context, l *ratelimit.Limiter, cfg hammerCfg, start, end time.Time) hammerResult {
	time.Sleep(time.Until(start)) // the agreed start: the schedule is the test's input, not a synchronisation
	var mu sync.Mutex
	var total hammerResult
	var wg sync.WaitGroup
	for w := range max(cfg.Workers, 1) {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			var res hammerResult
			for range maxAttempts {
				if !time.Now().Before(end) {
					break
				}
				cost := int64(1)
				if cfg.MaxCost > 1 {
					cost = 1 + rng.Int64N(cfg.MaxCost)
				}
				r := one(cfg.Scope, cfg.Limit, cost)
				t0 := time.Now()
				var d ratelimit.Decision
				var err error
				if cfg.Wait {
					wctx, cancel := context.WithDeadline(ctx, end)
					d, err = l.Wait(wctx, r)
					cancel()
					if errors.Is(err, ratelimit.ErrLimited) {
						err = nil // the run ended while waiting
					}
				} else {
					d, err = l.Allow(ctx, r)
				}
				t1 := time.Now()
				res.Attempts++
				// An admission happened before its call returned; a refusal
				// or a waiter giving up bounds nothing, and a waiter returns
				// only after its Abandon, past the end of the run.
				if err == nil && d.Allowed && !d.Degraded {
					res.LastEnd = max(res.LastEnd, t1.UnixNano())
				} else {
					res.LastEnd = max(res.LastEnd, min(t1.UnixNano(), end.UnixNano()))
				}
				if err != nil {
					res.Errors++
					if res.FirstError == "" {
						res.FirstError = err.Error()
					}
					continue
				}
				if d.Degraded {
					res.Errors++
					if res.FirstError == "" {
						res.FirstError = "degraded decision"
					}
					continue
				}
				if d.Allowed {
					res.Admitted++
					res.Units += cost
					if res.FirstStart == 0 {
						res.FirstStart = t0.UnixNano()
						res.FirstEnd = t1.UnixNano()
					}
				}
			}
			mu.Lock()
			total.add(res)
			mu.Unlock()
		})
	}
	wg.Wait()
	return total
}

// TestAccuracyAcrossReplicas: four independent clients, two goroutine
// clients in this process and two child processes, each on its own
// connection, hammer one limit of 200 per second (burst 600) for 3s. The
// total admitted is between 99% and 100% of the ideal, never above it;
// likewise for a tokens limit with costs of 1 to 50, and with Wait.
//
// The ideal. The bucket is created full (burst units) by the first
// admission, at server time t0, and refills at rate units/s; by any time T
// it can have handed out at most burst + rate·(T − t0). Every admission
// happened at a server time between t0 and the return of the last admitted
// call, and t0 is no earlier than the start of the first admitted call (all
// clocks here are this machine's; Redis's TIME is the same wall clock). So
// ideal = burst + rate·(lastEnd − firstStart), with lastEnd the later of
// the last admitted call's return and the end of the run (while the run
// lasts, the clients keep asking), is an upper bound on what a perfect
// limiter could admit: admitted must never exceed it.
//
// The floor. A busy machine stalls the clients, so they do not ask all the
// time, and a call may return long after the run's end; what they did not
// ask for is not the limiter's loss. What the limiter must not lose is
// counted without timing the clients: the bucket existed by the return of
// the first admitted call (firstEnd), so by the run's end it has gained
// burst + rate·(end − firstEnd), and that is either admitted or still in
// the bucket, which a probe reads at the end (nothing is lost to a full
// bucket unless every client stalls for the 3s the burst lasts). So admitted plus
// the level at the end is at least 99% of that, the 1% being a fraction of
// a request and the probe's own round trip.
func TestAccuracyAcrossReplicas(t *testing.T) {
	r := testutil.StartRedis(t)
	const rate = 200
	for _, tc := range []struct {
		name    string
		kind    ratelimit.Kind
		rate    int64
		maxCost int64
		wait    bool
		workers int
	}{
		{"requests/Allow", ratelimit.Requests, rate, 1, false, 1},
		{"tokens 1..50/Allow", ratelimit.Tokens, 25 * rate, 50, false, 1},
		{"requests/Wait", ratelimit.Requests, rate, 1, true, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			cfg := hammerCfg{
				// A burst of 3s: no stall of a busy machine lets the bucket
				// overflow, so only the limiter can lose capacity.
				Limit:   ratelimit.Limit{Kind: tc.kind, Limit: tc.rate, Window: time.Second, Burst: 3 * tc.rate},
				Scope:   newScope(t, "shared"),
				MaxCost: tc.maxCost, Wait: tc.wait, Workers: tc.workers,
			}
			const procs, local = 2, 2
			var children []*testutil.Child
			for range procs {
				children = append(children, startHelper(t, ctx, r, "hammer", helperCfg{Hammer: cfg}))
			}
			for i, c := range children {
				if line := c.Line(t, 30*time.Second); line != "ready" {
					t.Fatalf("child %d said %q", i, line)
				}
			}
			const runFor = 3 * time.Second
			start := time.Now().Add(100 * time.Millisecond)
			end := start.Add(runFor)
			// The probe reads the bucket at the end of the run.
			probe := newLimiter(t, r)
			level := make(chan int64, 1)
			go func() {
				time.Sleep(time.Until(end)) // the agreed end: the schedule is the test's input
				d, err := probe.Allow(ctx, one(cfg.Scope, cfg.Limit, 1))
				if err != nil || len(d.Limits) != 1 {
					t.Errorf("probe at the end: %+v, %v", d, err)
					level <- 0
					return
				}
				n := d.Limits[0].Remaining
				if d.Allowed {
					n++ // the probe took one
				}
				level <- n
			}()
			for i, c := range children {
				if _, err := fmt.Fprintf(c.Stdin, "go %d %d\n", start.UnixNano(), end.UnixNano()); err != nil {
					t.Fatalf("child %d: %v", i, err)
				}
			}
			results := make([]hammerResult, local)
			var wg sync.WaitGroup
			for i := range local {
				l := newLimiter(t, r)
				wg.Go(func() { results[i] = hammer(ctx, l, cfg, start, end) })
			}
			wg.Wait()
			for i, c := range children {
				line := c.Line(t, 30*time.Second)
				raw, ok := strings.CutPrefix(line, "result ")
				if !ok {
					t.Fatalf("child %d said %q", i, line)
				}
				var res hammerResult
				if err := json.Unmarshal([]byte(raw), &res); err != nil {
					t.Fatalf("child %d: %v", i, err)
				}
				results = append(results, res)
			}
			var total hammerResult
			for i, res := range results {
				t.Logf("client %d: %d admitted (%d units) of %d attempts", i, res.Admitted, res.Units, res.Attempts)
				if res.Admitted == 0 {
					t.Errorf("client %d admitted nothing", i)
				}
				total.add(res)
			}
			if total.Errors > 0 {
				t.Fatalf("%d errors; first: %s", total.Errors, total.FirstError)
			}
			elapsed := time.Duration(total.LastEnd - total.FirstStart)
			ideal := float64(cfg.Limit.Burst) + float64(cfg.Limit.Limit)*elapsed.Seconds()
			pct := 100 * float64(total.Units) / ideal
			t.Logf("%d units admitted in %v by %d attempts; ideal %.1f: %.2f%%", total.Units, elapsed.Round(time.Millisecond), total.Attempts, ideal, pct)
			if float64(total.Units) > ideal+1e-9 {
				t.Fatalf("admitted %d units, above the ideal %.2f: the limiter let more through than the bucket holds", total.Units, ideal)
			}
			left := <-level
			gained := float64(cfg.Limit.Burst) + float64(cfg.Limit.Limit)*time.Duration(end.UnixNano()-total.FirstEnd).Seconds()
			used := 100 * float64(total.Units+left) / gained
			t.Logf("%d units left in the bucket at the end; admitted and left: %.2f%% of the %.1f gained by then", left, used, gained)
			if used < 99 {
				t.Fatalf("admitted %d units and %d were left at the end: %.2f%% of the %.1f the bucket gained, want at least 99%%: the limiter lost capacity", total.Units, left, used, gained)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// (b), (e) Crashed holders and waiters

// TestKilledHolderPermitFreedAfterHold: a permit held by a process killed
// with SIGKILL is refused to others until its Hold ends, then granted.
func TestKilledHolderPermitFreedAfterHold(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	scope := newScope(t, "C")
	const hold = 500 * time.Millisecond
	child := startHelper(t, ctx, r, "hold", helperCfg{Scope: scope, Hold: hold})
	var startNS int64
	if line := child.Line(t, 30*time.Second); !strings.HasPrefix(line, "held ") {
		t.Fatalf("helper said %q", line)
	} else if _, err := fmt.Sscanf(line, "held %d", &startNS); err != nil {
		t.Fatal(err)
	}
	heldBy := time.Now()
	child.Kill()
	l := newLimiter(t, r)
	if time.Since(heldBy) < hold/2 {
		mustDeny(t, ctx, l, one(scope, conc(1), 1), "permit of the killed holder, within its hold")
	}
	w := receive(t, waitAsync(ctx, l, one(scope, conc(1), 1)), 10*time.Second, "waiter")
	if earliest := time.Unix(0, startNS).Add(hold - 2*time.Millisecond); w.at.Before(earliest) {
		t.Fatalf("permit granted %v before the killed holder's hold could end", earliest.Sub(w.at))
	}
	late := w.at.Sub(heldBy.Add(hold))
	t.Logf("permit granted %v after the killed holder's hold ended", late)
	// The waiter is told nothing when the permit expires (see the
	// conformance test WaitWokenByPermitExpiry); it finds out when it renews
	// its place, every DefaultWaiterLease/3.
	if bound := ratelimit.DefaultWaiterLease/3 + r.LateBound(t, 50, 2*time.Second); late > bound {
		t.Fatalf("permit granted %v after the killed holder's hold ended, want within %v", late, bound)
	}
	if n := r.Int(t, "ZCARD", base+":c:"+scope); n != 1 {
		t.Fatalf("ZCARD of the permits = %d, want 1 (only the waiter's)", n)
	}
}

// TestKilledWaiterDoesNotPin: a waiter process killed with SIGKILL while
// queued first in line holds nothing for long. If its place has expired
// when the permit frees, the next waiter is served at once; if not, the
// walk admits the dead waiter, whose reservation lives for its Hold, and
// the next waiter is served when that ends. Either way the lane empties and
// the permit is free again afterwards.
func TestKilledWaiterDoesNotPin(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, tc := range []struct {
		name         string
		settleAfter  time.Duration // how long after the kill the holder settles
		within       time.Duration // how soon after the settle the live waiter is served, less a busy machine's delays
		deadAdmitted bool
		waiterLease  time.Duration
		deadHold     time.Duration
	}{
		{name: "place expired", settleAfter: 900 * time.Millisecond, within: 0, waiterLease: 300 * time.Millisecond, deadHold: 400 * time.Millisecond},
		{name: "admitted while dead", settleAfter: 0, within: 400*time.Millisecond + ratelimit.DefaultWaiterLease/3, deadAdmitted: true, waiterLease: 3 * time.Second, deadHold: 400 * time.Millisecond},
	} {
		// Whether the dead waiter was admitted is told by its reservation,
		// not by timing; the bound only says the live one was not stuck.
		tc.within += r.LateBound(t, 50, 2*time.Second)
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			scope := newScope(t, "C")
			holder, live := newLimiter(t, r), newLimiter(t, r)
			h := mustAllow(t, ctx, holder, one(scope, conc(1), 1), "holder")
			deadID := "dead-" + randHex()
			child := startHelper(t, ctx, r, "wait", helperCfg{Scope: scope, Hold: tc.deadHold, WaiterLease: tc.waiterLease, ID: deadID})
			if line := child.Line(t, 30*time.Second); line != "waiting" {
				t.Fatalf("helper said %q", line)
			}
			waitLane(t, r, scope, 1)
			ch := waitAsync(ctx, live, one(scope, conc(1), 1))
			waitLane(t, r, scope, 2)
			child.Kill()
			time.Sleep(tc.settleAfter) // let the dead waiter's place expire, or not
			start := time.Now()
			if err := holder.Settle(ctx, h.ID, []int64{1}); err != nil {
				t.Fatal(err)
			}
			w := receive(t, ch, 10*time.Second, "live waiter")
			d := w.at.Sub(start)
			t.Logf("live waiter served %v after the settle", d)
			if d > tc.within {
				t.Fatalf("live waiter served %v after the settle, want within %v", d, tc.within)
			}
			dead := r.Int(t, "EXISTS", base+":r:"+deadID)
			if tc.deadAdmitted && d < tc.deadHold-50*time.Millisecond {
				t.Fatalf("live waiter served %v after the settle, before the dead waiter's hold of %v could end", d, tc.deadHold)
			}
			if !tc.deadAdmitted && dead != 0 {
				t.Fatalf("the dead waiter was admitted although its place had expired")
			}
			if err := live.Settle(ctx, w.d.ID, []int64{1}); err != nil {
				t.Fatal(err)
			}
			mustAllow(t, ctx, holder, one(scope, conc(1), 1), "permit after everyone")
			if n := r.Int(t, "EXISTS", laneKey(scope), base+":ql:"+scope, base+":w:"+deadID, base+":e:"+deadID); n != 0 {
				t.Fatalf("%d lane keys left behind", n)
			}
		})
	}
}

// TestKilledReserverDoesNotPin: a process that reserved a whole tokens
// bucket and was killed before settling: after its Hold the reservation is
// gone (Settle says unknown), the estimate stands, and the bucket refills
// at its rate as if the tokens had been spent.
func TestKilledReserverDoesNotPin(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	scope := newScope(t, "T")
	const hold, n = 300 * time.Millisecond, 1000
	id := "reserver-" + randHex()
	child := startHelper(t, ctx, r, "reserve", helperCfg{Scope: scope, Hold: hold, ID: id, Cost: n})
	if line := child.Line(t, 30*time.Second); !strings.HasPrefix(line, "reserved ") {
		t.Fatalf("helper said %q", line)
	}
	child.Kill()
	l := newLimiter(t, r)
	lim := ratelimit.Limit{Kind: ratelimit.Tokens, Limit: n, Window: time.Second}
	d := mustAllow(t, ctx, l, one(scope, lim, 0), "probe right after the kill")
	if d.Limits[0].Remaining > n/2 {
		t.Fatalf("%d tokens left right after the reservation, want few", d.Limits[0].Remaining)
	}
	time.Sleep(hold + 100*time.Millisecond)
	if err := l.Settle(ctx, id, []int64{1}); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Settle of the killed process's reservation after its hold = %v, want ErrUnknownReservation", err)
	}
	if n := r.Int(t, "EXISTS", base+":r:"+id); n != 0 {
		t.Fatalf("the reservation key outlived its hold")
	}
	time.Sleep(lim.Window) // a full window refills the bucket
	d = mustAllow(t, ctx, l, one(scope, lim, n), "the whole bucket a window later")
	if d.Limits[0].Remaining != 0 {
		t.Fatalf("Remaining = %d after taking the whole bucket", d.Limits[0].Remaining)
	}
}

// ---------------------------------------------------------------------------
// (c) Cooldown

// TestCooldownAcrossClients: a cooldown set from one client holds back
// every other client, including another process, for its whole length; a
// shorter one from anywhere does not shorten it.
func TestCooldownAcrossClients(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	scope := newScope(t, "S")
	ls := []*ratelimit.Limiter{newLimiter(t, r), newLimiter(t, r), newLimiter(t, r), newLimiter(t, r)}
	const cd = 3 * time.Second
	start := time.Now()
	if left, err := ls[0].Cooldown(ctx, scope, cd); err != nil || left != cd {
		t.Fatalf("Cooldown = %v, %v", left, err)
	}
	set := time.Now()
	for i, l := range ls[1:] {
		d := mustDeny(t, ctx, l, one(scope, rpm(100), 1), fmt.Sprintf("client %d", i+1))
		if d.DeniedBy != scope || d.RetryAfter > cd || d.RetryAfter < cd-time.Since(start)-2*time.Millisecond {
			t.Fatalf("client %d: denied by %q, retry after %v; want %q and the cooldown's rest", i+1, d.DeniedBy, d.RetryAfter, scope)
		}
		left, err := l.Cooldown(ctx, scope, time.Duration(i+1)*100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if left > cd || left < cd-time.Since(start)-2*time.Millisecond {
			t.Fatalf("client %d: shorter Cooldown returned %v, want the %v cooldown's rest", i+1, left, cd)
		}
	}
	// Another process sees it and cannot shorten it either.
	child := startHelper(t, ctx, r, "probe", helperCfg{Scope: scope})
	line := child.Line(t, 30*time.Second)
	var allowed bool
	var retryNS, leftNS int64
	var by string
	if _, err := fmt.Sscanf(line, "probe %t %d %q %d", &allowed, &retryNS, &by, &leftNS); err != nil {
		t.Fatalf("helper said %q: %v", line, err)
	}
	restMax, restMin := cd-time.Since(set)+2*time.Millisecond, cd-time.Since(start)-time.Second
	if allowed || by != scope || time.Duration(retryNS) < restMin || time.Duration(retryNS) > cd {
		t.Fatalf("child process: allowed=%v by %q retry after %v; want refused by %q, about %v", allowed, by, time.Duration(retryNS), scope, restMax)
	}
	if left := time.Duration(leftNS); left < restMin || left > cd {
		t.Fatalf("child's 100ms Cooldown returned %v, want the longer cooldown's rest (about %v)", left, restMax)
	}
	// Still in force after every shorter one would have ended.
	time.Sleep(500 * time.Millisecond)
	for i, l := range ls {
		d := mustDeny(t, ctx, l, one(scope, rpm(100), 1), fmt.Sprintf("client %d after the shorter cooldowns", i))
		if d.RetryAfter < cd-time.Since(start)-2*time.Millisecond {
			t.Fatalf("client %d: RetryAfter %v, want the %v cooldown's rest", i, d.RetryAfter, cd)
		}
	}
	time.Sleep(time.Until(set.Add(cd + 20*time.Millisecond)))
	for i, l := range ls {
		mustAllow(t, ctx, l, one(scope, rpm(100), 1), fmt.Sprintf("client %d after the cooldown", i))
	}
}

// ---------------------------------------------------------------------------
// (d) Order and wake-up across clients

// serveAcross queues one waiter per request, each on its own client (its
// own connection), in order, each seen in the lane's zset before the next;
// then it frees the single permit they wait for. Each admitted waiter
// records itself and settles, which admits the next.
func serveAcross(t *testing.T, ctx context.Context, r *testutil.Redis, scope string, prios []ratelimit.Priority) []int {
	t.Helper()
	holder := newLimiter(t, r)
	h := mustAllow(t, ctx, holder, one(scope, conc(1), 1), "holder")
	order := make(chan int, len(prios))
	errs := make(chan error, len(prios))
	for i, p := range prios {
		l := newLimiter(t, r)
		req := one(scope, conc(1), 1)
		req.Priority = p
		go func() {
			d, err := l.Wait(ctx, req)
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			order <- i
			errs <- l.Settle(ctx, d.ID, []int64{1})
		}()
		waitLane(t, r, scope, int64(i+1))
	}
	if err := holder.Settle(ctx, h.ID, []int64{1}); err != nil {
		t.Fatal(err)
	}
	for range prios {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("waiters not all served within 10s")
		}
	}
	close(order)
	var got []int
	for i := range order {
		got = append(got, i)
	}
	if n := r.Int(t, "EXISTS", laneKey(scope)); n != 0 {
		t.Fatalf("lane still exists after every waiter was served")
	}
	return got
}

// TestWaitOrderAcrossClients: six waiters on six connections are served in
// arrival order; with mixed priorities, interactive ones first.
func TestWaitOrderAcrossClients(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 60*time.Second)
	I, B := ratelimit.Interactive, ratelimit.Batch
	if got := serveAcross(t, ctx, r, newScope(t, "fifo"), []ratelimit.Priority{B, B, B, B, B, B}); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("served in order %v, want arrival order", got)
	}
	if got := serveAcross(t, ctx, r, newScope(t, "prio"), []ratelimit.Priority{B, B, B, I, I, I}); !slices.Equal(got, []int{3, 4, 5, 0, 1, 2}) {
		t.Fatalf("served in order %v, want interactive (3,4,5) before batch (0,1,2)", got)
	}
	if got := serveAcross(t, ctx, r, newScope(t, "mixed"), []ratelimit.Priority{I, B, I, B, I, B}); !slices.Equal(got, []int{0, 2, 4, 1, 3, 5}) {
		t.Fatalf("served in order %v, want 0,2,4 then 1,3,5", got)
	}
}

// TestWakeLatencyAfterSettle: a Settle wakes the waiter it makes room for
// directly. Over 100 hand-offs between two clients, the median time from
// the Settle call to the waiter's Wait returning is far below the 1s at
// which a waiter renews its place. (A sanity bound, not a benchmark.)
func TestWakeLatencyAfterSettle(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 60*time.Second)
	scope := newScope(t, "C")
	ls := []*ratelimit.Limiter{newLimiter(t, r), newLimiter(t, r)}
	holder := mustAllow(t, ctx, ls[0], one(scope, conc(1), 1), "first holder")
	owner := 0
	const n = 100
	lat := make([]time.Duration, 0, n)
	for i := range n {
		waiter := 1 - owner
		ch := waitAsync(ctx, ls[waiter], one(scope, conc(1), 1))
		waitLane(t, r, scope, 1)
		start := time.Now()
		if err := ls[owner].Settle(ctx, holder.ID, []int64{1}); err != nil {
			t.Fatal(err)
		}
		w := receive(t, ch, 10*time.Second, fmt.Sprintf("hand-off %d", i))
		lat = append(lat, w.at.Sub(start))
		holder, owner = w.d, waiter
	}
	slices.Sort(lat)
	t.Logf("Settle-to-admission over %d hand-offs: median %v, p90 %v, max %v", n, lat[n/2], lat[n*9/10], lat[n-1])
	// Far below the waiters' renewal every 1s; in round trips, with a
	// floor for a busy machine.
	if bound := r.LateBound(t, 20, 50*time.Millisecond); lat[n/2] > bound {
		t.Fatalf("median wake latency %v, want below %v (is the waiter woken, or does it renew?)", lat[n/2], bound)
	}
}

// ---------------------------------------------------------------------------
// (f) Store outage

// TestRedisRestartFailOpen: a fail-open limiter keeps admitting while Redis
// is down, marking decisions Degraded and counting them; a fail-closed one
// refuses; both recover when Redis is back, and the limit is enforced again.
func TestRedisRestartFailOpen(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 60*time.Second)
	scope := newScope(t, "S")
	l := newLimiter(t, r)
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 100, Window: time.Second}
	closedLim := lim
	closedLim.FailClosed = true

	type tally struct{ ok, degraded, denied, errs int }
	var mu sync.Mutex
	var cur tally
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	go func() { // one request per millisecond, bounded
		defer close(loopDone)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for range 60_000 {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			d, err := l.Allow(actx, one(scope, lim, 1))
			cancel()
			mu.Lock()
			switch {
			case err != nil:
				cur.errs++
			case d.Degraded:
				cur.degraded++
			case d.Allowed:
				cur.ok++
			default:
				cur.denied++
			}
			mu.Unlock()
		}
	}()
	defer func() { close(stop); <-loopDone }()
	// waitFor polls the loop's tally until cond holds.
	waitFor := func(what string, d time.Duration, cond func(tally) bool) tally {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			mu.Lock()
			c := cur
			mu.Unlock()
			if cond(c) {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v (tally %+v)", what, d, c)
			}
			time.Sleep(5 * time.Millisecond) // polling the loop's tally
		}
	}
	reset := func() { mu.Lock(); cur = tally{}; mu.Unlock() }

	waitFor("healthy admissions and refusals", 10*time.Second, func(c tally) bool { return c.ok > 50 && c.denied > 0 })
	r.Stop()
	reset()
	down := waitFor("degraded admissions while Redis is down", 10*time.Second, func(c tally) bool { return c.degraded >= 50 })
	if down.errs > 0 || down.ok > 1 {
		t.Fatalf("while Redis is down: %+v, want only degraded admissions", down)
	}
	if _, err := l.Allow(ctx, one(scope, closedLim, 1)); !errors.Is(err, ratelimit.ErrStoreUnavailable) {
		t.Fatalf("fail-closed Allow while Redis is down = %v, want ErrStoreUnavailable", err)
	}
	st := l.Stats()
	if st.FailedOpen < 50 || st.StoreErrors < st.FailedOpen || st.FailedClosed != 1 {
		t.Fatalf("Stats while Redis is down = %+v", st)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	reset()
	waitFor("normal decisions once Redis is back", 10*time.Second, func(c tally) bool { return c.ok > 0 })
	t.Logf("first normal admission %v after Redis was back", time.Since(back).Round(time.Millisecond))
	reset()
	// 1000 requests/s against 100/s: the limit holds again.
	c := waitFor("the limit enforced again", 10*time.Second, func(c tally) bool { return c.denied > 100 })
	if c.degraded > 0 || c.errs > 0 {
		t.Fatalf("after recovery: %+v, want no degraded decisions", c)
	}
	d := mustAllow(t, ctx, l, one(newScope(t, "fresh"), closedLim, 1), "fail-closed request after recovery")
	if d.Degraded {
		t.Fatal("degraded after recovery")
	}
}

// ---------------------------------------------------------------------------
// Round trips and key layout

// counting is a rueidis.Client that counts the commands sent.
type counting struct {
	rueidis.Client
	cmds atomic.Int64
}

func (c *counting) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.cmds.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c *counting) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	c.cmds.Add(int64(len(multi)))
	return c.Client.DoMulti(ctx, multi...)
}

// commandstats returns the calls per command from INFO commandstats.
func commandstats(t *testing.T, c rueidis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Do(t.Context(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				out[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return out
}

// TestOneRoundTripPerDecision: a decision over a request's three limits
// (deployment RPM and TPM, tenant RPM) is one command, one round trip: the
// client sends one EVALSHA and the server runs one script; a Settle is
// one more.
func TestOneRoundTripPerDecision(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	cc := &counting{Client: r.Client(t)}
	l := ratelimit.New(redis.New(cc, redis.Config{}))
	dep, tenant := newScope(t, "deployment"), newScope(t, "tenant")
	req := ratelimit.Request{Charges: []ratelimit.Charge{
		{Scope: dep, Limit: rpm(100_000)},
		{Scope: dep, Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 10_000_000, Window: time.Minute}, Cost: 500},
		{Scope: tenant, Limit: rpm(100_000)},
	}}
	warm := mustAllow(t, ctx, l, req, "warm-up") // the first run of each script may load it
	if err := l.Settle(ctx, warm.ID, []int64{1, 500, 1}); err != nil {
		t.Fatal(err)
	}
	observer := r.Client(t)
	before := commandstats(t, observer)
	cc.cmds.Store(0)
	const n = 200
	var ids []string
	for i := range n {
		ids = append(ids, mustAllow(t, ctx, l, req, fmt.Sprintf("decision %d", i)).ID)
	}
	if got := cc.cmds.Load(); got != n {
		t.Fatalf("%d commands for %d decisions, want one each", got, n)
	}
	for _, id := range ids {
		if err := l.Settle(ctx, id, []int64{1, 300, 1}); err != nil {
			t.Fatal(err)
		}
	}
	if got := cc.cmds.Load(); got != 2*n {
		t.Fatalf("%d commands for %d decisions and settles, want one each", got, n)
	}
	after := commandstats(t, observer)
	scripts := after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"]
	if scripts != 2*n {
		t.Fatalf("server ran %d scripts for %d decisions and settles, want %d", scripts, n, 2*n)
	}
	inner := int64(0)
	for cmd, calls := range after {
		if cmd != "evalsha" && cmd != "eval" && cmd != "info" {
			inner += calls - before[cmd]
		}
	}
	t.Logf("%.1f commands inside each script on average (decision + settle)", float64(inner)/float64(2*n))
}

// TestKeysShareOneSlot: every key a request, a waiter, a cooldown and an
// observation create carries the group's hash tag, so one script touches
// one Cluster slot, whatever the scope names contain (even braces).
func TestKeysShareOneSlot(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	c := r.Client(t)
	for _, group := range []string{"", "openai"} {
		b := redis.New(c, redis.Config{Group: group, Prefix: "slot:"})
		l := ratelimit.New(b)
		dep, tenant := newScope(t, "dep{x}"), newScope(t, "{tenant}")
		req := ratelimit.Request{Charges: []ratelimit.Charge{
			{Scope: dep, Limit: rpm(1)}, {Scope: tenant, Limit: conc(1)},
			{Scope: tenant, Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 10, Window: time.Minute}, Cost: 5},
		}}
		d := mustAllow(t, ctx, l, req, "first")
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, _ = l.Wait(wctx, req) // queues, then gives up
		cancel()
		if _, err := l.Cooldown(ctx, tenant, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := l.Observe(ctx, dep, ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 10, Window: time.Minute}, 1); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, d.ID, []int64{1, 1, 3}); err != nil {
			t.Fatal(err)
		}
		want := group
		if want == "" {
			want = redis.DefaultGroup
		}
		all := keys(t, c, "slot:*")
		if len(all) < 5 {
			t.Fatalf("only %d keys: %q", len(all), all)
		}
		for _, k := range all {
			open := strings.IndexByte(k, '{')
			closing := strings.IndexByte(k[open+1:], '}')
			if open < 0 || closing < 0 || k[open+1:open+1+closing] != want {
				// Keys of the other group of this loop are fine.
				if group == "" && strings.HasPrefix(k, "slot:{openai}") {
					continue
				}
				if group == "openai" && strings.HasPrefix(k, "slot:{"+redis.DefaultGroup+"}") {
					continue
				}
				t.Fatalf("key %q: hash tag is not {%s}", k, want)
			}
		}
	}
}

// TestNothingLeftBehind: after waiters that were admitted, gave up or
// raced a settle are gone, no lane, waiter or wake-up key is left.
func TestNothingLeftBehind(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	scope := newScope(t, "C")
	holder, w := newLimiter(t, r), newLimiter(t, r)
	for i := range 10 {
		h := mustAllow(t, ctx, holder, one(scope, conc(1), 1), fmt.Sprintf("round %d", i))
		wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		var chs []<-chan waited
		for range 3 {
			chs = append(chs, waitAsync(wctx, w, one(scope, conc(1), 1)))
		}
		time.Sleep(time.Duration(10+i*2) * time.Millisecond) // race the settle against the deadline
		if err := holder.Settle(ctx, h.ID, []int64{1}); err != nil {
			t.Fatal(err)
		}
		for _, ch := range chs {
			select {
			case got := <-ch:
				if got.err == nil {
					_ = w.Settle(ctx, got.d.ID, []int64{1})
				}
			case <-time.After(10 * time.Second):
				t.Fatal("waiter did not return")
			}
		}
		cancel()
	}
	// A rate-limited lane whose waiters are hinted and admitted one by one.
	rscope := newScope(t, "R")
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 20, Window: time.Second, Burst: 1}
	mustAllow(t, ctx, holder, one(rscope, lim, 1), "drain")
	var chs []<-chan waited
	for range 4 {
		chs = append(chs, waitAsync(ctx, w, one(rscope, lim, 1)))
	}
	for i, ch := range chs {
		receive(t, ch, 10*time.Second, fmt.Sprintf("rate waiter %d", i))
	}
	c := r.Client(t)
	for _, s := range []string{scope, rscope} {
		if left := keys(t, c, base+":q*:"+s); len(left) > 0 {
			t.Errorf("lane keys left: %q", left)
		}
	}
	for _, pattern := range []string{base + ":w:*", base + ":e:*"} {
		if left := keys(t, c, pattern); len(left) > 0 {
			t.Errorf("waiter entries left: %q", left)
		}
	}
	if left := keys(t, c, base+":n:*"); len(left) > 0 {
		t.Errorf("wake-up lists left (they expire after the request's Hold): %q", left)
	}
}

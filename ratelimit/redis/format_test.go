package redis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/redis"
)

// serverMicros is the server's clock in µs (TIME), as the scripts read it.
func serverMicros(t *testing.T, ctx context.Context, c rueidis.Client) int64 {
	t.Helper()
	v, err := c.Do(ctx, c.B().Time().Build()).AsStrSlice()
	if err != nil || len(v) != 2 {
		t.Fatalf("TIME = %v, %v", v, err)
	}
	s, _ := strconv.ParseInt(v[0], 10, 64)
	us, _ := strconv.ParseInt(v[1], 10, 64)
	return s*1_000_000 + us
}

// jsonSpec is a spec as the versions before the binary spec wrote it.
func jsonSpec(t *testing.T, lane string, hold time.Duration, charges ...[]any) string {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"c": charges, "h": hold.Milliseconds(), "l": lane, "x": 0})
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// TestUpgradeFromJSONFormat: what the previous version left in Redis — bucket
// levels as "level updated_us", reservations as "state\nJSON spec\ndecision",
// queued entries as a JSON spec — is read by this one during a rolling upgrade.
func TestUpgradeFromJSONFormat(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	c := r.Client(t)
	l := ratelimit.New(redis.New(c, redis.Config{}))
	set := func(args ...string) {
		t.Helper()
		if err := c.Do(ctx, c.B().Arbitrary(args[0]).Keys(args[1]).Args(args[2:]...).Build()).Error(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	const minute = int64(60_000_000)

	t.Run("BucketLevel", func(t *testing.T) {
		scope := newScope(t, "A")
		// 3.5 left of 10 per minute, written just now.
		set("HSET", base+":s", "b:"+scope+":r:"+strconv.FormatInt(minute, 10), fmt.Sprintf("3.5 %d", serverMicros(t, ctx, c)))
		d := mustAllow(t, ctx, l, one(scope, rpm(10), 1), "on an old level")
		if got := d.Limits[0].Remaining; got != 2 {
			t.Fatalf("Remaining = %d after 1 of an old 3.5, want 2", got)
		}
		mustAllow(t, ctx, l, one(scope, rpm(10), 1), "second")
		mustAllow(t, ctx, l, one(scope, rpm(10), 1), "third")
		mustDeny(t, ctx, l, one(scope, rpm(10), 1), "fourth: 0.5 left of the old level")
	})

	t.Run("Reservation", func(t *testing.T) {
		A, C := newScope(t, "A"), newScope(t, "C")
		id := "old-" + randHex()
		spec := jsonSpec(t, A, time.Minute, []any{"r", A, 10, minute, 10, 4}, []any{"c", C, 1, 0, 1, 1})
		now := serverMicros(t, ctx, c)
		// The old version admitted it: 6 left, one permit held.
		set("HSET", base+":s", "b:"+A+":r:"+strconv.FormatInt(minute, 10), fmt.Sprintf("6 %d", now))
		set("ZADD", base+":c:"+C, strconv.FormatInt(now/1000+60_000, 10), id)
		set("SET", base+":r:"+id, "0\n"+spec+"\n1 0 0 6 24000 0 0", "PX", "60000")

		req := ratelimit.Request{ID: id, Charges: []ratelimit.Charge{{Scope: A, Limit: rpm(10), Cost: 4}, {Scope: C, Limit: conc(1)}}}
		d := mustAllow(t, ctx, l, req, "the same id again")
		if d.Limits[0].Remaining != 6 || d.Limits[0].Reset != 24*time.Second {
			t.Fatalf("Allow with the id of an old held reservation = %+v, want its decision", d)
		}
		if err := l.Extend(ctx, id, time.Minute); err != nil {
			t.Fatalf("Extend of an old reservation: %v", err)
		}
		if err := l.Settle(ctx, id, []int64{1, 1}); err != nil {
			t.Fatalf("Settle of an old reservation: %v", err)
		}
		if n := r.Int(t, "ZCARD", base+":c:"+C); n != 0 {
			t.Fatalf("%d permits after Settle, want 0", n)
		}
		if err := l.Settle(ctx, id, []int64{1, 1}); err != nil {
			t.Fatalf("second Settle: %v", err)
		}
		// 6 + 3 refunded (cost 4, actual 1), then this request's 1.
		d = mustAllow(t, ctx, l, one(A, rpm(10), 1), "after the settle")
		if got := d.Limits[0].Remaining; got != 8 {
			t.Fatalf("Remaining = %d, want 8 (6 + 3 refunded - 1)", got)
		}
	})

	t.Run("QueuedEntry", func(t *testing.T) {
		C := newScope(t, "C")
		id := "oldwaiter-" + randHex()
		now := serverMicros(t, ctx, c)
		// An old waiter queued behind the holder of the only permit.
		holder := mustAllow(t, ctx, l, one(C, conc(1), 1), "holder")
		set("SET", base+":e:"+id, jsonSpec(t, C, time.Minute, []any{"c", C, 1, 0, 1, 1}), "PX", "60000")
		set("ZADD", base+":q:"+C, "1", id)
		set("ZADD", base+":ql:"+C, strconv.FormatInt(now/1000+60_000, 10), id)
		if err := l.Settle(ctx, holder.ID, nil); err != nil {
			t.Fatal(err)
		}
		// The settle's walk admitted the old waiter and woke it.
		v, err := c.Do(ctx, c.B().Lpop().Key(base+":n:"+id).Build()).ToString()
		if err != nil || !strings.HasPrefix(v, "1 ") {
			t.Fatalf("wake-up of the old waiter = %q, %v; want an admission", v, err)
		}
		if n := r.Int(t, "ZCARD", base+":c:"+C); n != 1 {
			t.Fatalf("%d permits, want the old waiter's", n)
		}
		if n := r.Int(t, "EXISTS", base+":e:"+id, base+":q:"+C); n != 0 {
			t.Fatalf("%d of the old waiter's entry and lane left", n)
		}
		if err := l.Settle(ctx, id, nil); err != nil {
			t.Fatalf("Settle of the old waiter's admission: %v", err)
		}
		if n := r.Int(t, "ZCARD", base+":c:"+C); n != 0 {
			t.Fatalf("%d permits after Settle, want 0", n)
		}
	})
}

// TestSpecCarriesAnyBytes: the binary spec delimits strings by length, so
// scopes and lanes of any bytes — separators, NUL, bytes that are not UTF-8
// (the Backend does not check; the Limiter does) — and more charges than the
// scripts' ready-made formats (4) keep their own limits and settle exactly.
func TestSpecCarriesAnyBytes(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	b := redis.New(r.Client(t), redis.Config{})
	p := newScope(t, "")
	scopes := []string{p + "a b\nc", p + "x\x00y", p + "\xff\xfe", p + `{"c":[]}`, p + "é漢字", p + "\n", p + "h\x00\x00\x00"}
	for _, n := range []int{1, 4, 5, len(scopes)} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			req := &ratelimit.Request{ID: "bytes-" + randHex(), Lane: scopes[0] + "\xff", Hold: time.Minute}
			for i, s := range scopes[:n] {
				s += strconv.Itoa(n)
				kind := []ratelimit.Kind{ratelimit.Requests, ratelimit.Tokens, ratelimit.Concurrency}[i%3]
				lim := ratelimit.Limit{Kind: kind, Limit: int64(10 * (i + 1)), Window: time.Minute, Burst: int64(10 * (i + 1))}
				cost := int64(i + 1)
				if kind == ratelimit.Concurrency {
					lim.Window, lim.Burst, cost = 0, 0, 1
				}
				req.Charges = append(req.Charges, ratelimit.Charge{Scope: s, Limit: lim, Cost: cost})
			}
			d, err := b.Admit(ctx, req)
			if err != nil || !d.Allowed || len(d.Limits) != n {
				t.Fatalf("Admit = %+v, %v", d, err)
			}
			for i, st := range d.Limits {
				c := req.Charges[i]
				if st.Scope != c.Scope || st.Remaining != c.Limit.Limit-c.Cost {
					t.Fatalf("status %d = %+v, want %d left on %q", i, st, c.Limit.Limit-c.Cost, c.Scope)
				}
			}
			if err := b.Settle(ctx, req.ID, nil); err != nil {
				t.Fatal(err)
			}
			again := *req
			again.ID = "bytes-" + randHex()
			d, err = b.Admit(ctx, &again)
			if err != nil || !d.Allowed {
				t.Fatalf("Admit after the refund = %+v, %v", d, err)
			}
			for i, st := range d.Limits {
				c := req.Charges[i]
				if st.Remaining != c.Limit.Limit-c.Cost {
					t.Fatalf("after the refund, status %d = %+v, want %d left", i, st, c.Limit.Limit-c.Cost)
				}
			}
			if err := b.Settle(ctx, again.ID, make([]int64, n)); err != nil {
				t.Fatal(err)
			}
			if err := b.Settle(ctx, "bytes-unknown-"+randHex(), nil); !errors.Is(err, ratelimit.ErrUnknownReservation) {
				t.Fatalf("Settle of an unknown id = %v", err)
			}
		})
	}
}

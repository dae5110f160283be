package redis_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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

// bucketField reads a bucket's stored value (see lib.lua).
func bucketField(t *testing.T, ctx context.Context, c rueidis.Client, scope string, l ratelimit.Limit) string {
	t.Helper()
	kind := map[ratelimit.Kind]string{ratelimit.Requests: "r", ratelimit.Tokens: "t"}[l.Kind]
	v, err := c.Do(ctx, c.B().Hget().Key(base+":s").Field("b:"+scope+":"+kind+":"+strconv.FormatInt(l.Window.Microseconds(), 10)).Build()).ToString()
	if err != nil {
		t.Fatalf("HGET of the bucket of %q: %v", scope, err)
	}
	return v
}

// doubles unpacks little-endian doubles.
func doubles(v string) []float64 {
	var out []float64
	for i := 0; i+8 <= len(v); i += 8 {
		out = append(out, math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[i:i+8]))))
	}
	return out
}

func packDoubles(f ...float64) string {
	var b []byte
	for _, x := range f {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return string(b)
}

// TestLearnedLimitFormat: a bucket with a learned limit in force is stored
// as 32 bytes (level, updated_us, learned limit, end_us) and keeps them
// through admissions; the first write after the learned limit ended goes
// back to the 16 bytes of a plain bucket. A 32-byte field whose learned
// limit ended before it was read refills at the learned rate up to the end
// and at the charge's own rate after it.
func TestLearnedLimitFormat(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	c := r.Client(t)
	l := ratelimit.New(redis.New(c, redis.Config{}))

	t.Run("Written", func(t *testing.T) {
		S := newScope(t, "S")
		lim := rpm(600)
		const ttl = 400 * time.Millisecond
		before := serverMicros(t, ctx, c)
		if err := l.Learn(ctx, S, lim, ratelimit.Learned{Limit: 60, Remaining: 10, TTL: ttl}); err != nil {
			t.Fatal(err)
		}
		after := serverMicros(t, ctx, c)
		v := bucketField(t, ctx, c, S, lim)
		f := doubles(v)
		if len(v) != 32 || f[0] != 10 || f[1] < float64(before) || f[1] > float64(after) || f[2] != 60 || f[3] != f[1]+float64(ttl.Microseconds()) {
			t.Fatalf("bucket after Learn = %d bytes %v, want level 10, now, 60, now+%v", len(v), f, ttl)
		}
		d := mustAllow(t, ctx, l, one(S, lim, 1), "under the learned limit")
		if d.Limits[0].Remaining != 9 {
			t.Fatalf("Remaining %d, want 9", d.Limits[0].Remaining)
		}
		if g := doubles(bucketField(t, ctx, c, S, lim)); len(g) != 4 || g[2] != 60 || g[3] != f[3] {
			t.Fatalf("bucket after an admission = %v, want the learned limit kept", g)
		}
		// Past its end (time itself is the subject), the next write drops it.
		time.Sleep(time.Duration(int64(f[3])-serverMicros(t, ctx, c)+1000) * time.Microsecond)
		mustAllow(t, ctx, l, one(S, lim, 1), "after the learned limit ended")
		if v := bucketField(t, ctx, c, S, lim); len(v) != 16 {
			t.Fatalf("bucket after the learned limit ended = %d bytes %v, want 16", len(v), doubles(v))
		}
	})

	t.Run("EndedBeforeRead", func(t *testing.T) {
		S := newScope(t, "S")
		lim := rpm(600) // 10 a second; learned 60 a minute: 1 a second
		now := serverMicros(t, ctx, c)
		// Empty 2s ago, under a learned limit that ended 1s ago: 1 from the
		// learned second, 10 from the second at the charge's own rate.
		field := "b:" + S + ":r:" + strconv.FormatInt(time.Minute.Microseconds(), 10)
		if err := c.Do(ctx, c.B().Hset().Key(base+":s").FieldValue().FieldValue(field, packDoubles(0, float64(now-2_000_000), 60, float64(now-1_000_000))).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		d := mustAllow(t, ctx, l, one(S, lim, 1), "after a learned limit that ended")
		// 11 (and what refilled since now, well below one unit at 10/s
		// unless the machine stalls for 100ms) minus this request.
		if got := d.Limits[0].Remaining; got < 10 || got > 11 {
			t.Fatalf("Remaining %d, want 10 (1 at the learned rate, 10 at the own rate, minus 1)", got)
		}
		if v := bucketField(t, ctx, c, S, lim); len(v) != 16 {
			t.Fatalf("bucket = %d bytes, want 16", len(v))
		}
	})
}

// TestLearnedLimitCostsNoCommand: a learned limit lives in its bucket's
// field, so a decision under one runs the same commands as any other (one
// script, the same calls inside it).
func TestLearnedLimitCostsNoCommand(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	l := ratelimit.New(redis.New(r.Client(t), redis.Config{}))
	observer := r.Client(t)
	inside := func(dep string) int64 {
		t.Helper()
		req := ratelimit.Request{Charges: []ratelimit.Charge{
			{Scope: dep, Limit: rpm(100_000)},
			{Scope: dep, Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 10_000_000, Window: time.Minute}, Cost: 500},
			{Scope: dep + "/tenant", Limit: rpm(100_000)},
		}}
		mustAllow(t, ctx, l, req, "warm-up")
		before := commandstats(t, observer)
		const n = 50
		for i := range n {
			mustAllow(t, ctx, l, req, fmt.Sprintf("decision %d", i))
		}
		after := commandstats(t, observer)
		inner := int64(0)
		for cmd, calls := range after {
			switch cmd {
			case "evalsha", "eval", "info", "ping", "hello", "client", "script":
				// the script itself and what clients send around it
			default:
				inner += calls - before[cmd]
			}
		}
		if scripts := after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"]; scripts != n {
			t.Fatalf("%d scripts for %d decisions", scripts, n)
		}
		return inner
	}
	plain := inside(newScope(t, "plain"))
	learned := newScope(t, "learned")
	if err := l.Learn(ctx, learned, rpm(100_000), ratelimit.Learned{Limit: 50_000, Remaining: -1}); err != nil {
		t.Fatal(err)
	}
	if got := inside(learned); got != plain {
		t.Fatalf("%d commands inside 50 decisions under a learned limit, %d without", got, plain)
	}
}

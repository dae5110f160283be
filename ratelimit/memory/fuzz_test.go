package memory_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/memory"
)

// allowDuplicateCharges lets the fuzzer put two charges of one kind on one
// scope into a request. Such a request is accepted today and charges one
// bucket twice after checking each charge alone, so it can be admitted
// beyond the bucket (see the conformance test SameScopeTwoLimitsOfOneKind);
// set this once normalize rejects duplicates or the backends count them
// together.
const allowDuplicateCharges = false

// eps is the tolerance, in units, of the model's float arithmetic against
// the backend's: decisions this close to the edge are not judged.
const eps = 1e-6

// in decodes fuzz input; past its end it reads zeros.
type in struct {
	b []byte
	i int
}

func (r *in) more() bool { return r.i < len(r.b) }

func (r *in) byte() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

func (r *in) u16() int64 { return int64(r.byte())<<8 | int64(r.byte()) }

func (r *in) pick(n int) int { return int(r.byte()) % n }

var windows = []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, time.Minute, time.Hour, 24 * time.Hour}

var steps = []time.Duration{0, time.Nanosecond, time.Microsecond, time.Millisecond, 10 * time.Millisecond, 250 * time.Millisecond, time.Second, time.Minute, time.Hour}

var holds = []time.Duration{0, time.Millisecond, 50 * time.Millisecond, time.Second, time.Minute}

// mBucket is the model of one rate bucket.
type mBucket struct {
	lim   ratelimit.Limit // normalised: Burst filled in
	level float64
	at    time.Time
	seen  bool
	// learned is a limit learned from the provider (Learn), in force
	// until until; 0 if none was.
	learned int64
	until   time.Time
}

// params returns the bucket's rate and burst, under the learned limit or not.
func (b *mBucket) params(learned bool) (rate, burst float64) {
	lim, bu := b.lim.Limit, b.lim.Burst
	if learned {
		lim, bu = min(lim, b.learned), min(bu, b.learned)
	}
	return float64(lim) / float64(b.lim.Window), float64(bu)
}

func (b *mBucket) learnedAt(now time.Time) bool { return b.learned > 0 && now.Before(b.until) }

func (b *mBucket) rate(now time.Time) float64 { r, _ := b.params(b.learnedAt(now)); return r }

func (b *mBucket) burst(now time.Time) float64 { _, bu := b.params(b.learnedAt(now)); return bu }

func (b *mBucket) levelAt(now time.Time) float64 {
	if !b.seen {
		return float64(b.lim.Burst)
	}
	lv, at := b.level, b.at
	if b.learned > 0 && now.Before(b.until) {
		r, bu := b.params(true)
		return math.Min(bu, lv+float64(now.Sub(at))*r)
	}
	if b.learned > 0 && b.until.After(at) {
		// The learned limit ended since: its rate up to its end.
		r, bu := b.params(true)
		lv, at = math.Min(bu, lv+float64(b.until.Sub(at))*r), b.until
	}
	r, bu := b.params(false)
	return math.Min(bu, lv+float64(now.Sub(at))*r)
}

func (b *mBucket) set(level float64, now time.Time) { b.level, b.at, b.seen = level, now, true }

type mRes struct {
	charges []ratelimit.Charge // normalised costs
	expires time.Time
	settled bool
}

// model is what the backend should hold.
type model struct {
	buckets   map[string]*mBucket             // kind letter + scope
	permits   map[string]map[string]time.Time // scope -> id -> expiry
	limits    map[string]ratelimit.Limit      // scope -> concurrency limit
	cooldowns map[string]time.Time
	res       map[string]*mRes
	ids       []string // every reservation ever made, for Settle to pick from
}

func bucketKey(kind ratelimit.Kind, scope string) string { return kind.String() + ":" + scope }

func (m *model) live(scope string, now time.Time) int64 {
	n := int64(0)
	for _, exp := range m.permits[scope] {
		if now.Before(exp) {
			n++
		}
	}
	return n
}

func runFuzz(t *testing.T, data []byte) {
	r := &in{b: data}
	clk := clock.NewFake(start)
	l := ratelimit.New(memory.New(clk))
	ctx := t.Context()
	m := &model{
		buckets: map[string]*mBucket{}, permits: map[string]map[string]time.Time{},
		limits: map[string]ratelimit.Limit{}, cooldowns: map[string]time.Time{}, res: map[string]*mRes{},
	}
	// Three scopes, each with a requests, a tokens and a concurrency limit
	// fixed for the run (a bucket's limits never change under it).
	scopes := []string{"s0", "s1", "s2"}
	for _, s := range scopes {
		for _, kind := range []ratelimit.Kind{ratelimit.Requests, ratelimit.Tokens} {
			lim := ratelimit.Limit{Kind: kind, Window: windows[r.pick(len(windows))]}
			if kind == ratelimit.Requests {
				lim.Limit = 1 + int64(r.byte()%50)
			} else {
				lim.Limit = 1 + r.u16()%5000
			}
			switch r.pick(3) {
			case 1:
				lim.Burst = lim.Limit/2 + 1
			case 2:
				lim.Burst = 2 * lim.Limit
			}
			norm := lim
			if norm.Burst == 0 {
				norm.Burst = norm.Limit
			}
			m.buckets[bucketKey(kind, s)] = &mBucket{lim: norm}
		}
		m.limits[s] = ratelimit.Limit{Kind: ratelimit.Concurrency, Limit: int64(r.pick(4))} // 0: impossible
	}
	limitOf := func(kind ratelimit.Kind, s string) ratelimit.Limit {
		if kind == ratelimit.Concurrency {
			return m.limits[s]
		}
		lim := m.buckets[bucketKey(kind, s)].lim
		if r.pick(2) == 0 && lim.Burst == lim.Limit {
			lim.Burst = 0 // the default means the same
		}
		return lim
	}

	for op := 0; op < 300 && r.more(); op++ {
		now := clk.Now()
		switch r.pick(10) {
		case 0, 1: // Allow
			req := ratelimit.Request{Hold: holds[r.pick(len(holds))], Priority: ratelimit.Priority(r.pick(2))}
			used := map[string]bool{}
			impossible := false
			for range 1 + r.pick(3) {
				kind := ratelimit.Kind(1 + r.pick(3))
				s := scopes[r.pick(len(scopes))]
				if used[bucketKey(kind, s)] && !allowDuplicateCharges {
					continue
				}
				used[bucketKey(kind, s)] = true
				c := ratelimit.Charge{Scope: s, Limit: limitOf(kind, s)}
				switch kind {
				case ratelimit.Tokens:
					burst := m.buckets[bucketKey(kind, s)].lim.Burst
					c.Cost = r.u16() % (burst + 3)
					if c.Cost > burst {
						impossible = true
					}
				case ratelimit.Requests:
					c.Cost = int64(r.pick(3))
					if c.Cost > m.buckets[bucketKey(kind, s)].lim.Burst {
						impossible = true
					}
				case ratelimit.Concurrency:
					c.Cost = int64(r.pick(2))
					if c.Limit.Limit < 1 {
						impossible = true
					}
				}
				req.Charges = append(req.Charges, c)
			}
			checkAllow(t, l, m, req, impossible, now)
		case 2: // the clock moves
			clk.Advance(steps[r.pick(len(steps))] + time.Duration(r.byte())*time.Microsecond)
		case 3, 4: // Settle or Refund a reservation, known or not
			var id string
			if len(m.ids) > 0 && r.pick(8) != 0 {
				id = m.ids[r.pick(len(m.ids))]
			} else {
				id = fmt.Sprintf("unknown-%d", r.byte())
			}
			var actual []int64
			refund := r.pick(3) == 0
			if !refund {
				for range r.pick(4) {
					actual = append(actual, r.u16()%3000)
				}
			}
			var err error
			if refund {
				err = l.Refund(ctx, id)
			} else {
				err = l.Settle(ctx, id, actual)
			}
			res := m.res[id]
			switch {
			case res == nil || !now.Before(res.expires):
				if !errors.Is(err, ratelimit.ErrUnknownReservation) {
					t.Fatalf("op %d: Settle(%s) of an unknown or expired reservation = %v", op, id, err)
				}
			case res.settled:
				if err != nil {
					t.Fatalf("op %d: second Settle(%s) = %v, want nil", op, id, err)
				}
			default:
				if err != nil {
					t.Fatalf("op %d: Settle(%s) = %v", op, id, err)
				}
				res.settled = true
				for i, c := range res.charges {
					if c.Limit.Kind == ratelimit.Concurrency {
						delete(m.permits[c.Scope], id)
						continue
					}
					a := int64(0)
					if !refund {
						a = c.Cost
						if i < len(actual) {
							a = actual[i]
						}
					}
					b := m.buckets[bucketKey(c.Limit.Kind, c.Scope)]
					b.set(math.Min(b.burst(now), b.levelAt(now)-float64(a-c.Cost)), now)
				}
			}
		case 5: // Observe
			kind := ratelimit.Kind(1 + r.pick(2))
			s := scopes[r.pick(len(scopes))]
			rem := r.u16()%6000 - 5
			if err := l.Observe(ctx, s, limitOf(kind, s), rem); err != nil {
				t.Fatalf("op %d: Observe: %v", op, err)
			}
			b := m.buckets[bucketKey(kind, s)]
			if lv := b.levelAt(now); lv > float64(max(rem, 0)) {
				b.set(float64(max(rem, 0)), now)
			}
		case 9: // Learn
			kind := ratelimit.Kind(1 + r.pick(2))
			s := scopes[r.pick(len(scopes))]
			x := ratelimit.Learned{Limit: 1 + r.u16()%6000, Remaining: r.u16()%6000 - 100, TTL: time.Duration(1+r.u16()) * time.Millisecond}
			if err := l.Learn(ctx, s, limitOf(kind, s), x); err != nil {
				t.Fatalf("op %d: Learn: %v", op, err)
			}
			b := m.buckets[bucketKey(kind, s)]
			lv := b.levelAt(now)
			b.learned, b.until = x.Limit, now.Add(x.TTL)
			lv = math.Min(lv, b.burst(now))
			if x.Remaining >= 0 {
				lv = math.Min(lv, float64(x.Remaining))
			}
			b.set(lv, now)
		case 6: // Cooldown
			s := scopes[r.pick(len(scopes))]
			d := time.Duration(1+r.u16()) * time.Millisecond
			left, err := l.Cooldown(ctx, s, d)
			if err != nil {
				t.Fatalf("op %d: Cooldown: %v", op, err)
			}
			if end := now.Add(d); end.After(m.cooldowns[s]) {
				m.cooldowns[s] = end
			}
			if want := m.cooldowns[s].Sub(now); left != want {
				t.Fatalf("op %d: Cooldown(%v) = %v, want %v left", op, d, left, want)
			}
		case 7: // Extend
			if len(m.ids) == 0 {
				continue
			}
			id := m.ids[r.pick(len(m.ids))]
			hold := holds[1+r.pick(len(holds)-1)]
			err := l.Extend(ctx, id, hold)
			res := m.res[id]
			if res == nil || res.settled || !now.Before(res.expires) {
				if !errors.Is(err, ratelimit.ErrUnknownReservation) {
					t.Fatalf("op %d: Extend of a dead reservation = %v", op, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("op %d: Extend: %v", op, err)
			}
			res.expires = now.Add(hold)
			for _, c := range res.charges {
				if exp, ok := m.permits[c.Scope][id]; ok && now.Before(exp) {
					m.permits[c.Scope][id] = now.Add(hold)
				}
			}
		case 8: // a malformed request: refused, changing nothing
			bad := ratelimit.Limit{Kind: ratelimit.Kind(r.pick(5)), Limit: int64(int8(r.byte())), Window: time.Duration(int8(r.byte())) * time.Millisecond / 4, Burst: int64(int8(r.byte()))}
			req := ratelimit.Request{Hold: time.Duration(int8(r.byte())) * time.Microsecond * 10,
				Charges: []ratelimit.Charge{{Scope: scopes[r.pick(3)] + "-bad", Limit: bad, Cost: int64(int8(r.byte()))}}}
			if r.pick(4) == 0 {
				req.Charges[0].Scope = ""
			}
			d, err := l.Allow(ctx, req)
			if err == nil {
				// It may be valid after all; then it must behave like one.
				if d.Allowed {
					_ = l.Refund(ctx, d.ID)
				}
				continue
			}
			if !errors.Is(err, ratelimit.ErrInvalid) && !errors.Is(err, ratelimit.ErrImpossible) {
				t.Fatalf("op %d: malformed request: %v, want ErrInvalid or ErrImpossible", op, err)
			}
			if d.Allowed {
				t.Fatalf("op %d: malformed request admitted", op)
			}
		}
	}
}

// checkAllow makes one Allow and checks it against the model, then
// applies it to the model.
func checkAllow(t *testing.T, l *ratelimit.Limiter, m *model, req ratelimit.Request, impossible bool, now time.Time) {
	t.Helper()
	if len(req.Charges) == 0 {
		if _, err := l.Allow(t.Context(), req); !errors.Is(err, ratelimit.ErrInvalid) {
			t.Fatalf("request with no charges: %v, want ErrInvalid", err)
		}
		return
	}
	d, err := l.Allow(t.Context(), req)
	if impossible {
		if !errors.Is(err, ratelimit.ErrImpossible) {
			t.Fatalf("impossible request %+v: %v, want ErrImpossible", req.Charges, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Allow(%+v): %v", req.Charges, err)
	}
	if len(d.Limits) != len(req.Charges) {
		t.Fatalf("%d statuses for %d charges", len(d.Limits), len(req.Charges))
	}
	// What the model says: fits for sure, refused for sure, or too close.
	fits, refused, edge := true, false, false
	waitFor, first := time.Duration(0), -1
	need := map[string]float64{} // bucket -> total cost of this request on it
	for _, c := range req.Charges {
		if c.Limit.Kind != ratelimit.Concurrency {
			cost := c.Cost
			if cost == 0 && c.Limit.Kind == ratelimit.Requests {
				cost = 1
			}
			need[bucketKey(c.Limit.Kind, c.Scope)] += float64(cost)
		}
	}
	for i, c := range req.Charges {
		no := false
		var w time.Duration
		if end, ok := m.cooldowns[c.Scope]; ok && end.After(now) {
			no, w = true, end.Sub(now)
		}
		if c.Limit.Kind == ratelimit.Concurrency {
			if n := m.live(c.Scope, now); n+1 > c.Limit.Limit {
				// Full: a slot frees at the latest when the earliest permit
				// that must go expires.
				var exp []time.Time
				for _, e := range m.permits[c.Scope] {
					if now.Before(e) {
						exp = append(exp, e)
					}
				}
				slices.SortFunc(exp, func(a, b time.Time) int { return a.Compare(b) })
				no, w = true, max(w, exp[n-c.Limit.Limit].Sub(now), time.Nanosecond)
			}
		} else {
			b := m.buckets[bucketKey(c.Limit.Kind, c.Scope)]
			// A cost above a learned bucket waits for a full one.
			lv, cost := b.levelAt(now), math.Min(need[bucketKey(c.Limit.Kind, c.Scope)], b.burst(now))
			switch {
			case lv < cost-eps:
				no = true
				w = max(w, time.Duration(math.Ceil((cost-lv)/b.rate(now))))
			case lv < cost+eps:
				edge = true
			}
		}
		if no {
			fits, refused = false, true
			if first < 0 {
				first = i
			}
			waitFor = max(waitFor, w)
		}
	}
	switch {
	case d.Allowed && refused:
		t.Fatalf("admitted %+v, which the model refuses (statuses %+v)", req.Charges, d.Limits)
	case !d.Allowed && fits && !edge:
		t.Fatalf("refused %+v (by %q, retry after %v), which the model admits", req.Charges, d.DeniedBy, d.RetryAfter)
	case !d.Allowed && refused && !edge:
		if d.DeniedBy != req.Charges[first].Scope || d.DeniedKind != req.Charges[first].Limit.Kind {
			t.Fatalf("denied by %q %v, want the first refusing charge %q %v", d.DeniedBy, d.DeniedKind, req.Charges[first].Scope, req.Charges[first].Limit.Kind)
		}
		want := waitFor
		if tolerance := time.Microsecond + time.Duration(float64(want)*1e-6); d.RetryAfter < want-tolerance || d.RetryAfter > want+tolerance {
			t.Fatalf("RetryAfter = %v, want %v", d.RetryAfter, want)
		}
	}
	if !d.Allowed {
		if d.RetryAfter < 0 {
			t.Fatalf("negative RetryAfter %v", d.RetryAfter)
		}
		checkStatuses(t, m, req, d, now)
		return
	}
	res := &mRes{expires: now.Add(req.Hold)}
	if req.Hold == 0 {
		res.expires = now.Add(ratelimit.DefaultHold)
	}
	for _, c := range req.Charges {
		switch c.Limit.Kind {
		case ratelimit.Concurrency:
			if m.permits[c.Scope] == nil {
				m.permits[c.Scope] = map[string]time.Time{}
			}
			m.permits[c.Scope][d.ID] = res.expires
			c.Cost = 1
		default:
			if c.Cost == 0 && c.Limit.Kind == ratelimit.Requests {
				c.Cost = 1
			}
			b := m.buckets[bucketKey(c.Limit.Kind, c.Scope)]
			b.set(b.levelAt(now)-float64(c.Cost), now)
		}
		res.charges = append(res.charges, c)
	}
	m.res[d.ID] = res
	m.ids = append(m.ids, d.ID)
	checkStatuses(t, m, req, d, now)
}

// checkStatuses compares a decision's statuses with the model after it.
func checkStatuses(t *testing.T, m *model, req ratelimit.Request, d ratelimit.Decision, now time.Time) {
	t.Helper()
	for i, c := range req.Charges {
		st := d.Limits[i]
		if st.Scope != c.Scope || st.Kind != c.Limit.Kind || st.Limit != c.Limit.Limit {
			t.Fatalf("status %d = %+v for charge %+v", i, st, c)
		}
		if st.Remaining < 0 || st.Reset < 0 {
			t.Fatalf("status %d = %+v: negative", i, st)
		}
		if c.Limit.Kind == ratelimit.Concurrency {
			if want := max(c.Limit.Limit-m.live(c.Scope, now), 0); st.Remaining != want {
				t.Fatalf("status %d: %d permits left, model says %d", i, st.Remaining, want)
			}
			continue
		}
		b := m.buckets[bucketKey(c.Limit.Kind, c.Scope)]
		lv := b.levelAt(now)
		if st.Remaining > b.lim.Burst {
			t.Fatalf("status %d: %d left, above the burst %d", i, st.Remaining, b.lim.Burst)
		}
		if lo, hi := int64(math.Floor(lv-eps)), int64(math.Floor(lv+eps)); st.Remaining < max(lo, 0) || st.Remaining > max(hi, 0) {
			t.Fatalf("status %d: %d left, model says %.9f", i, st.Remaining, lv)
		}
		want := time.Duration(math.Ceil((b.burst(now) - lv) / b.rate(now)))
		if tolerance := time.Microsecond + time.Duration(float64(want)*1e-6); st.Reset < want-tolerance || st.Reset > want+tolerance {
			t.Fatalf("status %d: Reset %v, model says %v", i, st.Reset, want)
		}
	}
}

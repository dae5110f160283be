// Package memory is the in-process rate-limit backend, with the same semantics as the Redis backend (atomic multi-limit decisions, lanes walked in priority order, leases) for a single process.
package memory

import (
	"container/heap"
	"context"
	"hash/maphash"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/ratelimit"
)

const (
	maxScan  = 64 // waiters examined per walk of a lane, as in the Redis backend
	maxLanes = 32 // lanes walked after a settle (the rest keep their mark for the next)
	// sweepEvery is how many operations pass between sweeps of empty
	// permit sets and ended cooldowns.
	sweepEvery = 256
)

// Backend keeps limits in process memory.
type Backend struct {
	clk clock.Clock

	mu           sync.Mutex // protects everything below
	buckets      map[limitKey]*bucket
	permits      map[string]map[string]time.Time // scope -> reservation id -> expiry
	cooldowns    map[string]time.Time            // scope -> end
	lanes        map[string]*lane
	reservations map[string]*reservation // not settled yet
	expiries     expiryHeap              // reservations by expiry, to drop them without scanning
	// refunds holds the reservations that recorded their usage (Extend), by
	// expiry or earlier (an Extend does not move an entry; a popped entry
	// that is early is pushed again): when the next expiry may give
	// tokens back, for the waiters' hints.
	refunds refundHeap
	// settled marks the IDs settled while their hold runs (a second
	// Settle is a no-op until then), by a 128-bit hash of the ID, with no
	// pointer for the GC to follow: at thousands of requests a second, a
	// hold's worth of them is a large part of the heap.
	settled     map[settledKey]int64 // expiry, Unix ns
	settledExps settledHeap
	blocked     map[string]map[string]bool // scope -> lanes with waiters stuck on it
	seq         uint64
	ops         int
	seeds       [2]maphash.Seed // of settledKey
}

var _ ratelimit.InProcessBackend = (*Backend)(nil)

// InProcess marks the backend as one in this process (see
// ratelimit.InProcessBackend).
func (*Backend) InProcess() {}

type bucket struct {
	level float64
	at    time.Time
	// learned is the provider's own limit (Learn), in force until until;
	// 0 if none.
	learned int64
	until   time.Time
	// rate (units per ns) and burst are what the charge that last read
	// the bucket (levelLocked) gets: its own, or lower ones learned.
	rate, burst float64
}

type lane struct {
	entries []*entry // sorted by (priority, seq)
}

type entry struct {
	r       *ratelimit.Request
	seq     uint64
	expires time.Time
	wake    chan ratelimit.Decision // buffered(1): the decision of another's walk, or a hint
	hinted  time.Time               // when the last hint said it would fit
}

type reservation struct {
	r        *ratelimit.Request
	settled  bool // only on settledMark
	index    int  // in Backend.expiries
	expires  time.Time
	decision ratelimit.Decision
	// used is, per charge, what the request had used at its last Extend
	// that said so (its cost where it did not): what its rate charges are
	// settled at if it expires. nil: none recorded, the costs stand.
	used []int64
	// buckets are r's (levelsLocked), for Settle; usually in bucketsBuf.
	buckets    []*bucket
	bucketsBuf [4]*bucket
}

// New returns an empty backend on clk (nil means the real clock).
func New(clk clock.Clock) *Backend {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Backend{
		clk:          clk,
		buckets:      make(map[limitKey]*bucket),
		permits:      make(map[string]map[string]time.Time),
		cooldowns:    make(map[string]time.Time),
		lanes:        make(map[string]*lane),
		reservations: make(map[string]*reservation),
		settled:      make(map[settledKey]int64),
		seeds:        [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		blocked:      make(map[string]map[string]bool),
	}
}

// limitKey names one limit: two limits of one kind on one scope (RPM and
// RPD, say) differ by window. A struct, not a formatted string: it is built
// several times per decision and must not allocate.
type limitKey struct {
	kind   ratelimit.Kind
	window time.Duration
	scope  string
}

func limitID(c ratelimit.Charge) limitKey {
	return limitKey{c.Limit.Kind, c.Limit.Window, c.Scope}
}

func bucketKey(c ratelimit.Charge) limitKey { return limitID(c) }

func rate(c ratelimit.Charge) float64 { // units per nanosecond
	return float64(c.Limit.Limit) / float64(c.Limit.Window)
}

// learnedParams returns the rate and burst c gets under a learned limit:
// the lower of its own and the learned one (see lib.lua's new_bucket).
func learnedParams(c ratelimit.Charge, learned int64) (rate, burst float64) {
	lim, bu := c.Limit.Limit, c.Limit.Burst
	if learned < lim {
		lim = learned
	}
	if learned < bu {
		bu = learned
	}
	return float64(lim) / float64(c.Limit.Window), float64(bu)
}

// levelLocked returns c's bucket refilled to now, with the rate and burst
// c gets set; b.mu must be held.
func (b *Backend) levelLocked(c ratelimit.Charge, now time.Time) *bucket {
	k := bucketKey(c)
	bk := b.buckets[k]
	if bk == nil {
		bk = &bucket{level: float64(c.Limit.Burst), at: now, rate: rate(c), burst: float64(c.Limit.Burst)}
		b.buckets[k] = bk
		return bk
	}
	bk.refill(c, now)
	return bk
}

// levelsLocked returns the bucket of each of r's charges refilled to now
// (nil for a concurrency limit), in dst: one map lookup per charge per
// decision, however often the decision reads them. Buckets are never
// removed, so the pointers stay valid.
func (b *Backend) levelsLocked(r *ratelimit.Request, now time.Time, dst []*bucket) []*bucket {
	for _, c := range r.Charges {
		var bk *bucket
		if c.Limit.Kind != ratelimit.Concurrency {
			bk = b.levelLocked(c, now)
		}
		dst = append(dst, bk)
	}
	return dst
}

// refill brings bk to now under c's limit (or a lower learned one), with
// the rate and burst c gets set.
func (bk *bucket) refill(c ratelimit.Charge, now time.Time) {
	if bk.learned > 0 && !now.Before(bk.until) {
		// The learned limit ended since the last read: refill at its rate
		// up to its end, at c's own from then on.
		if bk.until.After(bk.at) {
			r, bu := learnedParams(c, bk.learned)
			bk.level = math.Min(bu, bk.level+float64(bk.until.Sub(bk.at))*r)
			bk.at = bk.until
		}
		bk.learned = 0
	}
	if bk.learned > 0 {
		bk.rate, bk.burst = learnedParams(c, bk.learned)
	} else {
		bk.rate, bk.burst = rate(c), float64(c.Limit.Burst)
	}
	if now.After(bk.at) {
		bk.level = math.Min(bk.burst, bk.level+float64(now.Sub(bk.at))*bk.rate)
		bk.at = now
	}
}

// permitsLocked returns the live permits of c's scope; b.mu must be held.
func (b *Backend) permitsLocked(scope string, now time.Time) map[string]time.Time {
	p := b.permits[scope]
	if p == nil {
		p = make(map[string]time.Time)
		b.permits[scope] = p
	}
	for id, exp := range p {
		if !now.Before(exp) {
			delete(p, id)
		}
	}
	return p
}

// evaluateLocked mirrors evaluate() in lib.lua.
// bks are r's buckets (levelsLocked).
func (b *Backend) evaluateLocked(r *ratelimit.Request, bks []*bucket, blocked map[limitKey]bool, now time.Time) (ok bool, wait time.Duration, first int, refused []ratelimit.Charge) {
	ok = true
	unknown := false
	deferable := true // refused only for tokens not there yet
	first = -1
	for i, c := range r.Charges {
		var w time.Duration
		deny, wUnknown := false, false
		if end, has := b.cooldowns[c.Scope]; has && end.After(now) {
			deny, w, deferable = true, end.Sub(now), false
		}
		if blocked[limitID(c)] {
			deny, wUnknown, deferable = true, true, false
		}
		if c.Limit.Kind == ratelimit.Concurrency {
			if p := b.permitsLocked(c.Scope, now); int64(len(p))+1 > c.Limit.Limit {
				deferable = false
				// Full: at the latest, a slot frees when the earliest permit
				// that must go expires (a release frees one sooner).
				exp := make([]time.Time, 0, len(p))
				for _, t := range p {
					exp = append(exp, t)
				}
				slices.SortFunc(exp, func(a, b time.Time) int { return a.Compare(b) })
				deny = true
				w = max(w, exp[int64(len(p))-c.Limit.Limit].Sub(now), time.Nanosecond)
			}
		} else {
			bk := bks[i]
			// A learned bucket smaller than the cost: wait for a full one.
			if cost := math.Min(float64(c.Cost), bk.burst); bk.level < cost {
				need := time.Duration(math.Ceil((cost - bk.level) / bk.rate))
				deny = true
				w = max(w, need)
			}
		}
		if deny {
			ok = false
			if first < 0 {
				first = i
			}
			refused = append(refused, c)
			if wUnknown {
				unknown = true
			}
			wait = max(wait, w)
		}
	}
	if ok || unknown {
		wait = 0
	}
	if !ok && deferable && !unknown && wait <= r.Defer {
		// Admit now, to start when the tokens exist (see lib.lua).
		return true, wait, -1, nil
	}
	return ok, wait, first, refused
}

func (b *Backend) chargeLocked(r *ratelimit.Request, bks []*bucket, now time.Time) {
	for i, c := range r.Charges {
		if c.Limit.Kind == ratelimit.Concurrency {
			b.permitsLocked(c.Scope, now)[r.ID] = now.Add(r.Hold)
			continue
		}
		bks[i].level -= float64(c.Cost)
	}
}

func (b *Backend) decisionLocked(r *ratelimit.Request, bks []*bucket, ok bool, wait time.Duration, first int, now time.Time) ratelimit.Decision {
	d := ratelimit.Decision{ID: r.ID, Allowed: ok, Limits: make([]ratelimit.Status, len(r.Charges))}
	if ok {
		d.Delay = wait
	}
	for i, c := range r.Charges {
		st := ratelimit.Status{Scope: c.Scope, Kind: c.Limit.Kind, Limit: c.Limit.Limit}
		if c.Limit.Kind == ratelimit.Concurrency {
			st.Remaining = max(c.Limit.Limit-int64(len(b.permitsLocked(c.Scope, now))), 0)
		} else {
			bk := bks[i]
			st.Remaining = max(int64(math.Floor(bk.level)), 0)
			st.Reset = max(time.Duration(math.Ceil((bk.burst-bk.level)/bk.rate)), 0)
		}
		d.Limits[i] = st
	}
	if !ok {
		d.RetryAfter = wait
		if first >= 0 {
			d.DeniedBy = r.Charges[first].Scope
			d.DeniedKind = r.Charges[first].Limit.Kind
		}
	}
	return d
}

func (b *Backend) reserveLocked(r *ratelimit.Request, bks []*bucket, d ratelimit.Decision, now time.Time) {
	res := &reservation{r: r, expires: now.Add(r.Hold), decision: d}
	res.buckets = append(res.bucketsBuf[:0], bks...)
	b.reservations[r.ID] = res
	b.expiries.push(expiry{at: res.expires, id: r.ID, res: res})
}

// expiry is a reservation's place in the expiry heap. Extend moves a
// reservation's expiry later without touching the heap: a popped entry
// whose reservation now expires later is pushed back.
type expiry struct {
	at  time.Time
	id  string
	res *reservation
}

type expiryHeap []expiry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].res.index, h[j].res.index = i, j
}
func (h *expiryHeap) Push(x any) {
	e := x.(expiry)
	e.res.index = len(*h)
	*h = append(*h, e)
}
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = expiry{}
	*h = old[:len(old)-1]
	x.res.index = -1
	return x
}

// push, and remove below, are heap.Push and heap.Remove without boxing
// the element in an interface: an allocation each.
func (h *expiryHeap) push(e expiry) {
	e.res.index = len(*h)
	*h = append(*h, e)
	heap.Fix(h, len(*h)-1)
}

func (h *expiryHeap) remove(i int) expiry {
	n := len(*h) - 1
	if i != n {
		h.Swap(i, n)
	}
	x := (*h)[n]
	(*h)[n] = expiry{}
	*h = (*h)[:n]
	if i < n {
		heap.Fix(h, i)
	}
	x.res.index = -1
	return x
}

// refundHeap orders reservations with recorded usage by expiry (see
// Backend.refunds). Pushed once per reservation, it needs no index.
type refundHeap []expiry

func (h refundHeap) Len() int           { return len(h) }
func (h refundHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h refundHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *refundHeap) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *refundHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = expiry{}
	*h = old[:len(old)-1]
	return x
}

// settledKey is a settled reservation's ID, hashed.
type settledKey [2]uint64

func (b *Backend) settledKeyOf(id string) settledKey {
	return settledKey{maphash.String(b.seeds[0], id), maphash.String(b.seeds[1], id)}
}

// settledMark is what reservationLocked returns for a settled ID. Nothing
// may change it.
var settledMark = &reservation{settled: true, index: -1}

type settledExpiry struct {
	at  int64 // Unix ns
	key settledKey
}

// settledHeap orders the settled marks by expiry; it holds no pointers.
type settledHeap []settledExpiry

func (h settledHeap) Len() int           { return len(h) }
func (h settledHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h settledHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *settledHeap) Push(x any)        { *h = append(*h, x.(settledExpiry)) }
func (h *settledHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (h *settledHeap) push(e settledExpiry) {
	*h = append(*h, e)
	heap.Fix(h, len(*h)-1)
}

func (h *settledHeap) popMin() settledExpiry {
	n := len(*h) - 1
	h.Swap(0, n)
	x := (*h)[n]
	*h = (*h)[:n]
	if n > 0 {
		heap.Fix(h, 0)
	}
	return x
}

// expireLocked drops the reservations that expired by now: O(log n) each,
// so the cost of a decision does not grow with the reservations held. The
// rate charges of one that recorded its usage are settled at that usage,
// and the lanes that may now have room are walked, as after a Settle.
// Every call that reads or changes buckets or reservations runs it first,
// so that a refund is never applied after something that followed the
// expiry (mirrors sweep_refunds in lib.lua).
func (b *Backend) expireLocked(now time.Time) {
	var lanes []string
	for len(b.expiries) > 0 && !now.Before(b.expiries[0].at) {
		e := b.expiries.remove(0)
		if now.Before(e.res.expires) {
			b.expiries.push(expiry{at: e.res.expires, id: e.id, res: e.res})
			continue
		}
		if b.reservations[e.id] == e.res {
			delete(b.reservations, e.id)
			if e.res.used != nil {
				lanes = b.refundLocked(e.res, now, lanes)
			}
		}
	}
	for len(b.refunds) > 0 && !now.Before(b.refunds[0].at) {
		e := heap.Pop(&b.refunds).(expiry)
		if b.reservations[e.id] == e.res && now.Before(e.res.expires) {
			heap.Push(&b.refunds, expiry{at: e.res.expires, id: e.id, res: e.res}) // extended since
		}
	}
	for _, ln := range lanes {
		if b.lanes[ln] != nil {
			b.walkLocked(ln, "", now)
		}
	}
	for ns := now.UnixNano(); len(b.settledExps) > 0 && b.settledExps[0].at <= ns; {
		e := b.settledExps.popMin()
		if b.settled[e.key] == e.at { // not settled again since, with a later hold
			delete(b.settled, e.key)
		}
	}
}

// reservationLocked returns id's reservation unless it expired:
// settledMark if it was settled.
func (b *Backend) reservationLocked(id string, now time.Time) *reservation {
	res := b.liveReservationLocked(id, now)
	if res == nil && len(b.settled) > 0 {
		if exp, ok := b.settled[b.settledKeyOf(id)]; ok && now.UnixNano() < exp {
			return settledMark
		}
	}
	return res
}

// refundLocked settles the rate charges of res, which expired unsettled,
// at the usage it recorded, and returns lanes with those that may now have
// room added.
func (b *Backend) refundLocked(res *reservation, now time.Time, lanes []string) []string {
	if !slices.Contains(lanes, res.r.Lane) {
		lanes = append(lanes, res.r.Lane)
	}
	for i, c := range res.r.Charges {
		if c.Limit.Kind == ratelimit.Concurrency {
			continue // its permit is gone with the reservation
		}
		bk := res.buckets[i]
		bk.refill(c, now)
		bk.level = math.Min(bk.burst, bk.level-float64(res.used[i]-c.Cost))
		lanes = b.blockedLanesLocked(c.Scope, lanes)
	}
	return lanes
}

// blockedLanesLocked adds to lanes those whose waiters are blocked on
// scope, up to maxLanes in all, and forgets them as blocked: the walk
// that follows marks them again if they still are.
func (b *Backend) blockedLanesLocked(scope string, lanes []string) []string {
	set := b.blocked[scope]
	if set == nil {
		return lanes
	}
	for ln := range set {
		if len(lanes) < maxLanes && !slices.Contains(lanes, ln) {
			lanes = append(lanes, ln)
			delete(set, ln)
		}
	}
	if len(set) == 0 {
		delete(b.blocked, scope)
	}
	return lanes
}

// soonerLocked shortens wait, how long a waiter is told to sleep, to when
// the next reservation with recorded usage expires, if that is sooner:
// the expiry may give back what the waiter needs.
func (b *Backend) soonerLocked(wait time.Duration, now time.Time) time.Duration {
	if wait > 0 && len(b.refunds) > 0 {
		if d := b.refunds[0].at.Sub(now); d > 0 && d < wait {
			return d
		}
	}
	return wait
}

// liveReservationLocked returns id's reservation if it is neither settled
// nor expired. It does not look among the settled marks: most callers
// treat a settled ID as an unknown one, and at thousands of requests a
// second the marks are a large map, a cache miss to read.
func (b *Backend) liveReservationLocked(id string, now time.Time) *reservation {
	res := b.reservations[id]
	if res != nil && !now.Before(res.expires) {
		return nil // expireLocked drops it, and settles it if it recorded its usage
	}
	return res
}

// sweepLocked drops expired reservations, and now and then empty permit
// sets and ended cooldowns, bounding memory.
func (b *Backend) sweepLocked(now time.Time) {
	b.expireLocked(now)
	b.ops++
	if b.ops%sweepEvery != 0 {
		return
	}
	for scope := range b.permits {
		if len(b.permitsLocked(scope, now)) == 0 {
			delete(b.permits, scope)
		}
	}
	for scope, end := range b.cooldowns {
		if !end.After(now) {
			delete(b.cooldowns, scope)
		}
	}
}

func (b *Backend) laneLocked(name string) *lane {
	l := b.lanes[name]
	if l == nil {
		l = &lane{}
		b.lanes[name] = l
	}
	return l
}

func (l *lane) remove(id string) *entry {
	for i, e := range l.entries {
		if e.r.ID == id {
			l.entries = append(l.entries[:i], l.entries[i+1:]...)
			return e
		}
	}
	return nil
}

func (l *lane) find(id string) *entry {
	for _, e := range l.entries {
		if e.r.ID == id {
			return e
		}
	}
	return nil
}

// walkLocked mirrors walk() in lib.lua: it admits, in order, every waiter
// of the lane that fits and wakes each (self's result is returned instead).
func (b *Backend) walkLocked(name, self string, now time.Time) (mine *ratelimit.Decision, mineAdmitted bool, mineWait time.Duration) {
	l := b.lanes[name]
	if l == nil {
		return nil, false, 0
	}
	// Made when a waiter is refused: a map kept on the stack would make
	// the frame large enough to grow the stack of every short-lived
	// goroutine that settles (the gateway's settles run in one each).
	var blocked map[limitKey]bool
	var buf [8]*bucket
	headed := false
	scanned := 0
	for i := 0; i < len(l.entries) && scanned < maxScan; {
		e := l.entries[i]
		scanned++
		if !now.Before(e.expires) {
			l.entries = append(l.entries[:i], l.entries[i+1:]...) // died while queued
			continue
		}
		bks := b.levelsLocked(e.r, now, buf[:0])
		ok, wait, first, refused := b.evaluateLocked(e.r, bks, blocked, now)
		if ok {
			b.chargeLocked(e.r, bks, now)
			d := b.decisionLocked(e.r, bks, true, wait, -1, now)
			l.entries = append(l.entries[:i], l.entries[i+1:]...)
			b.reserveLocked(e.r, bks, d, now)
			if e.r.ID == self {
				mine, mineAdmitted = &d, true
			} else {
				select {
				case <-e.wake: // drop a hint not yet read
				default:
				}
				e.wake <- d
			}
			continue
		}
		for _, c := range refused {
			if blocked == nil {
				blocked = make(map[limitKey]bool)
			}
			blocked[limitID(c)] = true
			set := b.blocked[c.Scope]
			if set == nil {
				set = make(map[string]bool)
				b.blocked[c.Scope] = set
			}
			set[name] = true
		}
		if e.r.ID == self {
			d := b.decisionLocked(e.r, bks, false, wait, first, now)
			mine, mineWait = &d, wait
		} else if !headed && wait > 0 {
			// The first waiter that cannot go yet learns when it will fit,
			// or when an expiry may give back what it needs.
			wait = b.soonerLocked(wait, now)
			if target := now.Add(wait); e.hinted.Sub(target).Abs() > time.Millisecond {
				e.hinted = target
				select {
				case e.wake <- ratelimit.Decision{ID: e.r.ID, RetryAfter: wait}:
				default: // an unread hint is there; the waiter re-checks anyway
				}
			}
		}
		headed = true
		i++
	}
	if len(l.entries) == 0 {
		delete(b.lanes, name)
	}
	return mine, mineAdmitted, mineWait
}

func (b *Backend) admit(r *ratelimit.Request, queue bool, lease time.Duration) (d ratelimit.Decision, admitted bool, e *entry) {
	now := b.clk.Now()
	b.sweepLocked(now)
	if res := b.liveReservationLocked(r.ID, now); res != nil {
		return res.decision, true, nil // admitted by another caller's walk
	}
	l := b.lanes[r.Lane]
	if l == nil || len(l.entries) == 0 {
		// Fast path: nobody waits in this lane.
		var buf [8]*bucket
		bks := b.levelsLocked(r, now, buf[:0])
		ok, wait, first, _ := b.evaluateLocked(r, bks, nil, now)
		if ok {
			b.chargeLocked(r, bks, now)
			d := b.decisionLocked(r, bks, true, wait, -1, now)
			b.reserveLocked(r, bks, d, now)
			return d, true, nil
		}
		if !queue {
			return b.decisionLocked(r, bks, false, wait, first, now), false, nil
		}
	}
	if !queue {
		lease = time.Second
	}
	l = b.laneLocked(r.Lane)
	e = l.find(r.ID)
	if e == nil {
		b.seq++
		e = &entry{r: r, seq: b.seq, wake: make(chan ratelimit.Decision, 1)}
		i := sort.Search(len(l.entries), func(i int) bool {
			x := l.entries[i]
			return x.r.Priority > r.Priority || (x.r.Priority == r.Priority && x.seq > e.seq)
		})
		l.entries = append(l.entries, nil)
		copy(l.entries[i+1:], l.entries[i:])
		l.entries[i] = e
	}
	e.expires = now.Add(lease)
	mine, ok, _ := b.walkLocked(r.Lane, r.ID, now)
	if ok {
		return *mine, true, nil
	}
	if !queue {
		if lane := b.lanes[r.Lane]; lane != nil {
			lane.remove(r.ID)
			if len(lane.entries) == 0 {
				delete(b.lanes, r.Lane)
			}
		}
	}
	if mine != nil {
		return *mine, false, e
	}
	// Queued beyond the part of the lane a walk examines.
	var buf [8]*bucket
	bks := b.levelsLocked(r, now, buf[:0])
	_, _, first, _ := b.evaluateLocked(r, bks, nil, now)
	return b.decisionLocked(r, bks, false, 0, first, now), false, e
}

// Admit makes one attempt; see ratelimit.Backend.
func (b *Backend) Admit(_ context.Context, r *ratelimit.Request) (ratelimit.Decision, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, _, _ := b.admit(r, false, 0)
	return d, nil
}

// Enqueue queues r (or renews its place) and walks its lane.
func (b *Backend) Enqueue(_ context.Context, r *ratelimit.Request, lease time.Duration) (ratelimit.Decision, bool, time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok, _ := b.admit(r, true, lease)
	// Asked again when it fits, or when an expiry may give back what it needs.
	return d, ok, b.soonerLocked(d.RetryAfter, b.clk.Now()), nil
}

// Await waits up to timeout for another caller's walk to admit r.
func (b *Backend) Await(ctx context.Context, r *ratelimit.Request, timeout time.Duration) (ratelimit.Decision, bool, error) {
	b.mu.Lock()
	var wake chan ratelimit.Decision
	if l := b.lanes[r.Lane]; l != nil {
		if e := l.find(r.ID); e != nil {
			wake = e.wake
		}
	}
	if wake == nil {
		// Not queued: admitted meanwhile, or evicted.
		now := b.clk.Now()
		b.expireLocked(now)
		res := b.liveReservationLocked(r.ID, now)
		b.mu.Unlock()
		if res != nil {
			return res.decision, true, nil
		}
		return ratelimit.Decision{}, false, nil
	}
	b.mu.Unlock()
	fired := make(chan struct{})
	t := b.clk.AfterFunc(timeout, func() { close(fired) })
	defer t.Stop()
	select {
	case d := <-wake:
		return d, d.Allowed, nil
	case <-fired:
		return ratelimit.Decision{}, false, nil
	case <-ctx.Done():
		return ratelimit.Decision{}, false, ctx.Err()
	}
}

// Abandon takes r out of its lane, refunding it if it was admitted meanwhile.
func (b *Backend) Abandon(_ context.Context, r *ratelimit.Request) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.lanes[r.Lane]; l != nil {
		l.remove(r.ID)
		if len(l.entries) == 0 {
			delete(b.lanes, r.Lane)
		}
	}
	now := b.clk.Now()
	b.expireLocked(now)
	b.settleLocked(r.ID, nil, now)
	return nil
}

// Settle applies the real costs; nil actual refunds everything.
func (b *Backend) Settle(_ context.Context, id string, actual []int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clk.Now()
	b.expireLocked(now)
	if b.settleLocked(id, actual, now) == 0 {
		return ratelimit.ErrUnknownReservation
	}
	return nil
}

// settleLocked mirrors settle() in lib.lua: 0 unknown, 1 settled, 2 already.
func (b *Backend) settleLocked(id string, actual []int64, now time.Time) int {
	res := b.reservationLocked(id, now)
	if res == nil {
		return 0
	}
	if res.settled {
		return 2
	}
	var lanesBuf [8]string
	lanes := append(lanesBuf[:0], res.r.Lane) // to walk, at most maxLanes
	for i, c := range res.r.Charges {
		if c.Limit.Kind == ratelimit.Concurrency {
			delete(b.permitsLocked(c.Scope, now), id)
		} else {
			a := int64(0)
			if actual != nil {
				a = c.Cost
				if i < len(actual) {
					a = actual[i]
				}
			}
			bk := res.buckets[i]
			bk.refill(c, now)
			bk.level = math.Min(bk.burst, bk.level-float64(a-c.Cost))
		}
		lanes = b.blockedLanesLocked(c.Scope, lanes)
	}
	// Only the settled mark is read from now on (until the hold expires),
	// kept where the garbage collector does not look.
	delete(b.reservations, id)
	if res.index >= 0 {
		b.expiries.remove(res.index)
	}
	key, exp := b.settledKeyOf(id), res.expires.UnixNano()
	b.settled[key] = exp
	b.settledExps.push(settledExpiry{at: exp, key: key})
	for _, ln := range lanes {
		if b.lanes[ln] != nil { // checked here: walkLocked's frame is large
			b.walkLocked(ln, "", now)
		}
	}
	return 1
}

// Extend keeps an unsettled reservation alive for hold from now, and
// records used (when not empty) as what it has used so far.
func (b *Backend) Extend(_ context.Context, id string, hold time.Duration, used []int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clk.Now()
	b.expireLocked(now)
	res := b.liveReservationLocked(id, now)
	if res == nil {
		return ratelimit.ErrUnknownReservation
	}
	res.expires = now.Add(hold)
	if len(used) > 0 {
		if res.used == nil {
			res.used = make([]int64, len(res.r.Charges))
			heap.Push(&b.refunds, expiry{at: res.expires, id: id, res: res})
		}
		for i, c := range res.r.Charges {
			res.used[i] = c.Cost
			if i < len(used) {
				res.used[i] = used[i]
			}
		}
	}
	for _, c := range res.r.Charges {
		if c.Limit.Kind == ratelimit.Concurrency {
			p := b.permitsLocked(c.Scope, now)
			if _, ok := p[id]; ok {
				p[id] = now.Add(hold)
			}
		}
	}
	return nil
}

// Cooldown holds back scope for d, never shortening a longer cooldown.
func (b *Backend) Cooldown(_ context.Context, scope string, d time.Duration) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clk.Now()
	want := now.Add(d)
	if cur, ok := b.cooldowns[scope]; ok && !cur.Before(want) {
		return cur.Sub(now), nil
	}
	b.cooldowns[scope] = want
	return d, nil
}

// Observe lowers scope's bucket for l to at most remaining.
func (b *Backend) Observe(_ context.Context, scope string, l ratelimit.Limit, remaining int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clk.Now()
	b.expireLocked(now) // what expired gives back before the provider's count lowers the bucket
	bk := b.levelLocked(ratelimit.Charge{Scope: scope, Limit: l}, now)
	if bk.level > float64(remaining) {
		bk.level = float64(remaining)
	}
	return nil
}

// Learn records the provider's own limit for scope's bucket of l; see
// ratelimit.Backend.
func (b *Backend) Learn(_ context.Context, scope string, l ratelimit.Limit, x ratelimit.Learned) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clk.Now()
	b.expireLocked(now)
	c := ratelimit.Charge{Scope: scope, Limit: l}
	bk := b.levelLocked(c, now) // up to now under what was in force
	bk.learned, bk.until = x.Limit, now.Add(x.TTL)
	bk.rate, bk.burst = learnedParams(c, x.Limit)
	bk.level = math.Min(bk.level, bk.burst)
	if x.Remaining >= 0 {
		bk.level = math.Min(bk.level, float64(x.Remaining))
	}
	return nil
}

// Waiters returns how many requests wait in lane.
func (b *Backend) Waiters(_ context.Context, lane string) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.lanes[lane]; l != nil {
		return len(l.entries), nil
	}
	return 0, nil
}

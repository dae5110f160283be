package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmgate/llmgate/clock"
)

// LocalQuota configures admission from blocks of capacity reserved in the
// store ahead of time; see WithLocalQuota. Zero fields take the defaults.
type LocalQuota struct {
	// Window is how long a block admits requests after the store granted
	// it; its unused part then goes back to the store. It also bounds how
	// long this replica keeps admitting from a block after a Cooldown,
	// Observe or Learn made on another replica. Default DefaultLocalWindow.
	Window time.Duration
	// MaxBlock bounds how many requests one block is sized for. Default
	// DefaultLocalMaxBlock.
	MaxBlock int
	// Headroom keeps blocks away from exhausted limits: a block is taken
	// only while every limit it charges had at least Headroom times the
	// block left at the last decision. Near a limit, admission is back to
	// exact, queued, per-request decisions. Default DefaultLocalHeadroom.
	Headroom int
}

// Defaults for LocalQuota.
const (
	DefaultLocalWindow   = 100 * time.Millisecond
	DefaultLocalMaxBlock = 128
	DefaultLocalHeadroom = 8
)

// localPrefix starts the reservation ID of every locally admitted request.
// IDs the limiter generates otherwise are plain hex, so a Settle of a
// local ID that is no longer held can be told apart: its block has gone
// back to the store already, so it was settled.
const localPrefix = "local-"

// returnMargin is how much longer than a block's deadline its store
// reservation lives: time for the block to go back before the store
// forgets it (and keeps its estimate).
const returnMargin = 30 * time.Second

// WithLocalQuota lets the Limiter admit most requests without a store round
// trip. When a request finds no block for its set of limits, the Limiter
// asks the store, in the usual one atomic decision, for a block of several
// requests' worth on every limit (sized from the recent demand, at most
// MaxBlock requests); the requests that follow within Window take their
// share from it locally. When the block is used up or its Window is over,
// the next request asks for a new one; once every request admitted from a
// block is settled, the block is settled in the store with their real
// costs, and what was not used is refunded.
//
// Nothing is ever admitted that the store did not grant first, so limits
// are never exceeded. What changes: capacity sits in a replica's block for
// up to Window (blocks are only taken far from a limit, see Headroom);
// requests admitted from a block skip the store's queue, so priorities and
// arrival order apply only near a limit, where admission is per-request
// again; a Cooldown, Observe or Learn retires this replica's blocks at
// once but reaches other replicas' blocks only when they end. Requests with
// concurrency charges or a caller-chosen ID always go to the store. Call
// Close to return held blocks when the process stops.
//
// It pays most with a remote store (Redis), and also with the memory
// backend under load: one decision for a block costs less than a
// reservation and a settled mark for each of its requests.
func WithLocalQuota(q LocalQuota) Option {
	return func(x *Limiter) { x.localCfg = &q }
}

// WithClock sets the clock the local quota's windows run on (default: the
// real clock); for tests.
func WithClock(c clock.Clock) Option { return func(x *Limiter) { x.clk = c } }

// localQuota holds the blocks of one Limiter.
type localQuota struct {
	cfg LocalQuota
	b   Backend
	log *slog.Logger
	clk clock.Clock

	mu    sync.Mutex
	pools map[string]*pool      // protected by mu; by signature of a request's limits
	held  map[string]*localHold // protected by mu; by reservation ID, until the block returns
	// returning counts blocks being returned in the background; idle is
	// closed when it drops to zero (protected by mu). Unlike a
	// sync.WaitGroup, returns may start while close waits.
	returning int
	idle      chan struct{}
}

// pool is what one set of limits has locally.
type pool struct {
	scopes    []string // per charge, its scope
	kinds     []Kind   // per charge, its kind and window: with the scope, its bucket
	windows   []time.Duration
	blk       *block          // admitting now, or nil
	refill    chan struct{}   // closed when the block request in flight returns; nil if none
	size      int             // requests the next block is sized for; below 2, none is asked
	remaining []int64         // per charge, what the store had left at the last decision; nil if unknown
	reset     []time.Duration // per charge, from the same decision
	lastStore time.Time       // when a request last went to the store without a block
	lastUse   time.Time
}

// block is capacity granted by the store to this replica.
type block struct {
	id          string // the store reservation
	p           *pool
	n, admitted int         // requests it was sized for; requests it admitted
	cost        []int64     // per charge, what the store reserved for the block
	left        []int64     // per charge, not handed out yet
	used        []int64     // per charge, real costs of settled requests plus estimates of the others
	outstanding int         // admitted and not settled
	until       time.Time   // admits until then
	deadline    time.Time   // goes back by then even with requests unsettled: their hold is over
	lapse       clock.Timer // fires at deadline
	retired     bool        // admits no more
	forfeit     []bool      // per charge, nil if none: goes back as reserved (a learned count superseded it)
	returned    bool        // settled in the store
	ids         []string
	timer       clock.Timer
}

// localHold is one request admitted from a block.
type localHold struct {
	blk     *block
	cost    []int64
	used    []int64 // per charge, the usage its last Extend recorded; nil if none
	settled bool
}

func newLocalQuota(cfg LocalQuota, b Backend, log *slog.Logger, clk clock.Clock) *localQuota {
	if cfg.Window <= 0 {
		cfg.Window = DefaultLocalWindow
	}
	if cfg.MaxBlock <= 0 {
		cfg.MaxBlock = DefaultLocalMaxBlock
	}
	if cfg.Headroom <= 0 {
		cfg.Headroom = DefaultLocalHeadroom
	}
	return &localQuota{cfg: cfg, b: b, log: log, clk: clk, pools: map[string]*pool{}, held: map[string]*localHold{}}
}

// eligible reports whether r may be admitted from a block.
func eligible(r *Request, chosenID bool) bool {
	if chosenID {
		return false
	}
	for _, c := range r.Charges {
		if c.Limit.Kind == Concurrency {
			return false
		}
	}
	return true
}

// appendSignature appends to b the name of the buckets r charges (and of
// its lane): requests with the same signature share blocks. Built in the
// caller's buffer, it costs no allocation on the way to a pool that exists.
func appendSignature(b []byte, r *Request) []byte {
	b = append(b, r.Lane...)
	for _, c := range r.Charges {
		b = append(b, 0)
		b = append(b, c.Scope...)
		b = append(b, 0)
		b = strconv.AppendInt(b, int64(c.Limit.Kind), 10)
		b = append(b, '/')
		b = strconv.AppendInt(b, int64(c.Limit.Window), 10)
		b = append(b, '/')
		b = strconv.AppendInt(b, c.Limit.Limit, 10)
		b = append(b, '/')
		b = strconv.AppendInt(b, c.Limit.Burst, 10)
	}
	return b
}

// admit admits r from a block, asking the store for a new block when
// demand warrants one. ok false means r must go to the store by itself
// (p is its pool, for noteStore); err is a store failure of the block request.
func (q *localQuota) admit(ctx context.Context, r *Request) (d Decision, ok bool, p *pool, err error) {
	var buf [256]byte
	sig := appendSignature(buf[:0], r)
	// A few rounds at most: each either admits, waits for a block another
	// request is fetching, or asks for one.
	for range 3 {
		var refill <-chan struct{}
		if d, ok, p, refill = q.take(sig, r); ok {
			return d, true, p, nil
		}
		n, mine := 0, chan struct{}(nil)
		if refill == nil {
			n, mine, refill = q.startRefill(p, r)
		}
		if refill != nil {
			// Another request is asking for this pool's next block (or
			// got it): wait for it rather than send a store call of our own.
			select {
			case <-refill:
				continue
			case <-ctx.Done():
				return Decision{}, false, p, nil
			}
		}
		if n < 2 {
			return Decision{}, false, p, nil
		}
		d, ok, err = q.grant(ctx, p, r, n, mine)
		return d, ok, p, err
	}
	return Decision{}, false, p, nil
}

// closedChan is a channel that never blocks: "look again".
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// take admits r from p's block if it fits; otherwise it retires the block
// and returns the pool (and its refill channel when a block request is in
// flight).
func (q *localQuota) take(sig []byte, r *Request) (Decision, bool, *pool, <-chan struct{}) {
	now := q.clk.Now()
	var returnNow *block
	defer func() {
		if returnNow != nil {
			q.returnAsync(returnNow)
		}
	}()
	q.mu.Lock()
	defer q.mu.Unlock()
	p := q.pools[string(sig)]
	if p == nil {
		q.pruneLocked(now)
		p = &pool{size: 1}
		for _, c := range r.Charges {
			p.scopes = append(p.scopes, c.Scope)
			p.kinds = append(p.kinds, c.Limit.Kind)
			p.windows = append(p.windows, c.Limit.Window)
		}
		q.pools[string(sig)] = p
	}
	p.lastUse = now
	if b := p.blk; b != nil {
		if now.Before(b.until) && fits(b.left, r.Charges) {
			for i, c := range r.Charges {
				b.left[i] -= c.Cost
				b.used[i] += c.Cost
			}
			return q.holdLocked(b, r), true, p, nil
		}
		if now.Before(b.until) {
			// Demand outran the block within its window: ask for more next time.
			p.size = min(2*p.size, q.cfg.MaxBlock)
		} else if b.admitted*2 < b.n {
			// Its window ended half unused: demand fell.
			p.size = max(p.size/2, 1)
		}
		returnNow = q.retireLocked(b)
	}
	if p.refill != nil {
		return Decision{}, false, p, p.refill
	}
	return Decision{}, false, p, nil
}

func fits(left []int64, ch []Charge) bool {
	for i, c := range ch {
		if left[i] < c.Cost {
			return false
		}
	}
	return true
}

// holdLocked records r as admitted from b and returns its decision.
func (q *localQuota) holdLocked(b *block, r *Request) Decision {
	id := localPrefix + r.ID
	b.outstanding++
	b.admitted++
	b.ids = append(b.ids, id)
	cost := make([]int64, len(r.Charges))
	st := make([]Status, len(r.Charges))
	known := len(b.p.remaining) == len(r.Charges)
	for i, c := range r.Charges {
		cost[i] = c.Cost
		st[i] = Status{Scope: c.Scope, Kind: c.Limit.Kind, Limit: c.Limit.Limit, Remaining: b.left[i]}
		if known {
			st[i].Remaining = min(b.p.remaining[i]+b.left[i], c.Limit.Burst)
			st[i].Reset = b.p.reset[i]
		}
	}
	q.held[id] = &localHold{blk: b, cost: cost}
	return Decision{ID: id, Allowed: true, Limits: st}
}

// startRefill sizes the block r should ask for; when it is worth one (2
// requests or more) it marks p as refilling and returns the channel to
// close. If another request got there first, it returns a channel to wait
// on instead.
func (q *localQuota) startRefill(p *pool, r *Request) (n int, mine chan struct{}, other <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case p.refill != nil:
		return 0, nil, p.refill
	case p.blk != nil:
		return 0, nil, closedChan
	case p.remaining == nil || len(p.remaining) != len(r.Charges):
		return 0, nil, nil
	}
	size := int64(p.size)
	for i, c := range r.Charges {
		if c.Cost > 0 {
			size = min(size, p.remaining[i]/(int64(q.cfg.Headroom)*c.Cost))
		}
	}
	if size < 2 {
		return 0, nil, nil
	}
	p.refill = make(chan struct{})
	return int(size), p.refill, nil
}

// grant asks the store for a block of n times r's costs and admits r from it.
func (q *localQuota) grant(ctx context.Context, p *pool, r *Request, n int, refill chan struct{}) (Decision, bool, error) {
	br := &Request{ID: newID(), Lane: r.Lane, Priority: r.Priority, Hold: r.Hold + q.cfg.Window + returnMargin, Charges: make([]Charge, len(r.Charges))}
	for i, c := range r.Charges {
		br.Charges[i] = c
		br.Charges[i].Cost = c.Cost * int64(n)
	}
	bd, err := q.b.Admit(ctx, br)
	now := q.clk.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	close(refill)
	p.refill = nil
	if err != nil || !bd.Allowed {
		p.size = 1
		return Decision{}, false, err
	}
	b := &block{id: bd.ID, p: p, n: n, until: now.Add(q.cfg.Window), cost: make([]int64, len(br.Charges)),
		left: make([]int64, len(br.Charges)), used: make([]int64, len(br.Charges))}
	for i, c := range br.Charges {
		b.cost[i] = c.Cost
		b.left[i] = c.Cost - r.Charges[i].Cost
		b.used[i] = r.Charges[i].Cost
	}
	p.blk = b
	q.learnLocked(p, bd)
	b.timer = q.clk.AfterFunc(q.cfg.Window, func() { q.expire(b) })
	q.lapseAtLocked(b, now.Add(r.Hold+q.cfg.Window))
	return q.holdLocked(b, r), true, nil
}

// noteStore records the decision the store made on a request that did not
// come from a block: what its limits have left, and whether demand
// (two such requests within one Window, neither refused nor kept waiting)
// calls for blocks.
func (q *localQuota) noteStore(p *pool, d Decision, waited bool) {
	now := q.clk.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.learnLocked(p, d)
	if !d.Allowed || waited {
		p.size = 1
	} else if now.Sub(p.lastStore) < q.cfg.Window {
		p.size = max(p.size, 2)
	}
	p.lastStore = now
}

func (q *localQuota) learnLocked(p *pool, d Decision) {
	if len(d.Limits) != len(p.scopes) {
		p.remaining = nil
		return
	}
	if p.remaining == nil {
		p.remaining, p.reset = make([]int64, len(d.Limits)), make([]time.Duration, len(d.Limits))
	}
	for i, s := range d.Limits {
		p.remaining[i], p.reset[i] = s.Remaining, s.Reset
	}
}

// retireLocked stops b admitting; it returns b when it can go back to the
// store now (nothing outstanding).
func (q *localQuota) retireLocked(b *block) *block {
	if !b.retired {
		b.retired = true
		if b.p.blk == b {
			b.p.blk = nil
		}
		if b.timer != nil {
			b.timer.Stop()
		}
	}
	if b.outstanding == 0 && !b.returned {
		b.returned = true
		return b
	}
	return nil
}

// lapseAtLocked makes b go back to the store at t at the latest: requests
// admitted from it that are still unsettled then count at their estimates
// (or the usage their last Extend recorded), as an unsettled reservation
// does in the store once its hold is over. Without it, callers that never
// settle would strand the unused part of every block.
func (q *localQuota) lapseAtLocked(b *block, t time.Time) {
	if !t.After(b.deadline) {
		return
	}
	if b.lapse != nil {
		b.lapse.Stop()
	}
	b.deadline = t
	b.lapse = q.clk.AfterFunc(t.Sub(q.clk.Now()), func() {
		q.mu.Lock()
		ret := q.retireLocked(b)
		if ret == nil && !b.returned {
			b.returned = true
			ret = b
		}
		q.mu.Unlock()
		if ret != nil {
			q.returnAsync(ret)
		}
	})
}

// expire ends b's window.
func (q *localQuota) expire(b *block) {
	q.mu.Lock()
	if !b.retired && b.admitted*2 < b.n {
		b.p.size = max(b.p.size/2, 1)
	}
	ret := q.retireLocked(b)
	q.mu.Unlock()
	if ret != nil {
		q.returnAsync(ret)
	}
}

func (q *localQuota) returnAsync(b *block) {
	q.mu.Lock()
	if q.returning == 0 {
		q.idle = make(chan struct{})
	}
	q.returning++
	q.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		q.giveBack(ctx, b)
		q.mu.Lock()
		q.returning--
		if q.returning == 0 {
			close(q.idle)
		}
		q.mu.Unlock()
	}()
}

// usedLocked is what b's requests have used, as far as this replica
// knows: the real costs of those settled, the usage recorded by Extend of
// those running (their estimates when none was), nothing of the part of b
// never handed out, and the whole reserved cost of forfeited charges.
// q.mu must be held.
func (q *localQuota) usedLocked(b *block) []int64 {
	used := append([]int64(nil), b.used...)
	for _, id := range b.ids {
		if h := q.held[id]; h != nil && !h.settled && h.used != nil {
			for i, u := range h.used {
				used[i] += u - h.cost[i]
			}
		}
	}
	for i, f := range b.forfeit {
		if f {
			used[i] = b.cost[i]
		}
	}
	for i := range used {
		used[i] = max(used[i], 0)
	}
	return used
}

// giveBack settles b in the store with what its requests used (the
// usage recorded of those still unsettled when it lapsed).
func (q *localQuota) giveBack(ctx context.Context, b *block) {
	q.mu.Lock()
	used := q.usedLocked(b)
	if b.lapse != nil {
		b.lapse.Stop()
	}
	q.mu.Unlock()
	err := q.b.Settle(ctx, b.id, used)
	q.mu.Lock()
	for _, id := range b.ids {
		delete(q.held, id)
	}
	q.mu.Unlock()
	if err != nil && !errors.Is(err, ErrUnknownReservation) {
		// The block's reservation expires by itself, charged what the block
		// had used at its last Extend, or as reserved if none came.
		q.log.Warn("ratelimit: returning a local block failed; its unused part comes back when it expires", "err", err)
	}
}

// settle settles a locally admitted request. handled false means id is not
// one (the store knows it, if anyone does).
func (q *localQuota) settle(ctx context.Context, id string, actual []int64) (handled bool, err error) {
	q.mu.Lock()
	h := q.held[id]
	if h == nil {
		q.mu.Unlock()
		// A local ID no longer held was settled with its block.
		return strings.HasPrefix(id, localPrefix), nil
	}
	if h.settled {
		q.mu.Unlock()
		return true, nil
	}
	b := h.settleLocked(actual)
	var ret *block
	if b.retired || !q.clk.Now().Before(b.until) {
		ret = q.retireLocked(b)
	}
	q.mu.Unlock()
	if ret != nil {
		q.giveBack(ctx, ret)
	}
	return true, nil
}

// settleNow settles a locally admitted request if that needs no store call
// (its block stays in use). held false means id is not one; done false
// means it is, but the block must go back to the store: nothing was done,
// and settle does it all.
func (q *localQuota) settleNow(id string, actual []int64) (held, done bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.held[id]
	switch {
	case h == nil:
		// A local ID no longer held was settled with its block.
		return strings.HasPrefix(id, localPrefix), true
	case h.settled:
		return true, true
	}
	b := h.blk
	if b.retired || !q.clk.Now().Before(b.until) {
		return true, false
	}
	h.settleLocked(actual)
	return true, true
}

// settleLocked charges h's block actual instead of h's estimates (nil
// refunds them) and returns the block. q.mu must be held.
func (h *localHold) settleLocked(actual []int64) *block {
	h.settled = true
	b := h.blk
	for i, est := range h.cost {
		a := est
		switch {
		case actual == nil:
			a = 0
		case i < len(actual):
			a = actual[i]
		}
		b.used[i] += a - est
	}
	b.outstanding--
	return b
}

// extend keeps the block of a locally admitted request alive for hold,
// recording used (when not nil) as what the request used so far. The
// block's reservation is extended with what the whole block used (see
// usedLocked), so that if this replica dies the store charges that.
func (q *localQuota) extend(ctx context.Context, id string, hold time.Duration, used []int64) (handled bool, err error) {
	q.mu.Lock()
	h := q.held[id]
	var blockUsed []int64
	if h != nil && !h.settled {
		if used != nil {
			h.used = append(h.used[:0], h.cost...)
			copy(h.used, used)
		}
		blockUsed = q.usedLocked(h.blk)
	}
	q.mu.Unlock()
	switch {
	case h == nil && strings.HasPrefix(id, localPrefix):
		return true, ErrUnknownReservation
	case h == nil:
		return false, nil
	case h.settled:
		return true, ErrUnknownReservation
	}
	if err := q.b.Extend(ctx, h.blk.id, hold+returnMargin, blockUsed); err != nil {
		return true, err
	}
	q.mu.Lock()
	if !h.blk.returned {
		q.lapseAtLocked(h.blk, q.clk.Now().Add(hold))
	}
	q.mu.Unlock()
	return true, nil
}

// retireScope stops every block charging scope (a cooldown or a provider's
// report about it), so that the next request asks the store.
func (q *localQuota) retireScope(scope string) {
	var ret []*block
	q.mu.Lock()
	for _, p := range q.pools {
		for _, s := range p.scopes {
			if s != scope {
				continue
			}
			p.size, p.remaining = 1, nil
			if p.blk != nil {
				if b := q.retireLocked(p.blk); b != nil {
					ret = append(ret, b)
				}
			}
			break
		}
	}
	q.mu.Unlock()
	for _, b := range ret {
		q.returnAsync(b)
	}
}

// retireLearned is retireScope for a limit learned from the provider
// (Limiter.Learn): besides retiring the blocks on scope, the blocks not yet
// returned, retired ones with requests still running included, give back
// nothing of their charges on the learned bucket (scope, kind, window).
// The provider's count, which the store now holds, already tells what is
// left; the unused part of a block reserved before it must not raise the
// bucket above that.
func (q *localQuota) retireLearned(scope string, kind Kind, window time.Duration) {
	q.mu.Lock()
	mark := func(b *block) {
		for i, s := range b.p.scopes {
			if s == scope && b.p.kinds[i] == kind && b.p.windows[i] == window {
				if b.forfeit == nil {
					b.forfeit = make([]bool, len(b.cost))
				}
				b.forfeit[i] = true
			}
		}
	}
	for _, p := range q.pools {
		if p.blk != nil {
			mark(p.blk)
		}
	}
	for _, h := range q.held { // Learn is rare: a walk over the requests running is fine
		mark(h.blk)
	}
	q.mu.Unlock()
	q.retireScope(scope)
}

// close retires every block and returns those with nothing outstanding;
// blocks with requests still running go back when those settle.
func (q *localQuota) close(ctx context.Context) error {
	var ret []*block
	q.mu.Lock()
	for _, p := range q.pools {
		if p.blk != nil {
			if b := q.retireLocked(p.blk); b != nil {
				ret = append(ret, b)
			}
		}
	}
	q.mu.Unlock()
	for _, b := range ret {
		q.giveBack(ctx, b)
	}
	q.mu.Lock()
	idle := q.idle
	if q.returning == 0 {
		idle = nil
	}
	q.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pruneLocked forgets pools unused for a minute, once there are many.
func (q *localQuota) pruneLocked(now time.Time) {
	if len(q.pools) < 4096 {
		return
	}
	for k, p := range q.pools {
		if p.blk == nil && p.refill == nil && now.Sub(p.lastUse) > time.Minute {
			delete(q.pools, k)
		}
	}
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

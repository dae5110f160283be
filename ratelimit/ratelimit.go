// Package ratelimit admits requests against several rate and concurrency limits at once, atomically and across replicas: reserve an estimate, settle the real usage, and wait in a fair priority queue instead of failing.
//
// A rate limit (Requests or Tokens per Window) is a bucket holding Burst
// units (default: one window's worth) that refills continuously at
// Limit/Window: the way providers enforce RPM and TPM. A quiet period is
// followed by the full allowance, and the limiter never admits more than
// such a bucket would. A Concurrency limit counts permits held at once; each
// permit is a lease that expires if its holder dies.
//
// A Request names every limit it must pass (a Charge per scope and kind, e.g.
// the deployment's RPM and TPM and the tenant's RPM). The decision is atomic
// over all of them: either every limit admits the request and all are
// charged, or none is. Admission reserves the estimate; Settle charges or
// refunds the difference once the real usage is known. A reservation whose
// caller dies expires after its Hold: its rate charges are then settled at
// the usage its last Extend recorded, or stand as reserved if none did.
//
// Wait queues the request in its lane (by default its first charge's scope)
// in priority then arrival order. Whenever capacity may have freed (a settle,
// a refund, a permit release, a refill the queue head was told to expect),
// the queue is walked from the head and every waiter that now fits is
// admitted and woken; a waiter blocked only by its own scope (its tenant's
// limit, say) does not hold up waiters behind it that do not share that
// scope. Nobody polls.
//
// With a remote store, WithLocalQuota lets a Limiter admit most requests
// far from every limit without a store round trip, from blocks of capacity
// it reserved in one store decision; near a limit it decides per request as
// above. Sharded spreads the limits over several backends (groups: a Redis
// Cluster's shards), one per deployment and one per tenant, say.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/llmgate/llmgate/clock"
)

// Errors returned by this package and its backends.
var (
	// ErrLimited is returned by Wait when the context ended before the
	// request was admitted; the Decision says which limit held it back.
	ErrLimited = errors.New("ratelimit: limited")
	// ErrImpossible means a charge can never be admitted: its cost exceeds
	// the bucket's burst, or a concurrency limit is below one.
	ErrImpossible = errors.New("ratelimit: cost exceeds the limit")
	// ErrUnknownReservation means Settle or Refund named a reservation that
	// does not exist: never made, or expired unsettled (its estimate, or
	// the usage its last Extend recorded, stands).
	ErrUnknownReservation = errors.New("ratelimit: unknown or expired reservation")
	// ErrStoreUnavailable marks a store that could not be reached. Backends
	// wrap their connection errors in it; the limits' fail-open / fail-closed
	// policy applies to it (and to nothing else).
	ErrStoreUnavailable = errors.New("ratelimit: store unavailable")
	// ErrUnexpectedReply means the store answered something the backend
	// cannot read: a bug or a foreign key in the way, never an outage.
	ErrUnexpectedReply = errors.New("ratelimit: unexpected reply from the store")
	// ErrInvalid wraps errors about malformed requests or limits.
	ErrInvalid = errors.New("ratelimit: invalid request")
)

// Kind says what a limit counts.
type Kind uint8

// Limit kinds.
const (
	// Requests per Window, refilled continuously.
	Requests Kind = iota + 1
	// Tokens per Window (input + output), refilled continuously.
	Tokens
	// Concurrency is the number of permits held at once.
	Concurrency
)

func (k Kind) String() string {
	switch k {
	case Requests:
		return "requests"
	case Tokens:
		return "tokens"
	case Concurrency:
		return "concurrency"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Limit is one quota.
type Limit struct {
	Kind Kind
	// Limit is the allowance per Window, or the number of permits.
	Limit int64
	// Window is the refill period of a rate limit (time.Minute for RPM and
	// TPM); ignored for Concurrency.
	Window time.Duration
	// Burst is the bucket size of a rate limit; 0 means Limit (one full
	// window, as providers do). Ignored for Concurrency.
	Burst int64
	// FailClosed denies requests when the store cannot be reached. The
	// default (false) admits them: an outage of the coordination store
	// should not take the service down with it. Budgets default the other way.
	FailClosed bool
}

func (l Limit) burst() int64 {
	if l.Kind == Concurrency {
		return l.Limit
	}
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Limit
}

// Charge applies one limit to one scope for one request.
type Charge struct {
	// Scope names who the limit is for, e.g. "deployment:openai-key1/gpt-4.1"
	// or "tenant:team-a". Charges of different kinds share a scope;
	// Cooldown and Observe act on a scope.
	Scope string
	Limit Limit
	// Cost is what the request takes: 1 for Requests and Concurrency (0
	// means 1), the token estimate for Tokens.
	Cost int64
}

// Priority orders waiters: lower values are served first.
type Priority int8

// Priority classes.
const (
	Interactive Priority = 0
	Batch       Priority = 1
)

// MaxAmount bounds limits, bursts and costs: stores compute in double
// precision, exact up to 2^53.
const MaxAmount = 1<<53 - 1

// DefaultHold is how long a reservation lives unsettled (and a concurrency
// permit unreleased) before it is dropped as abandoned.
const DefaultHold = time.Minute

// MaxDefer bounds how far ahead of its tokens Wait lets a request be
// admitted. It is short so that a batch request admitted ahead never holds
// back an interactive one that arrives after it for long.
const MaxDefer = 50 * time.Millisecond

// DefaultWaiterLease is how long a queued waiter's place survives without
// renewal; waiters renew every third of it while they wait.
const DefaultWaiterLease = 3 * time.Second

// Request is one admission.
type Request struct {
	// ID identifies the reservation; Settle and Refund are idempotent per
	// ID. Empty means a random one. The decision's ID is the one to settle:
	// this one, except on a Sharded backend, whose IDs also name the
	// groups the reservation is in (and end with this one).
	ID      string
	Charges []Charge
	// Priority orders waiters within a lane.
	Priority Priority
	// Lane is the queue the request waits in; empty means the first
	// charge's scope (normally the provider deployment).
	Lane string
	// Hold bounds how long the reservation and its concurrency permits live
	// without Settle or Refund. Default DefaultHold.
	Hold time.Duration
	// Defer lets the request be admitted up to this long before its tokens
	// exist, with Decision.Delay saying when to start. Wait sets it (to at
	// most MaxDefer, within its deadline) so that the latency of waking a
	// waiter costs no capacity; Allow leaves it 0.
	Defer time.Duration
	// MaxWait, when positive, bounds how long Wait queues, as a deadline
	// on its context would (the earlier of the two applies); a request
	// admitted at once then costs no timer. Allow ignores it.
	MaxWait time.Duration

	// shard is how a Sharded backend cut the request by group, and how
	// far it got in each while it waits.
	shard *shardSplit
}

// Status is the state of one charged limit after a decision.
type Status struct {
	Scope string
	Kind  Kind
	Limit int64
	// Remaining is what is left now (whole units, never negative).
	Remaining int64
	// Reset is how long until the bucket is full again (0 for Concurrency).
	Reset time.Duration
}

// Decision is the answer to one admission.
type Decision struct {
	// ID is the reservation to Settle or Refund when Allowed.
	ID      string
	Allowed bool
	// RetryAfter, when not allowed, is how long until this request would
	// fit if nothing else were admitted meanwhile. For a full concurrency
	// limit it is when the permit that must go expires at the latest (a
	// release frees one sooner). 0 when it cannot be told (waiters ahead).
	RetryAfter time.Duration
	// DeniedBy is the scope of the first limit that refused, when not allowed.
	DeniedBy string
	// DeniedKind is the kind of that limit.
	DeniedKind Kind
	// Delay, when allowed, is how long to hold off before starting: the
	// request was admitted ahead of its tokens (see Request.Defer). Wait
	// has already slept it.
	Delay time.Duration
	// Limits has one status per charge, in the request's order.
	Limits []Status
	// Degraded is set when the store could not be reached and the request
	// was admitted because all its limits fail open.
	Degraded bool
}

// Backend is the store side of a limiter; see lock/redis and memory for
// implementations. Requests it receives are validated and normalised.
type Backend interface {
	// Admit makes one attempt: the request is admitted if every limit has
	// room and no earlier waiter in its lane is blocked on one of its
	// scopes; it never stays queued.
	Admit(ctx context.Context, r *Request) (Decision, error)
	// Enqueue puts r in its lane (or renews its place, which lives for
	// lease), then admits whoever fits from the head of the lane. It reports
	// r's decision if r was admitted, and otherwise how long r should wait
	// before asking again (hint; 0 = no estimate). Admit and Enqueue
	// report what the store did even when ctx ends during the call (they
	// give up on the reply only when the store does not answer): the
	// Abandon or Settle that follows must reach the store after it.
	Enqueue(ctx context.Context, r *Request, lease time.Duration) (d Decision, admitted bool, hint time.Duration, err error)
	// Await blocks up to timeout for another caller's walk to admit r. A
	// walk may instead tell r, now first in line, when it will fit: Await
	// then returns d with Allowed false and RetryAfter set. On timeout d is
	// the zero Decision.
	Await(ctx context.Context, r *Request, timeout time.Duration) (d Decision, admitted bool, err error)
	// Abandon takes r out of its lane; if it was admitted meanwhile, the
	// reservation is refunded.
	Abandon(ctx context.Context, r *Request) error
	// Settle charges actual[i] instead of the reserved cost for each rate
	// charge (same order as the request) and releases concurrency permits.
	// A nil actual refunds every charge. Settling twice is a no-op.
	Settle(ctx context.Context, id string, actual []int64) error
	// Extend keeps an unsettled reservation and its permits alive for hold
	// from now. used, when not empty, is what the request has used so far
	// of each rate charge (same order as the request; a missing one counts
	// as its reserved cost): should the reservation expire unsettled, its
	// rate charges are settled at that, as Settle would, instead of
	// standing as reserved. Without used, what an earlier Extend recorded
	// is kept. An expired reservation is unknown to Settle.
	Extend(ctx context.Context, id string, hold time.Duration, used []int64) error
	// Cooldown blocks every charge on scope until d from now; it only ever
	// moves the end of a cooldown later. It returns the time left.
	Cooldown(ctx context.Context, scope string, d time.Duration) (time.Duration, error)
	// Observe lowers the scope's bucket of limit l to at most remaining
	// (what the provider says is left).
	Observe(ctx context.Context, scope string, l Limit, remaining int64) error
	// Learn records x.Limit as the provider's own allowance for scope's
	// bucket of l (its kind and window; l's Limit and Burst are the limit
	// as charged) until x.TTL from now, replacing what an earlier Learn
	// said. Meanwhile every charge on that bucket uses the lower of its
	// own limit and x.Limit as its rate, and of its burst and x.Limit as
	// its bucket; a charge costing more than that bucket waits for a full
	// one. When x.Remaining is not negative the bucket drops to at most
	// that. x is validated, its TTL filled in.
	Learn(ctx context.Context, scope string, l Limit, x Learned) error
}

// InProcessBackend is a Backend whose state lives in this process (the
// memory backend): its calls cost no round trip, so the Limiter makes
// them on the caller's goroutine (see SettleNow).
type InProcessBackend interface {
	Backend
	InProcess()
}

// DefaultLearnTTL is how long a learned limit holds unless it is learned
// again: long enough to span a provider's retry-afters, short enough that
// a raised quota is picked up again.
const DefaultLearnTTL = 10 * time.Minute

// Learned is what a provider said about one of its own rate limits; see
// Limiter.Learn.
type Learned struct {
	// Limit is the provider's allowance per window of the limit it is
	// about; at least 1.
	Limit int64
	// Remaining is what the provider has left now (its limit minus what
	// it says was used); negative when it did not say.
	Remaining int64
	// TTL is how long the learned limit holds; 0 means DefaultLearnTTL.
	TTL time.Duration
}

// Stats counts what a Limiter did; read it with Limiter.Stats.
type Stats struct {
	Admitted, Denied, Waited, StoreErrors, FailedOpen, FailedClosed int64
	// Local counts the admissions (also in Admitted) made from a local
	// block without a store call; see WithLocalQuota.
	Local int64
}

// Limiter checks requests against a Backend.
type Limiter struct {
	b           Backend
	log         *slog.Logger
	waiterLease time.Duration
	clk         clock.Clock
	localCfg    *LocalQuota
	local       *localQuota // nil unless WithLocalQuota

	admitted, denied, waited, storeErrors, failedOpen, failedClosed, localAdmitted atomic.Int64

	// cleanups holds a token per abandon running after an outage (see
	// abandonLater), at most maxCleanups; Close waits for them.
	cleanups chan struct{}
}

// maxCleanups bounds the abandons running in the background after outages.
const maxCleanups = 32

// Option configures a Limiter.
type Option func(*Limiter)

// WithLogger sets where store outages are logged (default: discarded).
func WithLogger(l *slog.Logger) Option { return func(x *Limiter) { x.log = l } }

// WithWaiterLease sets how long a waiter's place survives without renewal.
func WithWaiterLease(d time.Duration) Option { return func(x *Limiter) { x.waiterLease = d } }

// New returns a Limiter over b.
func New(b Backend, opts ...Option) *Limiter {
	l := &Limiter{b: b, waiterLease: DefaultWaiterLease, clk: clock.Real{}, cleanups: make(chan struct{}, maxCleanups)}
	for _, o := range opts {
		o(l)
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.localCfg != nil {
		l.local = newLocalQuota(*l.localCfg, b, l.log, l.clk)
	}
	if l.waiterLease < 30*time.Millisecond {
		l.waiterLease = 30 * time.Millisecond
	}
	return l
}

// Stats returns the counters so far.
func (l *Limiter) Stats() Stats {
	return Stats{
		Admitted: l.admitted.Load(), Denied: l.denied.Load(), Waited: l.waited.Load(),
		StoreErrors: l.storeErrors.Load(), FailedOpen: l.failedOpen.Load(), FailedClosed: l.failedClosed.Load(),
		Local: l.localAdmitted.Load(),
	}
}

// normalize validates r and fills its defaults in a copy.
func normalize(r Request) (*Request, error) {
	if len(r.Charges) == 0 {
		return nil, fmt.Errorf("%w: no charges", ErrInvalid)
	}
	if r.ID == "" {
		r.ID = newID()
	}
	if r.Hold <= 0 {
		r.Hold = DefaultHold
	}
	if r.Defer < 0 {
		r.Defer = 0
	}
	if r.Hold < time.Millisecond {
		return nil, fmt.Errorf("%w: hold %v below 1ms", ErrInvalid, r.Hold)
	}
	if r.Lane != "" && !utf8.ValidString(r.Lane) {
		return nil, fmt.Errorf("%w: lane is not valid UTF-8", ErrInvalid)
	}
	r.Charges = append([]Charge(nil), r.Charges...)
	for i := range r.Charges {
		c := &r.Charges[i]
		if c.Scope == "" {
			return nil, fmt.Errorf("%w: charge %d has no scope", ErrInvalid, i)
		}
		if !utf8.ValidString(c.Scope) {
			// Stores key by text; two invalid byte strings could collide.
			return nil, fmt.Errorf("%w: scope of charge %d is not valid UTF-8", ErrInvalid, i)
		}
		if c.Limit.Kind == Concurrency {
			c.Limit.Window = 0
		} else if c.Limit.Window%time.Microsecond != 0 {
			return nil, fmt.Errorf("%w: %s window on %q is not a whole number of microseconds", ErrInvalid, c.Limit.Kind, c.Scope)
		}
		for _, o := range r.Charges[:i] { // requests have a handful of charges
			if o.Limit.Kind == c.Limit.Kind && o.Limit.Window == c.Limit.Window && o.Scope == c.Scope {
				return nil, fmt.Errorf("%w: two %s limits with the same window on %q", ErrInvalid, c.Limit.Kind, c.Scope)
			}
		}
		switch c.Limit.Kind {
		case Requests, Concurrency:
			if c.Cost == 0 {
				c.Cost = 1
			}
			if c.Limit.Kind == Concurrency && c.Cost != 1 {
				return nil, fmt.Errorf("%w: concurrency charge on %q must cost 1", ErrInvalid, c.Scope)
			}
		case Tokens:
		default:
			return nil, fmt.Errorf("%w: charge %d on %q has no kind", ErrInvalid, i, c.Scope)
		}
		if c.Cost < 0 {
			return nil, fmt.Errorf("%w: negative cost %d on %q", ErrInvalid, c.Cost, c.Scope)
		}
		if c.Limit.Limit > MaxAmount || c.Limit.Burst > MaxAmount || c.Cost > MaxAmount {
			return nil, fmt.Errorf("%w: amounts on %q above %d", ErrInvalid, c.Scope, int64(MaxAmount))
		}
		if c.Limit.Limit <= 0 {
			return nil, fmt.Errorf("%w: %s limit on %q is %d; it must be at least 1", ErrImpossible, c.Limit.Kind, c.Scope, c.Limit.Limit)
		}
		if c.Limit.Kind != Concurrency {
			if c.Limit.Window <= 0 {
				return nil, fmt.Errorf("%w: %s limit on %q has no window", ErrInvalid, c.Limit.Kind, c.Scope)
			}
			if c.Limit.Window < time.Millisecond {
				return nil, fmt.Errorf("%w: %s window on %q is below 1ms", ErrInvalid, c.Limit.Kind, c.Scope)
			}
			c.Limit.Burst = c.Limit.burst()
			if c.Cost > c.Limit.Burst {
				return nil, fmt.Errorf("%w: %d %s on %q exceed its bucket of %d", ErrImpossible, c.Cost, c.Limit.Kind, c.Scope, c.Limit.Burst)
			}
		}
	}
	if r.Lane == "" {
		r.Lane = r.Charges[0].Scope
	}
	return &r, nil
}

// failOpen reports whether every charge of r admits on a store outage.
func failOpen(r *Request) bool {
	for _, c := range r.Charges {
		if c.Limit.FailClosed {
			return false
		}
	}
	return true
}

// outage applies the store-outage policy of r's limits to err; errors that
// are not outages are returned as they are.
// abandonLater takes r out of the store in the background after a store
// outage answered its first Admit or Enqueue: the script may have run and
// only its reply been lost, and the place it took in the lane would then be
// admitted by a later walk and hold its permits for a whole hold, with no
// one to settle them. Best effort: at most maxCleanups run at once (the
// waiter's lease and the hold end the rest).
func (l *Limiter) abandonLater(r *Request, err error) {
	if !errors.Is(err, ErrStoreUnavailable) {
		return
	}
	select {
	case l.cleanups <- struct{}{}:
	default:
		return
	}
	go func() {
		defer func() { <-l.cleanups }()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = l.b.Abandon(ctx, r)
	}()
}

func (l *Limiter) outage(r *Request, err error) (Decision, error) {
	if !errors.Is(err, ErrStoreUnavailable) {
		return Decision{ID: r.ID}, err
	}
	l.storeErrors.Add(1)
	if failOpen(r) {
		l.failedOpen.Add(1)
		l.log.Warn("ratelimit: store unavailable; admitting (fail-open)", "lane", r.Lane, "err", err)
		return Decision{ID: r.ID, Allowed: true, Degraded: true}, nil
	}
	l.failedClosed.Add(1)
	l.log.Error("ratelimit: store unavailable; denying (fail-closed)", "lane", r.Lane, "err", err)
	return Decision{ID: r.ID}, err
}

func (l *Limiter) count(d Decision) {
	if d.Allowed {
		l.admitted.Add(1)
	} else {
		l.denied.Add(1)
	}
}

// Allow makes one attempt and never waits. When the request is not
// admitted, Decision.RetryAfter says when it would fit.
func (l *Limiter) Allow(ctx context.Context, req Request) (Decision, error) {
	r, err := normalize(req)
	if err != nil {
		return Decision{}, err
	}
	d, done, p, err := l.tryLocal(ctx, r, req.ID != "")
	if done {
		return d, err
	}
	d, err = l.b.Admit(ctx, r)
	if err != nil {
		if ctx.Err() != nil {
			return Decision{ID: r.ID}, err
		}
		l.abandonLater(r, err)
		return l.outage(r, err)
	}
	if p != nil {
		l.local.noteStore(p, d, false)
	}
	l.count(d)
	return d, nil
}

// peekLane is the lane of Peek's requests: no waiter is ever in it, so a
// peek is never held back behind one.
const peekLane = "llmgate-peek"

// Peek reports the state in the store of the rate limits of charges (their
// concurrency limits are left out) without charging anything: the Status
// an Allow of the same request costing nothing would report. Local blocks
// are skipped, so the view is the store's, every replica's use included.
// Peeks are not counted in Stats.
func (l *Limiter) Peek(ctx context.Context, charges []Charge) ([]Status, error) {
	req := Request{Lane: peekLane, Charges: make([]Charge, 0, len(charges))}
	for _, c := range charges {
		if c.Limit.Kind == Concurrency {
			continue
		}
		c.Cost = 0
		req.Charges = append(req.Charges, c)
	}
	r, err := normalize(req)
	if err != nil {
		return nil, err
	}
	d, err := l.b.Admit(ctx, r)
	if err != nil {
		return nil, err
	}
	if !d.Allowed {
		return d.Limits, nil
	}
	// A request counts 1 on its requests limits whatever its cost: the
	// peek's own is refunded, and left out of what it reports.
	for i := range d.Limits {
		if s := &d.Limits[i]; s.Kind == Requests {
			s.Remaining = min(s.Remaining+1, s.Limit)
		}
	}
	return d.Limits, l.b.Settle(ctx, d.ID, nil)
}

// tryLocal admits r from a local block when the Limiter has a local quota.
// done false means r goes to the store; p is then its pool (nil without a
// local quota), to tell what the store decided.
func (l *Limiter) tryLocal(ctx context.Context, r *Request, chosenID bool) (d Decision, done bool, p *pool, err error) {
	if l.local == nil || !eligible(r, chosenID) {
		return Decision{}, false, nil, nil
	}
	d, ok, p, err := l.local.admit(ctx, r)
	switch {
	case err != nil && ctx.Err() != nil:
		return Decision{ID: r.ID}, true, p, err
	case err != nil:
		d, err = l.outage(r, err)
		return d, true, p, err
	case ok:
		l.localAdmitted.Add(1)
		l.count(d)
		return d, true, p, nil
	}
	return Decision{}, false, p, nil
}

// Wait queues the request until every limit admits it, or ctx ends, or
// req.MaxWait passes. Then it returns an error wrapping ErrLimited and the
// context's error (context.DeadlineExceeded after MaxWait), with the last
// decision (which limit held it back, and the retry-after). A transient
// store error while waiting is retried until ctx ends; a store outage at the
// first attempt applies the fail-open/fail-closed policy.
func (l *Limiter) Wait(ctx context.Context, req Request) (Decision, error) {
	var deadline time.Time
	if req.MaxWait > 0 {
		deadline = time.Now().Add(req.MaxWait)
	}
	r, err := normalize(req)
	if err != nil {
		return Decision{}, err
	}
	d, done, p, err := l.tryLocal(ctx, r, req.ID != "")
	if done {
		return d, err
	}
	r.Defer = MaxDefer
	dl, ok := ctx.Deadline()
	if !deadline.IsZero() && (!ok || deadline.Before(dl)) {
		dl, ok = deadline, true
	}
	if ok {
		r.Defer = max(min(r.Defer, time.Until(dl)), 0)
	}
	// MaxWait becomes a context deadline only once the request has to
	// wait: the first attempt, which admits most requests, runs on ctx.
	bounded := deadline.IsZero()
	cancel := context.CancelFunc(func() {})
	defer func() { cancel() }()
	bound := func() {
		if !bounded {
			ctx, cancel = context.WithDeadline(ctx, deadline)
			bounded = true
		}
	}
	renew := l.waiterLease / 3
	first := true
	var last Decision
	backoff := 10 * time.Millisecond
	for {
		d, admitted, hint, err := l.b.Enqueue(ctx, r, l.waiterLease)
		if err != nil {
			if first && ctx.Err() == nil {
				l.abandonLater(r, err)
				return l.outage(r, err)
			}
			if !errors.Is(err, ErrStoreUnavailable) && ctx.Err() == nil {
				_, _ = l.giveUp(ctx, r, last)
				return Decision{ID: r.ID}, err
			}
			bound()
			if werr := clock.Sleep(ctx, backoff); werr != nil {
				return l.giveUp(ctx, r, last)
			}
			backoff = min(2*backoff, 500*time.Millisecond)
			continue
		}
		backoff = 10 * time.Millisecond
		if admitted {
			if !first {
				l.waited.Add(1)
			}
			return l.startAdmitted(ctx, r, d, p, !first)
		}
		if first {
			last = d
		}
		first = false
		if d.DeniedBy != "" {
			last = d
		}
		bound()
		renewAt := time.Now().Add(renew)
		for {
			// Sleep until told, until the hint says we fit, or until our
			// place needs renewing, whichever is first.
			wake := renewAt
			if hint > 0 && time.Now().Add(hint).Before(wake) {
				wake = time.Now().Add(hint)
			}
			d, admitted, err = l.b.Await(ctx, r, max(time.Until(wake), time.Millisecond))
			if admitted && err == nil {
				l.waited.Add(1)
				return l.startAdmitted(ctx, r, d, p, true)
			}
			if ctx.Err() != nil {
				return l.giveUp(ctx, r, last)
			}
			if err != nil && !errors.Is(err, ErrStoreUnavailable) {
				_, _ = l.giveUp(ctx, r, last)
				return Decision{ID: r.ID}, err
			}
			if err != nil || d.RetryAfter <= 0 {
				break // timed out (or a transient error): renew and walk
			}
			hint = d.RetryAfter // a walk told us when we will fit
		}
	}
}

// startAdmitted returns an admission to Wait's caller once its delay (if it was
// admitted ahead of its tokens) has passed; if ctx ends first, the
// reservation is refunded. p, when not nil, is told what the store decided.
func (l *Limiter) startAdmitted(ctx context.Context, r *Request, d Decision, p *pool, waited bool) (Decision, error) {
	if p != nil {
		// A request that had to wait, or to start later, is near a limit:
		// no blocks for now.
		l.local.noteStore(p, d, waited || d.Delay > 0)
	}
	if d.Delay > 0 {
		if err := clock.Sleep(ctx, d.Delay); err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = l.b.Settle(rctx, d.ID, nil)
			l.denied.Add(1)
			return Decision{ID: r.ID}, fmt.Errorf("%w: %w", ErrLimited, err)
		}
	}
	l.count(d)
	return d, nil
}

func (l *Limiter) giveUp(ctx context.Context, r *Request, last Decision) (Decision, error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = l.b.Abandon(actx, r) // best effort: the waiter's place expires anyway
	l.denied.Add(1)
	last.ID = r.ID
	last.Allowed = false
	return last, fmt.Errorf("%w: %w", ErrLimited, ctx.Err())
}

// Settle records the real cost of an admitted request: actual[i] replaces
// the reserved cost of charge i (Requests charges are normally left as
// reserved; pass the same value). Concurrency permits are released. Settling
// an ID twice is a no-op; an expired reservation gives ErrUnknownReservation
// and changes nothing (its estimate, or the usage its last Extend
// recorded, stands).
func (l *Limiter) Settle(ctx context.Context, id string, actual []int64) error {
	if actual == nil {
		actual = []int64{}
	}
	for _, a := range actual {
		if a < 0 {
			return fmt.Errorf("%w: negative actual cost %d", ErrInvalid, a)
		}
	}
	if l.local != nil {
		if handled, err := l.local.settle(ctx, id, actual); handled {
			return err
		}
	}
	return l.b.Settle(ctx, id, actual)
}

// SettleNow is Settle when it costs no store round trip: the request was
// admitted from a local quota block that stays in use, or the backend is in
// this process (InProcessBackend). It reports false, having done nothing,
// when settling needs the store: the caller then calls Settle, off its hot
// path.
func (l *Limiter) SettleNow(id string, actual []int64) (bool, error) {
	if actual == nil {
		actual = []int64{}
	}
	for _, a := range actual {
		if a < 0 {
			return true, fmt.Errorf("%w: negative actual cost %d", ErrInvalid, a)
		}
	}
	if l.local != nil {
		if held, done := l.local.settleNow(id, actual); held {
			return done, nil
		}
	}
	if _, ok := l.b.(InProcessBackend); ok {
		return true, l.b.Settle(context.Background(), id, actual)
	}
	return false, nil
}

// Refund gives back everything an admitted request reserved (it never
// reached the provider) and releases its permits. Idempotent.
func (l *Limiter) Refund(ctx context.Context, id string) error {
	if l.local != nil {
		if handled, err := l.local.settle(ctx, id, nil); handled {
			return err
		}
	}
	return l.b.Settle(ctx, id, nil)
}

// Extend keeps an unsettled reservation and its concurrency permits alive
// for hold from now (long streams call it periodically). used, when given,
// is what the request has used so far of each charge, in the order of
// Settle's actual (a missing one counts as reserved): if the caller dies
// and the reservation expires unsettled, its rate charges are settled at
// that, and what was reserved beyond it goes back to the buckets. Without
// used the reservation's estimate stands when it expires, which is the
// safe rule when the provider may have done the whole work (a request
// that is not streamed). A later Extend without used keeps what an
// earlier one recorded.
func (l *Limiter) Extend(ctx context.Context, id string, hold time.Duration, used ...int64) error {
	if hold < time.Millisecond {
		return fmt.Errorf("%w: hold %v below 1ms", ErrInvalid, hold)
	}
	for _, u := range used {
		if u < 0 {
			return fmt.Errorf("%w: negative usage %d", ErrInvalid, u)
		}
	}
	if len(used) == 0 {
		used = nil
	}
	if l.local != nil {
		if handled, err := l.local.extend(ctx, id, hold, used); handled {
			return err
		}
	}
	return l.b.Extend(ctx, id, hold, used)
}

// Cooldown makes every replica hold back requests on scope for d (a
// provider's 429 retry-after). A later, shorter cooldown never shortens it.
// It returns the cooldown left.
func (l *Limiter) Cooldown(ctx context.Context, scope string, d time.Duration) (time.Duration, error) {
	if scope == "" || d <= 0 {
		return 0, fmt.Errorf("%w: cooldown needs a scope and a positive duration", ErrInvalid)
	}
	if l.local != nil {
		l.local.retireScope(scope)
	}
	return l.b.Cooldown(ctx, scope, d)
}

// Observe feeds in what the provider reported as remaining for scope's
// limit l (x-ratelimit-remaining-requests / -tokens): the shared bucket
// drops to at most that, so every replica slows down together.
func (l *Limiter) Observe(ctx context.Context, scope string, lim Limit, remaining int64) error {
	r, err := normalize(Request{Charges: []Charge{{Scope: scope, Limit: lim}}})
	if err != nil {
		return err
	}
	if lim.Kind == Concurrency {
		return fmt.Errorf("%w: Observe applies to rate limits", ErrInvalid)
	}
	if l.local != nil {
		l.local.retireScope(scope)
	}
	return l.b.Observe(ctx, scope, r.Charges[0].Limit, max(remaining, 0))
}

// Learn shares what the provider said one of scope's rate limits really is
// (a 429's "Limit 5, Used 5", x-ratelimit-limit-requests): for x.TTL
// (DefaultLearnTTL when 0), every charge on scope with lim's kind and
// window, on every replica, is held to the lower of its own limit and
// x.Limit, and the bucket drops to at most x.Remaining (when not
// negative), so that requests go out at the provider's pace after a
// cooldown instead of as a burst. lim is the limit as scope's charges
// carry it (the store brings the bucket up to date with it). A later Learn
// replaces the learned limit, also with a higher one. This Limiter's local
// blocks on scope stop admitting, and the part of them that was not used on
// that limit is not given back: the provider's count already says what is
// left.
func (l *Limiter) Learn(ctx context.Context, scope string, lim Limit, x Learned) error {
	r, err := normalize(Request{Charges: []Charge{{Scope: scope, Limit: lim}}})
	if err != nil {
		return err
	}
	switch {
	case lim.Kind == Concurrency:
		return fmt.Errorf("%w: Learn applies to rate limits", ErrInvalid)
	case x.Limit < 1 || x.Limit > MaxAmount:
		return fmt.Errorf("%w: learned %s limit %d on %q is not in 1..%d", ErrInvalid, lim.Kind, x.Limit, scope, int64(MaxAmount))
	case x.TTL < 0 || (x.TTL > 0 && x.TTL < time.Millisecond):
		return fmt.Errorf("%w: learned limit TTL %v below 1ms", ErrInvalid, x.TTL)
	}
	if x.TTL == 0 {
		x.TTL = DefaultLearnTTL
	}
	x.Remaining = min(max(x.Remaining, -1), MaxAmount)
	c := r.Charges[0]
	if l.local != nil {
		l.local.retireLearned(scope, c.Limit.Kind, c.Limit.Window)
	}
	return l.b.Learn(ctx, scope, c.Limit, x)
}

// Close returns the unused part of local blocks (see WithLocalQuota) to the
// store and waits for blocks being returned, until ctx ends. Blocks whose
// requests are still unsettled go back when those settle. It also waits
// for the clean-ups that store outages started (see Allow and Wait). The
// Limiter stays usable.
func (l *Limiter) Close(ctx context.Context) error {
	// Every cleanup holds a token: taking them all waits for the last.
	for range maxCleanups {
		select {
		case l.cleanups <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for range maxCleanups {
		<-l.cleanups
	}
	if l.local == nil {
		return nil
	}
	return l.local.close(ctx)
}

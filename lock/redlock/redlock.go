// Package redlock is a lock backend over N independent Redis instances (Redlock): a lock is held while a majority of the instances hold it, and its fencing token cannot go backwards while a majority keeps its data.
//
// # Acquisition
//
// An attempt runs acquire.lua on every instance at once: SET NX PX of the
// owner's token and, where it succeeds, a fence minted by that instance's
// own counter: max(counter, floor) + 1. The floor is the highest fence this
// Backend has seen, or this machine's clock in µs plus a second if that is
// higher. The attempt succeeds when a quorum (N/2+1) took the key before
// its validity ran out. Validity is TTL − elapsed − drift, drift being
// TTL×1% + 2 ms as in the Redlock description (lock.SafeValidity, counted
// from the moment the attempt was sent). A failed attempt deletes the key
// from the instances it did take, including those that answer late.
//
// # Fencing
//
// The fence is the highest of the quorum's answers, t. If the quorum's
// answers all equal t, each of its instances already stores t. Otherwise a
// second round (raise.lua) raises the counters to t and confirms on a quorum
// that the key is still ours there. Either way, when the fence is handed out
// a majority M of the instances stores a counter ≥ t, written while our key
// was on that instance. A later holder's quorum Q is also a majority, and
// two majorities of N always share an instance j (|M| + |Q| > N). Its key
// on j could only be set after ours left j, so after our counter write on j:
// its own answer from j is > t, and its fence (a maximum over Q) is > t.
// The floor and the clocks only ever raise counters, so they cannot break
// this; they make the answers equal (one round trip of wall time, all
// instances being asked in parallel) whenever every counter is below the
// floor: uncontended acquisitions, new keys, instances that lost their
// counter. The second round is paid when some counters are above the
// floor: a competing attempt raised them (contention), or a client or
// server whose clock is more than a second ahead set them.
// Releases raise every instance's counter to the releaser's highest fence,
// which keeps counters equal. A release is one round trip.
//
// # Lost data
//
// An instance restarted without persistence loses its keys and counters.
// Counters: the proof above needs the shared instance j to remember its
// counter. When it does not, fences still grow as long as the clocks do:
// a missing counter starts from the server's clock in µs, and every floor
// is the client's clock plus a second, while counters grow by one per
// acquisition (fewer than one per µs). So fences stay monotonic through a
// data loss while the clocks of instances and clients agree within about a
// second (NTP). Keys: a lost key lets a second holder in while the first
// still holds the others. Redlock's answer is to keep a restarted instance
// down for at least the longest TTL (the delay-restart rule); with fencing,
// the second holder's larger fence makes storage reject the first's writes
// instead. See docs/lock.md.
//
// Waiting is polling: Acquire retries after a random delay; there is no
// FIFO queue, no hand-off and no Inspector.
package redlock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/lock"
)

var (
	//go:embed counter.lua
	counterSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed raise.lua
	raiseSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed extend.lua
	extendSrc string

	acquireScript = rueidis.NewLuaScript(counterSrc + acquireSrc)
	raiseScript   = rueidis.NewLuaScript(counterSrc + raiseSrc)
	releaseScript = rueidis.NewLuaScript(counterSrc + releaseSrc)
	extendScript  = rueidis.NewLuaScript(extendSrc)
)

// Defaults of Config.
const (
	// DefaultPrefix starts every key this backend writes.
	DefaultPrefix = "llmgate:redlock:"
	// DefaultRetryDelay is the longest pause between two attempts of a
	// waiting Acquire; each pause is random in [delay/2, delay], so that
	// contenders that split the instances between them do not collide again.
	DefaultRetryDelay = 50 * time.Millisecond
	// DefaultCallTimeout bounds one call to one instance.
	DefaultCallTimeout = time.Second
)

// ErrInvalidConfig is wrapped by New's errors.
var ErrInvalidConfig = errors.New("lock: redlock: invalid config")

// Config configures a Backend.
type Config struct {
	// Prefix starts every key. Default DefaultPrefix.
	Prefix string
	// RetryDelay is the longest pause between attempts of a waiting
	// Acquire. Default DefaultRetryDelay.
	RetryDelay time.Duration
	// CallTimeout bounds one call to one instance (and never exceeds the
	// lease of an acquisition). An instance that does not answer within it
	// counts as a failure. Default DefaultCallTimeout.
	CallTimeout time.Duration
}

// Backend is a lock.Backend over independent Redis instances. It is safe
// for concurrent use.
type Backend struct {
	cs          []rueidis.Client
	quorum      int
	prefix      string
	retryDelay  time.Duration
	callTimeout time.Duration
	// maxFence is the highest fence this Backend has handed out: the floor
	// of its acquisitions and what its releases raise counters to.
	maxFence atomic.Uint64
	rounds   [2]atomic.Int64 // acquisitions that took one round, two rounds
	attempts atomic.Uint64   // numbers attempts, so that each writes its own value
	// stragglers maps the token of a lease whose acquisition still has
	// calls in flight to a channel closed when they are all answered: its
	// release waits for them, or a late SET could land after the release
	// (rueidis resends a script as EVAL after NOSCRIPT, which lets a later
	// command overtake it) and pin the key for a TTL.
	stragglers sync.Map // token -> chan struct{}
}

var _ lock.Backend = (*Backend)(nil)

// New returns a backend over clients, one per independent instance (use an
// odd number, 3 or 5: N/2+1 of them must agree). The caller keeps
// ownership of the clients.
func New(clients []rueidis.Client, cfg Config) (*Backend, error) {
	if len(clients) == 0 {
		return nil, fmt.Errorf("%w: no instances", ErrInvalidConfig)
	}
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("%w: client %d is nil", ErrInvalidConfig, i)
		}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.RetryDelay < 0 || cfg.CallTimeout < 0 {
		return nil, fmt.Errorf("%w: negative RetryDelay or CallTimeout", ErrInvalidConfig)
	}
	return &Backend{
		cs:          clients,
		quorum:      len(clients)/2 + 1,
		prefix:      cfg.Prefix,
		retryDelay:  cfg.RetryDelay,
		callTimeout: cfg.CallTimeout,
	}, nil
}

// Quorum is how many instances must agree: N/2+1.
func (b *Backend) Quorum() int { return b.quorum }

// Rounds reports how many acquisitions took one round trip and how many
// took two (their quorum answered different fences).
func (b *Backend) Rounds() (one, two int64) { return b.rounds[0].Load(), b.rounds[1].Load() }

// Key returns the Redis key of the lock named key on every instance: its
// value is "token:attempt" (the owner's token, and which of its attempts
// set it), and its fence counter is Key(key) + ":f".
func (b *Backend) Key(key string) string { return b.prefix + "{" + key + "}" }

func (b *Backend) keys(key string) []string { k := b.Key(key); return []string{k, k + ":f"} }

func (b *Backend) floor() string { return strconv.FormatUint(b.maxFence.Load(), 10) }

// clockLead is how far ahead of this machine's clock an acquisition's floor
// is set: further than the instances' clocks may be ahead of ours (they
// start missing counters from their clocks), so that every counter of an
// uncontended acquisition sits below the floor and all answer floor + 1.
const clockLead = time.Second

// acquireFloor is the floor of an acquisition: the highest fence seen, or
// this machine's clock in µs plus clockLead if that is higher. It only
// raises counters (always safe); equal floors give equal answers, so the
// acquisition needs one round even on a new key or after an instance lost
// its counter, and fences stay above the clocks.
func (b *Backend) acquireFloor() string {
	return strconv.FormatUint(max(b.maxFence.Load(), uint64(time.Now().Add(clockLead).UnixMicro())), 10)
}

func (b *Backend) seen(fence uint64) {
	for {
		cur := b.maxFence.Load()
		if fence <= cur || b.maxFence.CompareAndSwap(cur, fence) {
			return
		}
	}
}

// answer is one instance's reply to a fan-out.
type answer struct {
	i   int
	v   int64
	err error
}

// fanout runs one script on every instance in parallel, each call bounded
// by deadline (and not by the caller's cancellation: a call that may have
// changed an instance is always seen to its end).
type fanout struct {
	ch  chan answer
	got []answer
	n   int
}

func (b *Backend) fanout(ctx context.Context, deadline time.Time, s *rueidis.Lua, keys []string, args ...string) *fanout {
	f := &fanout{ch: make(chan answer, len(b.cs)), n: len(b.cs)}
	base := context.WithoutCancel(ctx)
	for i, c := range b.cs {
		go func() {
			cctx, cancel := context.WithDeadline(base, deadline)
			v, err := s.Exec(cctx, c, keys, args).AsInt64()
			cancel()
			f.ch <- answer{i, v, err}
		}()
	}
	return f
}

// until reads answers until ok counts a quorum of them, or too many others
// do for a quorum to be possible, or all are in. It reports whether ok
// reached the quorum.
func (f *fanout) until(quorum int, ok func(answer) bool) bool {
	yes, no := 0, 0
	for _, a := range f.got {
		if ok(a) {
			yes++
		} else {
			no++
		}
	}
	for yes < quorum && no <= f.n-quorum && len(f.got) < f.n {
		a := <-f.ch
		f.got = append(f.got, a)
		if ok(a) {
			yes++
		} else {
			no++
		}
	}
	return yes >= quorum
}

// rest waits for the answers not read yet (each call is bounded by its
// deadline) and returns them.
func (f *fanout) rest() []answer {
	var late []answer
	for len(f.got)+len(late) < f.n {
		late = append(late, <-f.ch)
	}
	return late
}

// errs joins the errors among the answers read.
func (f *fanout) errs() error {
	var errs []error
	for _, a := range f.got {
		if a.err != nil {
			errs = append(errs, fmt.Errorf("instance %d: %w", a.i, a.err))
		}
	}
	return errors.Join(errs...)
}

// callDeadline bounds a call that starts now by CallTimeout, limit (if not
// zero) and ctx's deadline.
func (b *Backend) callDeadline(ctx context.Context, start time.Time, limit time.Duration) time.Time {
	d := b.callTimeout
	if limit > 0 && limit < d {
		d = limit
	}
	deadline := start.Add(d)
	if cd, ok := ctx.Deadline(); ok && cd.Before(deadline) {
		deadline = cd
	}
	return deadline
}

// attempt makes one acquisition attempt. It returns ErrNotObtained when a
// quorum cannot be reached because the lock is held, and another error when
// instances failed (then the attempt may succeed later).
func (b *Backend) attempt(ctx context.Context, key, token string, ttl time.Duration) (lock.Grant, error) {
	start := time.Now()
	valid := lock.SafeValidity(start, ttl)
	keys := b.keys(key)
	ttlMS := strconv.FormatInt(ttl.Milliseconds(), 10)
	// The value names the attempt, so that undoing a failed attempt can
	// never delete the key a later attempt of the same acquisition set.
	value := token + ":" + strconv.FormatUint(b.attempts.Add(1), 36)
	f := b.fanout(ctx, b.callDeadline(ctx, start, ttl), acquireScript, keys, value, ttlMS, b.acquireFloor(), token)
	taken := func(a answer) bool { return a.err == nil && a.v > 0 }
	if f.until(b.quorum, taken) {
		var fence int64
		same := true
		n := 0
		for _, a := range f.got {
			if !taken(a) {
				continue
			}
			if n > 0 && a.v != fence {
				same = false
			}
			fence = max(fence, a.v)
			n++
		}
		if !same && !b.raise(ctx, keys, value, fence, valid) {
			b.abort(ctx, f, keys, value)
			return lock.Grant{}, fmt.Errorf("%w: %q: the second round did not confirm on a quorum", lock.ErrNotObtained, key)
		}
		if !time.Now().Before(valid) {
			b.abort(ctx, f, keys, value)
			return lock.Grant{}, fmt.Errorf("%w: %q: validity ran out during acquisition", lock.ErrNotObtained, key)
		}
		b.rounds[btoi(!same)].Add(1)
		b.seen(uint64(fence))
		// Late answers that took the key belong to this lease: its release
		// and renewals go to every instance. Their fences are remembered,
		// so the release raises the other counters to them too.
		if len(f.got) < f.n {
			done := make(chan struct{})
			b.stragglers.Store(token, done)
			go func() {
				for _, a := range f.rest() {
					if taken(a) {
						b.seen(uint64(a.v))
					}
				}
				close(done)
				b.stragglers.Delete(token)
			}()
		}
		return lock.Grant{Fence: uint64(fence), ValidUntil: valid}, nil
	}
	err := f.errs()
	b.abort(ctx, f, keys, value)
	held := 0
	for _, a := range f.got {
		if a.err == nil && a.v == 0 {
			held++
		}
	}
	if held > len(b.cs)-b.quorum || err == nil {
		return lock.Grant{}, lock.ErrNotObtained
	}
	return lock.Grant{}, fmt.Errorf("lock: redlock acquire %q: no quorum: %w", key, err)
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

// raise is the second round: counters raised to fence, ownership confirmed
// on a quorum before valid.
func (b *Backend) raise(ctx context.Context, keys []string, value string, fence int64, valid time.Time) bool {
	deadline := b.callDeadline(ctx, time.Now(), time.Until(valid))
	f := b.fanout(ctx, deadline, raiseScript, keys, value, strconv.FormatInt(fence, 10))
	return f.until(b.quorum, func(a answer) bool { return a.err == nil && a.v == 1 })
}

// abort undoes a failed attempt: the attempt's key is deleted wherever it
// was taken, once every instance has answered (each call is bounded by its
// deadline), so that nothing is left behind when the attempt returns. An
// instance whose call failed may still run it late (a timeout, a paused
// server): it is sent the undo too, in the background; the undo names
// the attempt, so it cannot touch a later attempt's key, and a key it misses
// expires within the lease.
func (b *Backend) abort(ctx context.Context, f *fanout, keys []string, value string) {
	ctx = context.WithoutCancel(ctx)
	undo := func(i int) {
		dctx, cancel := context.WithTimeout(ctx, b.callTimeout)
		_ = releaseScript.Exec(dctx, b.cs[i], keys, []string{value, b.floor()}).Error()
		cancel()
	}
	var wg sync.WaitGroup
	for _, a := range append(f.got, f.rest()...) {
		switch {
		case a.err != nil:
			go undo(a.i)
		case a.v > 0:
			wg.Go(func() { undo(a.i) })
		}
	}
	wg.Wait()
}

// TryAcquire makes one attempt.
func (b *Backend) TryAcquire(ctx context.Context, key, token string, opts lock.Options) (lock.Grant, error) {
	return b.attempt(ctx, key, token, opts.TTL)
}

// Acquire makes attempts, a random pause of up to Config.RetryDelay apart,
// until one succeeds or ctx ends. opts.Fair and opts.WaiterLease are
// ignored: there is no queue.
func (b *Backend) Acquire(ctx context.Context, key, token string, opts lock.Options) (lock.Grant, error) {
	var lastErr error
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return lock.Grant{}, errors.Join(lock.ErrNotObtained, err, lastErr)
		}
		g, err := b.attempt(ctx, key, token, opts.TTL)
		if err == nil {
			return g, nil
		}
		if !errors.Is(err, lock.ErrNotObtained) {
			lastErr = err
		}
		d := b.retryDelay/2 + rand.N(b.retryDelay/2+1)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return lock.Grant{}, errors.Join(lock.ErrNotObtained, ctx.Err(), lastErr)
		}
	}
}

// Release deletes the lock on every instance that token owns it on. It
// returns ErrNotHeld when a quorum says token owns it nowhere there (the
// lease had expired on a majority: someone else may have it).
//
// A connection error from one instance is retried twice (a restarted
// instance's first call meets the broken connection): a release that
// half-succeeded would otherwise be retried whole by Lease.Release and
// reported as lost.
func (b *Backend) Release(ctx context.Context, key, token string) error {
	if done, ok := b.stragglers.Load(token); ok {
		select {
		case <-done.(chan struct{}):
		case <-ctx.Done():
		}
	}
	keys := b.keys(key)
	f := b.fanout(ctx, b.callDeadline(ctx, time.Now(), 0), releaseScript, keys, token+":", b.floor())
	f.got = append(f.got, f.rest()...)
	for i, a := range f.got {
		for retry := 1; retry <= 2 && a.err != nil && ctx.Err() == nil; retry++ {
			if _, isReply := rueidis.IsRedisErr(a.err); isReply {
				break
			}
			t := time.NewTimer(time.Duration(retry) * 10 * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), b.callDeadline(ctx, time.Now(), 0))
			a.v, a.err = releaseScript.Exec(cctx, b.cs[a.i], keys, []string{token + ":", b.floor()}).AsInt64()
			cancel()
		}
		f.got[i] = a
	}
	return b.verdict(f, key, "release")
}

// verdict reads a release's or an extension's answers: nil if a quorum
// owned the lock, ErrNotHeld if too many did not for a quorum to exist,
// else the instances' errors.
func (b *Backend) verdict(f *fanout, key, op string) error {
	owned, not := 0, 0
	for _, a := range f.got {
		switch {
		case a.err != nil:
		case a.v == 1:
			owned++
		default:
			not++
		}
	}
	switch {
	case owned >= b.quorum:
		return nil
	case not > len(b.cs)-b.quorum:
		return lock.ErrNotHeld
	}
	return fmt.Errorf("lock: redlock %s %q: owned on %d of %d instances, %d needed: %w", op, key, owned, len(b.cs), b.quorum, f.errs())
}

// Extend resets the lease to ttl on every instance token owns it on; the
// lease is confirmed when a quorum did so, and is valid for ttl − drift
// from the moment the extension was sent.
func (b *Backend) Extend(ctx context.Context, key, token string, ttl time.Duration) (time.Time, error) {
	start := time.Now()
	f := b.fanout(ctx, b.callDeadline(ctx, start, ttl), extendScript, b.keys(key)[:1], token+":", strconv.FormatInt(ttl.Milliseconds(), 10))
	f.until(b.quorum, func(a answer) bool { return a.err == nil && a.v == 1 })
	if err := b.verdict(f, key, "extend"); err != nil {
		return time.Time{}, err
	}
	valid := lock.SafeValidity(start, ttl)
	if !time.Now().Before(valid) {
		return time.Time{}, fmt.Errorf("lock: redlock extend %q: confirmed after its validity ran out", key)
	}
	return valid, nil
}

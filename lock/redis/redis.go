// Package redis is the Redis (and Valkey) lock backend: Lua scripts for atomic take, hand-off and renewal, with waiters woken one at a time by Pub/Sub.
//
// # Protocol
//
// A lock named K lives in keys sharing the hash tag {K}, so every script
// touches one Cluster slot:
//
//	<prefix>{K}     while nobody waits, the owner's token, with the lease as
//	                the key's TTL; while waiters may be queued,
//	                "owner:expires_ms:fence:granted_us:grant_ms" (the lease
//	                in server time), living 7 days; missing when free
//	<prefix>{K}:f   the last fence minted
//	<prefix>{K}:q   zset: waiters in arrival order
//	<prefix>{K}:l   zset: each waiter's lease (its place expires unless renewed)
//
// An uncontended acquire is a SET NX PX plus a fence, and an uncontended
// release a compare-and-delete; the first waiter to queue moves the lease
// into the value (the long form), so the key outlives a crashed holder's
// lease and no newcomer can take a lock that queued waiters are owed.
//
// Acquire runs acquire.lua: it takes a free lock or queues the caller, who
// then waits for a wake-up. Release runs release.lua, which makes the first
// live waiter the owner (new fence, lease set by the server) and publishes
// the grant on the Pub/Sub channel of that waiter's Backend: one waiter
// wakes, already holding the lock, with no further round trip. Each Backend
// subscribes once, on a dedicated connection of its client, so waiting
// costs no extra command. Closing the client does not close that
// connection: Backend.Close does.
//
// A waiter also wakes on a client-side timer: at the holder's remaining
// lease if it is first in the queue (so a crashed holder is taken over right
// when its lease expires) and every third of the waiter lease otherwise (to
// renew its place). Pub/Sub may drop a message while a connection is being
// re-established; the timer then finds the grant in <prefix>{K}, so no
// wake-up is ever lost, only delayed.
//
// Fencing tokens are max(last + 1, server TIME in µs): they increase per key
// forever, even if Redis restarts without persistence or fails over to a
// lagging replica and forgets the last one.
package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/lock"
)

var (
	//go:embed fence.lua
	fenceSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed extend.lua
	extendSrc string

	acquireScript = newScript(fenceSrc + acquireSrc)
	releaseScript = newScript(fenceSrc + releaseSrc)
	extendScript  = newScript(fenceSrc + extendSrc)
)

// DefaultPrefix starts every key this backend writes.
const DefaultPrefix = "llmgate:lock:"

// Config configures a Backend.
type Config struct {
	// Prefix starts every key. Default DefaultPrefix.
	Prefix string
	// AckReplicas, when positive, makes every acquisition and extension
	// wait until that many replicas acknowledge it (WAIT, sent with the
	// script: no extra round trip), so that a failover to one of them keeps
	// the lock. One they do not acknowledge within AckTimeout fails with
	// ErrNotReplicated and is undone (fail closed): TryAcquire and Extend
	// return it, Acquire retries until its context ends. A lock handed over
	// by a release is confirmed by an acknowledged extension before Acquire
	// returns it. Default 0: replication stays asynchronous, and a failover
	// can lose a lock just taken (docs/failover.md).
	AckReplicas int
	// AckTimeout bounds that wait. Default DefaultAckTimeout.
	AckTimeout time.Duration
}

// Backend is a lock.Backend on Redis or Valkey 7+, standalone, Sentinel or
// Cluster.
type Backend struct {
	c           rueidis.Client
	prefix      string
	channel     string // this Backend's wake-up channel suffix (random)
	ackReplicas int
	ackTimeout  time.Duration

	mu      sync.Mutex // protects gates, waiters
	gates   map[string]*gate
	waiters map[string]chan string // token -> grant published for it

	subOnce   sync.Once
	subReady  chan struct{} // closed once the wake-up channel is subscribed
	subFailed chan struct{} // closed if the server refuses the subscription; see subErr
	subErr    error         // why it refused; set before subFailed is closed
	subDone   chan struct{} // closed when the subscription has ended for good

	subMu sync.Mutex              // protects sub; held to close stop
	sub   rueidis.DedicatedClient // the subscription's connection, while it has one
	stop  chan struct{}           // closed by Close
}

// ErrClosed is returned by Acquire after Close.
var ErrClosed = errors.New("lock: redis: backend closed")

var (
	_ lock.Backend   = (*Backend)(nil)
	_ lock.Inspector = (*Backend)(nil)
)

// New returns a backend that stores locks through c. The caller keeps
// ownership of c, and calls Close on the backend before closing c.
func New(c rueidis.Client, cfg Config) *Backend {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	return &Backend{
		c:           c,
		prefix:      cfg.Prefix,
		ackReplicas: cfg.AckReplicas,
		ackTimeout:  cfg.AckTimeout,
		channel:     lock.NewToken(),
		gates:       make(map[string]*gate),
		waiters:     make(map[string]chan string),
		subReady:    make(chan struct{}),
		subFailed:   make(chan struct{}),
		subDone:     make(chan struct{}),
		stop:        make(chan struct{}),
	}
}

// Close ends the wake-up subscription and closes its connection, which
// the client would keep open past its own Close: a dedicated connection
// in use is not the client's to close. Call it before closing the client.
// After Close, Acquire fails with ErrClosed, and waits already under way
// go on woken by their timers only; TryAcquire, Release and Extend still
// work until the client is closed.
func (b *Backend) Close() {
	b.subMu.Lock()
	if b.closing() {
		b.subMu.Unlock()
		<-b.subDone
		return
	}
	close(b.stop)
	if b.sub != nil {
		// Under subMu: subscribe hands the connection back to the pool
		// only after clearing sub, so this never closes a pooled one.
		b.sub.Close() // ends subscribe's wait on the hooks' channel
	}
	b.subMu.Unlock()
	b.subOnce.Do(func() { close(b.subDone) }) // never started: nothing to wait for
	<-b.subDone
}

// closing reports whether Close was called.
func (b *Backend) closing() bool {
	select {
	case <-b.stop:
		return true
	default:
		return false
	}
}

// Key returns the Redis key of the lock named key (its value is described
// in the package documentation).
func (b *Backend) Key(key string) string { return b.prefix + "{" + key + "}" }

// channelPrefix starts every wake-up channel of this prefix.
func (b *Backend) channelPrefix() string { return b.prefix + "wake:" }

// subscribe keeps the wake-up subscription alive until Close, or until the
// client closes.
// It uses a dedicated connection: subscribing on the client's shared one
// would switch that connection to background reading for good, which costs
// every later command two goroutine hand-offs.
func (b *Backend) subscribe() {
	defer close(b.subDone)
	channel := b.channelPrefix() + b.channel
	backoff := 10 * time.Millisecond
	for {
		dc, release := b.c.Dedicate()
		b.subMu.Lock()
		if b.closing() {
			b.subMu.Unlock()
			release()
			return
		}
		b.sub = dc
		b.subMu.Unlock()
		closed := dc.SetPubSubHooks(rueidis.PubSubHooks{
			OnMessage: b.deliver,
			OnSubscription: func(s rueidis.PubSubSubscription) {
				if s.Kind == "subscribe" {
					b.markSubscribed()
				}
			},
		})
		err := dc.Do(context.Background(), dc.B().Subscribe().Channel(channel).Build()).Error()
		if _, refused := rueidis.IsRedisErr(err); refused {
			// The server says no (an ACL without Pub/Sub, say): waiting
			// cannot work, so Acquire reports it instead of hanging.
			b.subMu.Lock()
			b.sub = nil
			b.subMu.Unlock()
			release()
			b.subErr = fmt.Errorf("lock: redis: cannot subscribe to wake-ups on %q: %w", channel, err)
			close(b.subFailed)
			return
		}
		if err == nil {
			backoff = 10 * time.Millisecond
			err = <-closed // until the connection breaks, or the backend or client closes
		}
		b.subMu.Lock()
		b.sub = nil
		b.subMu.Unlock()
		release()
		if b.closing() || errors.Is(err, rueidis.ErrClosing) {
			return
		}
		// Messages published meanwhile are lost; waiters' timers recover
		// them. Subscribe again.
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-b.stop:
			t.Stop()
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (b *Backend) markSubscribed() {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.subReady:
	default:
		close(b.subReady)
	}
}

// deliver hands a published grant ("token grant") to its waiter.
func (b *Backend) deliver(m rueidis.PubSubMessage) {
	token, grant, ok := strings.Cut(m.Message, " ")
	if !ok {
		return
	}
	b.mu.Lock()
	ch := b.waiters[token]
	b.mu.Unlock()
	if ch != nil {
		select {
		case ch <- grant:
		default: // one grant per acquisition; a duplicate is ignored
		}
	}
}

// ready starts the subscription on first use and waits until it is active.
func (b *Backend) ready(ctx context.Context) error {
	if b.closing() {
		return ErrClosed
	}
	b.subOnce.Do(func() { go b.subscribe() })
	select {
	case <-b.subReady:
		return nil
	case <-b.subFailed:
		return b.subErr
	case <-b.subDone:
		select {
		case <-b.subFailed:
			return b.subErr
		default:
			return ErrClosed // by Close, or the client closed
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// reply is a decoded acquire.lua result.
type reply struct {
	status int64
	fence  int64  // status 1
	grant  string // status 2
	pttl   int64  // status 0, 3
	nowUS  int64
	isHead bool
}

const (
	stTaken    = 1
	stHanded   = 2
	stHeld     = 0
	stQueued   = 3
	noWaitFlag = "0"
)

func (b *Backend) runAcquire(ctx context.Context, key, token, entry string, ttl time.Duration, waiterLease string, queued bool) (reply, error) {
	mayBeQueued := ""
	if queued {
		mayBeQueued = "1"
	}
	args := []string{token, strconv.FormatInt(ttl.Milliseconds(), 10), waiterLease, entry, mayBeQueued}
	res, ackErr := b.write(callCtx(ctx), acquireScript, []string{b.Key(key)}, args)
	vals, err := res.ToArray()
	if err != nil {
		return reply{}, fmt.Errorf("lock: redis acquire %q: %w", key, callErr(ctx, err))
	}
	if ackErr != nil {
		// Whatever it did (taken, queued) may not survive a failover: undo
		// it, best effort (unreplicated, it dies with the master anyway).
		b.abandon(ctx, key, token, entry)
		return reply{}, fmt.Errorf("lock: redis acquire %q: %w", key, ackErr)
	}
	var r reply
	if len(vals) < 3 {
		return r, fmt.Errorf("lock: redis acquire %q: unexpected reply of %d values", key, len(vals))
	}
	if r.status, err = vals[0].AsInt64(); err != nil {
		return r, fmt.Errorf("lock: redis acquire %q: %w", key, err)
	}
	if r.nowUS, err = vals[2].AsInt64(); err != nil {
		return r, fmt.Errorf("lock: redis acquire %q: %w", key, err)
	}
	switch r.status {
	case stTaken:
		r.fence, err = vals[1].AsInt64()
	case stHanded:
		r.grant, err = vals[1].ToString()
	case stHeld, stQueued:
		r.pttl, err = vals[1].AsInt64()
		if r.status == stQueued && len(vals) > 3 {
			h, _ := vals[3].AsInt64()
			r.isHead = h == 1
		}
	default:
		err = fmt.Errorf("unknown status %d", r.status)
	}
	if err != nil {
		return r, fmt.Errorf("lock: redis acquire %q: %w", key, err)
	}
	return r, nil
}

// TryAcquire takes key if it is free and nobody is queued for it.
func (b *Backend) TryAcquire(ctx context.Context, key, token string, opts lock.Options) (lock.Grant, error) {
	start := time.Now()
	r, err := b.runAcquire(ctx, key, token, "", opts.TTL, noWaitFlag, false)
	if err != nil {
		return lock.Grant{}, err
	}
	if r.status != stTaken {
		return lock.Grant{}, lock.ErrNotObtained
	}
	return lock.Grant{Fence: uint64(r.fence), ValidUntil: lock.SafeValidity(start, opts.TTL)}, nil
}

// Acquire takes key, or queues for it until the lock is handed over or ctx
// ends. Connection errors are retried with backoff until ctx ends (the last
// one is reported then); Redis error replies end the wait at once. Without
// opts.Fair, goroutines of this process wait for the same key
// in a local FIFO and only the first of them queues in Redis.
func (b *Backend) Acquire(ctx context.Context, key, token string, opts lock.Options) (lock.Grant, error) {
	if !opts.Fair {
		leave, passed, err := b.enterGate(ctx, key, token, opts.TTL)
		if err != nil {
			return lock.Grant{}, err
		}
		if passed != nil {
			// A goroutine of this process passed it to us.
			return b.confirm(ctx, key, token, "", opts.TTL, *passed, nil)
		}
		defer leave()
	}
	if err := b.ready(ctx); err != nil {
		if ctx.Err() != nil {
			return lock.Grant{}, errors.Join(lock.ErrNotObtained, err)
		}
		return lock.Grant{}, err
	}
	wake := make(chan string, 1)
	b.mu.Lock()
	b.waiters[token] = wake
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.waiters, token)
		b.mu.Unlock()
	}()

	grantTTL := min(opts.TTL, opts.WaiterLease)
	entry := token + ":" + strconv.FormatInt(grantTTL.Milliseconds(), 10) + ":" + b.channel
	waiterLease := strconv.FormatInt(opts.WaiterLease.Milliseconds(), 10)
	renewEvery := opts.WaiterLease / 3
	var lastErr error // the last transient store error, reported if ctx ends
	backoff := 10 * time.Millisecond
	// retry reports whether err is worth another attempt after a backoff;
	// Redis error replies (a script error, NOPERM, WRONGTYPE) are not.
	retry := func(err error) bool {
		if _, isReply := rueidis.IsRedisErr(err); isReply || ctx.Err() != nil {
			return false
		}
		lastErr = err
		t := time.NewTimer(backoff)
		defer t.Stop()
		backoff = min(2*backoff, 500*time.Millisecond)
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	fail := func(err error) (lock.Grant, error) {
		b.abandon(ctx, key, token, entry)
		if ctx.Err() != nil {
			return lock.Grant{}, errors.Join(lock.ErrNotObtained, ctx.Err(), lastErr)
		}
		return lock.Grant{}, err
	}
	// (sent, serverUS) maps server time to local time: the call that sent at
	// sent read the server clock at serverUS, so sent is no later than the
	// local time of serverUS.
	var sent time.Time
	var serverUS int64
	queued := false       // whether an attempt may have left an entry in the queue
	var timer *time.Timer // made at the first wait: most acquisitions never wait
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		start := time.Now()
		r, err := b.runAcquire(ctx, key, token, entry, opts.TTL, waiterLease, queued)
		if err != nil {
			queued = true // the attempt may have run without its reply reaching us
			if retry(err) {
				continue
			}
			return fail(err)
		}
		backoff = 10 * time.Millisecond
		switch r.status {
		case stTaken:
			return lock.Grant{Fence: uint64(r.fence), ValidUntil: lock.SafeValidity(start, opts.TTL)}, nil
		case stHanded:
			// Granted while we slept (the wake-up was lost or is in flight),
			// or taken by an attempt whose reply was lost.
			g, err := parseGrant(r.grant, start, r.nowUS, opts.TTL)
			return b.confirm(ctx, key, token, entry, opts.TTL, g, err)
		}
		queued = true
		sent, serverUS = start, r.nowUS
		wait := renewEvery
		if r.isHead && r.pttl >= 0 && time.Duration(r.pttl)*time.Millisecond < wait {
			// Wake right when the holder's lease runs out, in case it crashed.
			wait = time.Duration(r.pttl+1) * time.Millisecond
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case g := <-wake:
			grant, err := parseGrant(g, sent, serverUS, opts.TTL)
			return b.confirm(ctx, key, token, entry, opts.TTL, grant, err)
		case <-timer.C:
			// Renew our place, or take a lock whose holder died.
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
}

// confirm, with AckReplicas, makes sure a lock handed over by a release is
// on the replicas before Acquire returns it: the release that wrote the
// hand-off ran on another connection, which this one's WAIT cannot see,
// so an acknowledged extension by the new owner stands for it (replicas
// apply writes in order). It extends to the full ttl at once, so the
// grant needs no top-up. Not acknowledged, the lock is given up.
func (b *Backend) confirm(ctx context.Context, key, token, entry string, ttl time.Duration, g lock.Grant, err error) (lock.Grant, error) {
	if err != nil || b.ackReplicas <= 0 {
		return g, err
	}
	until, err := b.Extend(ctx, key, token, ttl)
	if err != nil {
		b.abandon(ctx, key, token, entry)
		return lock.Grant{}, errors.Join(lock.ErrNotObtained, err, ctx.Err())
	}
	return lock.Grant{Fence: g.Fence, ValidUntil: until, TTL: ttl, HandedOff: g.HandedOff}, nil
}

// abandon takes a waiter that gives up out of the queue; if the lock was
// handed to it meanwhile, the release passes it on to the next waiter.
func (b *Backend) abandon(ctx context.Context, key, token, entry string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = b.release(ctx, key, token, entry) // best effort: the waiter lease expires anyway
}

// parseGrant turns a hand-off grant "fence:granted_us:grant_ms" into a
// Grant. sent is a local time no later than the server time serverUS, so
// sent + (expiry - serverUS) is no later than the expiry in local time.
func parseGrant(g string, sent time.Time, serverUS int64, ttl time.Duration) (lock.Grant, error) {
	parts := strings.Split(g, ":")
	if len(parts) != 3 {
		return lock.Grant{}, fmt.Errorf("lock: redis: malformed grant %q", g)
	}
	fence, err1 := strconv.ParseUint(parts[0], 10, 64)
	grantedUS, err2 := strconv.ParseInt(parts[1], 10, 64)
	grantMS, err3 := strconv.ParseInt(parts[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return lock.Grant{}, fmt.Errorf("lock: redis: malformed grant %q: %w", g, err)
	}
	granted := time.Duration(grantMS) * time.Millisecond
	expiresIn := time.Duration(grantedUS-serverUS)*time.Microsecond + granted
	// SafeValidity subtracts drift for the granted lease length.
	valid := lock.SafeValidity(sent.Add(expiresIn-granted), granted)
	return lock.Grant{Fence: fence, ValidUntil: valid, TTL: min(granted, ttl), HandedOff: true}, nil
}

// Release frees key, or passes it on, if token owns it. Goroutines of this
// process waiting for key without fair mode get it first, directly (one
// round trip, no wake-up through Redis), unless the first waiter queued in
// Redis has waited longer than passLimit: then it gets it, so a busy process
// cannot keep the lock from others for long.
func (b *Backend) Release(ctx context.Context, key, token string) error {
	w := b.claimLocalWaiter(key)
	if w == nil {
		return b.release(ctx, key, token, "")
	}
	start := time.Now()
	res, err := b.runRelease(ctx, key, token, "", w)
	if err == nil && res.status == relPassed {
		w.turn <- localTurn{grant: &lock.Grant{Fence: uint64(res.fence), ValidUntil: lock.SafeValidity(start, w.ttl), HandedOff: true}}
		return nil
	}
	b.unclaim(key, w) // not passed: it waits on, first in line
	if err != nil {
		return err
	}
	if res.status == relNotOwner {
		return lock.ErrNotHeld
	}
	return nil
}

// passLimit is how long the first waiter queued in Redis may have waited
// before a release stops passing the lock to goroutines of its own process.
const passLimit = 5 * time.Millisecond

// release.lua results.
const (
	relNotOwner = 0
	relReleased = 1
	relHanded   = 2
	relPassed   = 3
)

type releaseReply struct {
	status int64
	fence  int64
}

func (b *Backend) runRelease(ctx context.Context, key, token, entry string, pass *localWaiter) (releaseReply, error) {
	args := []string{token, entry, b.channelPrefix(), "", "", ""}
	if pass != nil {
		args[3] = pass.token
		args[4] = strconv.FormatInt(pass.ttl.Milliseconds(), 10)
		args[5] = strconv.FormatInt(passLimit.Microseconds(), 10)
	}
	vals, err := releaseScript.Lua.Exec(callCtx(ctx), b.c, []string{b.Key(key)}, args).ToArray()
	if err != nil {
		return releaseReply{}, fmt.Errorf("lock: redis release %q: %w", key, callErr(ctx, err))
	}
	var r releaseReply
	if len(vals) == 0 {
		return r, fmt.Errorf("lock: redis release %q: empty reply", key)
	}
	if r.status, err = vals[0].AsInt64(); err == nil && r.status == relPassed {
		if len(vals) < 2 {
			return r, fmt.Errorf("lock: redis release %q: unexpected reply of %d values", key, len(vals))
		}
		r.fence, err = vals[1].AsInt64()
	}
	if err != nil {
		return r, fmt.Errorf("lock: redis release %q: %w", key, err)
	}
	return r, nil
}

func (b *Backend) release(ctx context.Context, key, token, entry string) error {
	r, err := b.runRelease(ctx, key, token, entry, nil)
	if err != nil {
		return err
	}
	if r.status == relNotOwner {
		return lock.ErrNotHeld
	}
	return nil
}

// Extend resets token's lease on key to ttl from now.
func (b *Backend) Extend(ctx context.Context, key, token string, ttl time.Duration) (time.Time, error) {
	start := time.Now()
	res, ackErr := b.write(callCtx(ctx), extendScript, []string{b.Key(key)}, []string{token, strconv.FormatInt(ttl.Milliseconds(), 10)})
	n, err := res.AsInt64()
	if err != nil {
		return time.Time{}, fmt.Errorf("lock: redis extend %q: %w", key, callErr(ctx, err))
	}
	if n == 0 {
		return time.Time{}, lock.ErrNotHeld
	}
	if ackErr != nil {
		// Still held on the master, maybe not on its replicas: the caller
		// must not count on the new validity.
		return time.Time{}, fmt.Errorf("lock: redis extend %q: %w", key, ackErr)
	}
	return lock.SafeValidity(start, ttl), nil
}

// Waiters returns how many waiters are queued in Redis for key (live or not
// yet evicted).
func (b *Backend) Waiters(ctx context.Context, key string) (int, error) {
	n, err := b.c.Do(callCtx(ctx), b.c.B().Zcard().Key(b.Key(key)+":q").Build()).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("lock: redis waiters %q: %w", key, callErr(ctx, err))
	}
	return int(n), nil
}

// gate is the process-local queue for one key in not-fair mode: only one
// goroutine (the one with the store turn) queues in Redis; the others wait
// here in arrival order, for the store turn or for a holder in this process
// to pass them the lock directly.
type gate struct {
	busy    bool           // a goroutine of this process has the store turn
	waiters []*localWaiter // the others, in arrival order
	refs    int            // goroutines using this gate
}

type localWaiter struct {
	token string
	ttl   time.Duration
	turn  chan localTurn // buffered(1)
	// claimed is set while a releaser tries to pass the lock to this waiter
	// (it is then out of waiters); cancelled is set if the waiter gave up
	// meanwhile.
	claimed, cancelled bool
}

// localTurn is what a local waiter is given: the lock itself, or the store turn.
type localTurn struct {
	grant *lock.Grant
}

// enterGate waits for the store turn for key, or for the lock itself from a
// goroutine of this process. leave passes the store turn on.
func (b *Backend) enterGate(ctx context.Context, key, token string, ttl time.Duration) (leave func(), passed *lock.Grant, err error) {
	b.mu.Lock()
	g := b.gates[key]
	if g == nil {
		g = &gate{}
		b.gates[key] = g
	}
	g.refs++
	leave = func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.passTurnLocked(g)
		b.dropRefLocked(key, g)
	}
	if !g.busy {
		g.busy = true
		b.mu.Unlock()
		return leave, nil, nil
	}
	w := &localWaiter{token: token, ttl: ttl, turn: make(chan localTurn, 1)}
	g.waiters = append(g.waiters, w)
	b.mu.Unlock()

	select {
	case t := <-w.turn:
		return b.took(key, g, t, leave)
	case <-ctx.Done():
	}
	b.mu.Lock()
	for i, x := range g.waiters {
		if x == w {
			g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
			b.dropRefLocked(key, g)
			b.mu.Unlock()
			return nil, nil, errors.Join(lock.ErrNotObtained, ctx.Err())
		}
	}
	if !w.claimed {
		// We were given the store turn just as we gave up: pass it on.
		b.mu.Unlock()
		<-w.turn
		leave()
		return nil, nil, errors.Join(lock.ErrNotObtained, ctx.Err())
	}
	// A releaser is passing us the lock right now: see whether it did, and
	// if so pass it on in turn.
	w.cancelled = true
	b.mu.Unlock()
	if t := <-w.turn; t.grant != nil {
		_ = b.Release(context.WithoutCancel(ctx), key, token)
	}
	b.mu.Lock()
	b.dropRefLocked(key, g)
	b.mu.Unlock()
	return nil, nil, errors.Join(lock.ErrNotObtained, ctx.Err())
}

// took turns what a local waiter was given into enterGate's results.
func (b *Backend) took(key string, g *gate, t localTurn, leave func()) (func(), *lock.Grant, error) {
	if t.grant != nil {
		b.mu.Lock()
		b.dropRefLocked(key, g)
		b.mu.Unlock()
		return nil, t.grant, nil
	}
	return leave, nil, nil
}

// claimLocalWaiter takes the first local waiter of key, if any, for a
// releaser to pass the lock to.
func (b *Backend) claimLocalWaiter(key string) *localWaiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.gates[key]
	if g == nil || len(g.waiters) == 0 {
		return nil
	}
	w := g.waiters[0]
	g.waiters = g.waiters[1:]
	w.claimed = true
	return w
}

// unclaim puts back a local waiter the lock was not passed to, first in
// line; if it gave up meanwhile, it is told so. If the store turn was given
// up while w was claimed (its holder got the lock and left, finding no
// local waiter), w takes it: queued behind nobody, it would wait forever.
func (b *Backend) unclaim(key string, w *localWaiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w.claimed = false
	g := b.gates[key]
	if w.cancelled || g == nil {
		w.turn <- localTurn{}
		return
	}
	if !g.busy {
		g.busy = true
		w.turn <- localTurn{}
		return
	}
	g.waiters = append([]*localWaiter{w}, g.waiters...)
}

// passTurnLocked gives the store turn to the first local waiter, or frees
// it; b.mu must be held.
func (b *Backend) passTurnLocked(g *gate) {
	if len(g.waiters) > 0 {
		w := g.waiters[0]
		g.waiters = g.waiters[1:]
		w.turn <- localTurn{}
		return
	}
	g.busy = false
}

// dropRefLocked forgets the gate when nobody uses it; b.mu must be held.
func (b *Backend) dropRefLocked(key string, g *gate) {
	g.refs--
	if g.refs == 0 {
		delete(b.gates, key)
	}
}

// Package redis is the Redis (and Valkey) lock backend: Lua scripts for atomic take, hand-off and renewal, with waiters woken one at a time through their own lists.
//
// # Protocol
//
// A lock named K lives in keys sharing the hash tag {K}, so every script
// touches one Cluster slot:
//
//	<prefix>{K}     "owner:expires_ms:fence:granted_us:grant_ms" while held,
//	                "-:0:fence:0:0" once released; the key lives 7 days
//	<prefix>{K}:q   zset: waiters in arrival order
//	<prefix>{K}:l   zset: each waiter's lease (its place expires unless renewed)
//
// The lease is the expires_ms field (server time), not the key's TTL, so the
// last fence survives every release and expiry.
//
// Acquire runs acquire.lua: it takes a free lock or queues the caller, who
// then waits for a wake-up. Release runs release.lua, which makes the first
// live waiter the owner (new fence, lease set by the server) and publishes
// the grant on the Pub/Sub channel of that waiter's Backend: one waiter
// wakes, already holding the lock, with no further round trip. Each Backend
// subscribes once, on its client's shared connection, so waiting costs no
// extra command and no extra connection.
//
// A waiter also wakes on a client-side timer: at the holder's remaining
// lease if it is first in the queue (so a crashed holder is taken over right
// when its lease expires) and every third of the waiter lease otherwise (to
// renew its place). Pub/Sub may drop a message while a connection is being
// re-established; the timer then finds the grant in <prefix>{K}, so no
// wake-up is ever lost, only delayed.
//
// Fencing tokens are max(last + 1, server TIME in µs): they increase per key
// forever, even if Redis restarts without persistence and forgets the last
// one.
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
	//go:embed acquire.lua
	acquireSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed extend.lua
	extendSrc string

	acquireScript = rueidis.NewLuaScript(acquireSrc)
	releaseScript = rueidis.NewLuaScript(releaseSrc)
	extendScript  = rueidis.NewLuaScript(extendSrc)
)

// DefaultPrefix starts every key this backend writes.
const DefaultPrefix = "llmgate:lock:"

// Config configures a Backend.
type Config struct {
	// Prefix starts every key. Default DefaultPrefix.
	Prefix string
}

// Backend is a lock.Backend on Redis standalone, Sentinel or Cluster.
type Backend struct {
	c       rueidis.Client
	prefix  string
	channel string // this Backend's wake-up channel suffix (random)

	mu      sync.Mutex // protects gates, waiters
	gates   map[string]*gate
	waiters map[string]chan string // token -> grant published for it

	subOnce  sync.Once
	subReady chan struct{} // closed once the wake-up channel is subscribed
}

var (
	_ lock.Backend   = (*Backend)(nil)
	_ lock.Inspector = (*Backend)(nil)
)

// New returns a backend that stores locks through c. The caller keeps
// ownership of c; closing it also ends the backend's subscription.
func New(c rueidis.Client, cfg Config) *Backend {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	return &Backend{
		c:        c,
		prefix:   cfg.Prefix,
		channel:  lock.NewToken(),
		gates:    make(map[string]*gate),
		waiters:  make(map[string]chan string),
		subReady: make(chan struct{}),
	}
}

// Key returns the Redis key holding key's owner token.
func (b *Backend) Key(key string) string { return b.prefix + "{" + key + "}" }

// channelPrefix starts every wake-up channel of this prefix.
func (b *Backend) channelPrefix() string { return b.prefix + "wake:" }

// subscribe keeps the wake-up subscription alive until the client closes.
func (b *Backend) subscribe() {
	ctx := rueidis.WithOnSubscriptionHook(context.Background(), func(s rueidis.PubSubSubscription) {
		if s.Kind == "subscribe" {
			select {
			case <-b.subReady:
			default:
				close(b.subReady)
			}
		}
	})
	cmd := b.c.B().Subscribe().Channel(b.channelPrefix() + b.channel).Build()
	backoff := 10 * time.Millisecond
	for {
		err := b.c.Receive(ctx, cmd, b.deliver)
		if errors.Is(err, rueidis.ErrClosing) {
			return
		}
		// The connection broke; messages meanwhile are lost, and waiters'
		// timers recover them. Subscribe again.
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
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
	b.subOnce.Do(func() { go b.subscribe() })
	select {
	case <-b.subReady:
		return nil
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

func (b *Backend) runAcquire(ctx context.Context, key, token, entry string, ttl time.Duration, waiterLease string) (reply, error) {
	args := []string{token, strconv.FormatInt(ttl.Milliseconds(), 10), waiterLease, entry}
	vals, err := acquireScript.Exec(ctx, b.c, []string{b.Key(key)}, args).ToArray()
	if err != nil {
		return reply{}, fmt.Errorf("lock: redis acquire %q: %w", key, err)
	}
	var r reply
	if len(vals) < 2 {
		return r, fmt.Errorf("lock: redis acquire %q: unexpected reply of %d values", key, len(vals))
	}
	if r.status, err = vals[0].AsInt64(); err != nil {
		return r, fmt.Errorf("lock: redis acquire %q: %w", key, err)
	}
	if r.status != stHanded {
		if len(vals) < 3 {
			return r, fmt.Errorf("lock: redis acquire %q: unexpected reply of %d values", key, len(vals))
		}
		if r.nowUS, err = vals[2].AsInt64(); err != nil {
			return r, fmt.Errorf("lock: redis acquire %q: %w", key, err)
		}
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
	r, err := b.runAcquire(ctx, key, token, "", opts.TTL, noWaitFlag)
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
		leave, err := b.enterGate(ctx, key)
		if err != nil {
			return lock.Grant{}, err
		}
		defer leave()
	}
	if err := b.ready(ctx); err != nil {
		return lock.Grant{}, errors.Join(lock.ErrNotObtained, err)
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
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		start := time.Now()
		r, err := b.runAcquire(ctx, key, token, entry, opts.TTL, waiterLease)
		if err != nil {
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
			// Granted while we slept; the wake-up was lost or is in flight.
			return parseGrant(r.grant, sent, serverUS, opts.TTL)
		}
		sent, serverUS = start, r.nowUS
		wait := renewEvery
		if r.isHead && r.pttl >= 0 && time.Duration(r.pttl)*time.Millisecond < wait {
			// Wake right when the holder's lease runs out, in case it crashed.
			wait = time.Duration(r.pttl+1) * time.Millisecond
		}
		timer.Reset(wait)
		select {
		case g := <-wake:
			return parseGrant(g, sent, serverUS, opts.TTL)
		case <-timer.C:
			// Renew our place, or take a lock whose holder died.
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
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
	return lock.Grant{Fence: fence, ValidUntil: valid, TTL: min(granted, ttl)}, nil
}

// Release frees key, or hands it to the next waiter, if token owns it.
func (b *Backend) Release(ctx context.Context, key, token string) error {
	return b.release(ctx, key, token, "")
}

func (b *Backend) release(ctx context.Context, key, token, entry string) error {
	n, err := releaseScript.Exec(ctx, b.c, []string{b.Key(key)}, []string{token, entry, b.channelPrefix()}).AsInt64()
	if err != nil {
		return fmt.Errorf("lock: redis release %q: %w", key, err)
	}
	if n == 0 {
		return lock.ErrNotHeld
	}
	return nil
}

// Extend resets token's lease on key to ttl from now.
func (b *Backend) Extend(ctx context.Context, key, token string, ttl time.Duration) (time.Time, error) {
	start := time.Now()
	n, err := extendScript.Exec(ctx, b.c, []string{b.Key(key)}, []string{token, strconv.FormatInt(ttl.Milliseconds(), 10)}).AsInt64()
	if err != nil {
		return time.Time{}, fmt.Errorf("lock: redis extend %q: %w", key, err)
	}
	if n == 0 {
		return time.Time{}, lock.ErrNotHeld
	}
	return lock.SafeValidity(start, ttl), nil
}

// Waiters returns how many waiters are queued in Redis for key (live or not
// yet evicted).
func (b *Backend) Waiters(ctx context.Context, key string) (int, error) {
	n, err := b.c.Do(ctx, b.c.B().Zcard().Key(b.Key(key)+":q").Build()).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("lock: redis waiters %q: %w", key, err)
	}
	return int(n), nil
}

// gate is a process-local FIFO for one key: without fair mode only the
// goroutine holding the gate queues in Redis.
type gate struct {
	busy    bool
	waiters []chan struct{} // closed, in order, to pass the gate on
	refs    int             // goroutines using this gate
}

func (b *Backend) enterGate(ctx context.Context, key string) (leave func(), err error) {
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
		b.passLocked(key, g)
	}
	if !g.busy {
		g.busy = true
		b.mu.Unlock()
		return leave, nil
	}
	ch := make(chan struct{})
	g.waiters = append(g.waiters, ch)
	b.mu.Unlock()

	select {
	case <-ch:
		return leave, nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, w := range g.waiters {
		if w == ch {
			g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
			g.refs--
			return nil, errors.Join(lock.ErrNotObtained, ctx.Err())
		}
	}
	// The gate was passed to us just as we gave up: pass it on.
	b.passLocked(key, g)
	return nil, errors.Join(lock.ErrNotObtained, ctx.Err())
}

// passLocked gives the gate to the next local waiter and drops one
// reference; b.mu must be held.
func (b *Backend) passLocked(key string, g *gate) {
	if len(g.waiters) > 0 {
		close(g.waiters[0])
		g.waiters = g.waiters[1:]
	} else {
		g.busy = false
	}
	g.refs--
	if g.refs == 0 {
		delete(b.gates, key)
	}
}

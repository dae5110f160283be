// Package dedup makes identical requests share one execution across processes: the first caller leads and runs it, the others follow and receive the same result, frame by frame as it is produced.
//
// A flight is named by a key the caller builds (for example
// "tenant/sha256-of-body") and carries a fingerprint of the request content.
// The first joiner, in any process, becomes the Leader: it holds a lease
// from the lock package (with a fencing token), makes the call and publishes
// the result as opaque frames. Every other joiner gets a Follower that
// receives the same frames in order, live as they are published, and io.EOF
// after the last one. A finished result stays readable for a retain period,
// so a retry that arrives after the first finished is answered from the
// store. Joining a running or retained flight with a different fingerprint
// is ErrConflict.
//
// If the leader aborts, or its process dies and its lease runs out, its
// followers get ErrLeaderGone and Join again: one of them leads the next
// generation. A follower that already consumed n frames skips the first n of
// the new generation, which is only right for deterministic requests (the
// ones worth de-duplicating).
//
// Within one process, identical joiners share one flight: only the first
// talks to the store, and followers of a local leader receive its frames
// straight from memory. The store side is a Backend: dedup/memory for one
// process, dedup/redis for many. Both pass the conformance suite in
// dedup/deduptest.
package dedup

import (
	"context"
	"errors"
	"fmt"
	"github.com/llmgate/llmgate/clock"
	"strconv"
	"sync"
	"time"

	"github.com/llmgate/llmgate/lock"
)

// Errors returned by this package and its backends.
var (
	// ErrConflict means the key names a running or retained flight of a
	// different request (another fingerprint).
	ErrConflict = errors.New("dedup: key in use with a different request")
	// ErrLeaderGone is returned by Follower.Next when the flight ended
	// without a result: its leader aborted, or its lease ran out before it
	// finished. Join again; one of the joiners leads the next generation.
	ErrLeaderGone = errors.New("dedup: leader gone before finishing")
	// ErrTooLarge is returned by Leader.Publish when the flight would exceed
	// Options.MaxBytes or Options.MaxFrames; the flight is aborted. A
	// follower that receives more than that from another process stops with
	// it too.
	ErrTooLarge = errors.New("dedup: result too large")
	// ErrLost is returned to a Leader whose lease was lost (it expired, or
	// the store no longer names this leader): its flight is over and
	// another joiner may lead the key now.
	ErrLost = errors.New("dedup: leadership lost")
	// ErrClosed is returned by a Leader after Finish or Abort, and by a
	// Follower after Close.
	ErrClosed = errors.New("dedup: flight already closed")
	// ErrInvalid is wrapped by errors about bad arguments or Options.
	ErrInvalid = errors.New("dedup: invalid argument")
)

// Defaults and limits for Options.
const (
	// DefaultLeaseTTL is the leader's lease when Options.LeaseTTL is zero.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultRetain is how long a finished result stays readable when
	// neither Join nor Options says otherwise.
	DefaultRetain = 30 * time.Second
	// DefaultMaxBytes bounds the frame bytes of one flight.
	DefaultMaxBytes = 64 << 20
	// DefaultMaxFrames bounds the number of frames of one flight.
	DefaultMaxFrames = 1 << 17
	// MinLeaseTTL is the smallest LeaseTTL accepted.
	MinLeaseTTL = 100 * time.Millisecond
	// MinRetain is the smallest retain period accepted (the store's
	// expiry resolution).
	MinRetain = time.Millisecond
	// MaxKeyLen and MaxFingerprintLen bound the strings stored per flight.
	MaxKeyLen         = 1024
	MaxFingerprintLen = 1024
)

// Internal tuning.
const (
	// maxWait bounds one blocking read of a follower: after a read that
	// saw nothing for min(LeaseTTL/3, maxWait), the follower checks that
	// the leader still holds its lease.
	maxWait = time.Second
	// readBatch is the most frames one store read returns.
	readBatch = 256
	// maxJoinAttempts bounds the rounds of one Join (each one either makes
	// progress or waits for a lock holder that is about to record its
	// flight).
	maxJoinAttempts = 64
	// maxReadFailures is how many store errors in a row a follower's Next
	// retries before it returns the last one.
	maxReadFailures = 4
	// keepLeases is how many lease TTLs a running flight's store records
	// outlive its last refresh; the leader refreshes them every
	// keepLeases/3 lease TTLs, so records of a leader that died vanish on
	// their own.
	keepLeases = 6
	// endTimeout bounds the store calls a leader makes on its way out when
	// its caller's context is gone (Abort after a loss, lease release).
	endTimeout = 5 * time.Second
)

// Options tune a Group. The zero value is valid.
type Options struct {
	// LeaseTTL is the leader's lease (a lock.Lease renewed by its
	// watchdog). A leader whose process dies is replaced at most about
	// LeaseTTL + min(LeaseTTL/3, 1s) later. Default DefaultLeaseTTL, minimum
	// MinLeaseTTL.
	LeaseTTL time.Duration
	// Retain is how long a finished result stays readable by late joiners
	// when Join is given 0. It must also cover how far a follower may lag
	// behind its leader: a follower that has not read a finished result
	// before it expires gets ErrLeaderGone. Default DefaultRetain, minimum
	// MinRetain.
	Retain time.Duration
	// MaxBytes bounds the total frame bytes of one flight; Publish beyond
	// it fails with ErrTooLarge and aborts the flight. Default
	// DefaultMaxBytes.
	MaxBytes int64
	// MaxFrames bounds the number of frames of one flight, like MaxBytes.
	// Default DefaultMaxFrames.
	MaxFrames int
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.LeaseTTL == 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.Retain == 0 {
		o.Retain = DefaultRetain
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxFrames == 0 {
		o.MaxFrames = DefaultMaxFrames
	}
	return o
}

// Validate reports options a Group cannot honour.
func (o Options) Validate() error {
	if o.LeaseTTL < MinLeaseTTL {
		return fmt.Errorf("%w: LeaseTTL %v is below the minimum %v", ErrInvalid, o.LeaseTTL, MinLeaseTTL)
	}
	if o.Retain < MinRetain {
		return fmt.Errorf("%w: Retain %v is below the minimum %v", ErrInvalid, o.Retain, MinRetain)
	}
	if o.MaxBytes <= 0 {
		return fmt.Errorf("%w: MaxBytes %d must be positive", ErrInvalid, o.MaxBytes)
	}
	if o.MaxFrames <= 0 {
		return fmt.Errorf("%w: MaxFrames %d must be positive", ErrInvalid, o.MaxFrames)
	}
	return nil
}

// Group de-duplicates flights over a Backend and shares them between the
// goroutines of this process. Its methods are safe for concurrent use.
type Group struct {
	b      Backend
	locker *lock.Locker
	opts   Options
	err    error // invalid options, reported by Join

	// wait bounds one blocking read: min(LeaseTTL/3, maxWait).
	wait time.Duration
	// keep is how long a running flight's records live without refresh.
	keep time.Duration

	mu      sync.Mutex         // protects flights
	flights map[string]*flight // by flightID(key, fingerprint)
}

// New returns a Group over b. Invalid options are reported by every Join.
func New(b Backend, opts Options) *Group {
	opts = opts.WithDefaults()
	g := &Group{b: b, opts: opts, err: opts.Validate(), flights: make(map[string]*flight)}
	if b == nil {
		g.err = fmt.Errorf("%w: nil Backend", ErrInvalid)
		return g
	}
	g.locker = lock.New(b.Locks())
	g.wait = min(opts.LeaseTTL/3, maxWait)
	g.keep = keepLeases * opts.LeaseTTL
	return g
}

// Options returns the Group's options with defaults filled in.
func (g *Group) Options() Options { return g.opts }

// flightID names a local flight; the length prefix keeps ("a", "bc") and
// ("ab", "c") apart whatever bytes they contain.
func flightID(key, fingerprint string) string {
	return strconv.Itoa(len(key)) + ":" + key + fingerprint
}

func validate(key, fingerprint string, retain time.Duration) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalid)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key of %d bytes exceeds %d", ErrInvalid, len(key), MaxKeyLen)
	case key[0] == '}':
		// The Redis backend puts the key in a hash tag {key}; "{}..." would
		// hash the whole name and split a flight over Cluster slots.
		return fmt.Errorf("%w: key must not start with '}'", ErrInvalid)
	case len(fingerprint) > MaxFingerprintLen:
		return fmt.Errorf("%w: fingerprint of %d bytes exceeds %d", ErrInvalid, len(fingerprint), MaxFingerprintLen)
	case retain < 0:
		return fmt.Errorf("%w: negative retain %v", ErrInvalid, retain)
	case retain > 0 && retain < MinRetain:
		return fmt.Errorf("%w: retain %v is below the minimum %v", ErrInvalid, retain, MinRetain)
	}
	return nil
}

// Join joins the flight named key (the caller builds keys, e.g.
// "tenant/sha256"). fingerprint identifies the request content (e.g. the
// canonical body hash): joining an existing flight (running or retained)
// with a different fingerprint returns ErrConflict. retain (0 means
// Options.Retain) is how long the result stays readable after Finish.
//
// Exactly one joiner across all processes is the leader (Leader != nil); the
// others get a Follower. A flight whose result is retained gives a Follower
// that replays it (all frames, then io.EOF). A Leader must end with Finish
// or Abort; a Follower with Close.
func (g *Group) Join(ctx context.Context, key, fingerprint string, retain time.Duration) (*Leader, *Follower, error) {
	if g.err != nil {
		return nil, nil, g.err
	}
	if err := validate(key, fingerprint, retain); err != nil {
		return nil, nil, err
	}
	if retain == 0 {
		retain = g.opts.Retain
	}
	for range maxJoinAttempts {
		f, first := g.attach(key, fingerprint)
		if first {
			return g.resolve(ctx, f, retain)
		}
		// Another goroutine of this process is asking the store; share its
		// answer.
		select {
		case <-f.resolved:
		case <-ctx.Done():
			g.detach(f)
			return nil, nil, ctx.Err()
		}
		err := f.resolveErr
		if err == nil {
			return nil, &Follower{f: f}, nil
		}
		g.detach(f)
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, nil, err // the same answer we would get
		}
		// Its context ended, not ours: ask ourselves.
	}
	return nil, nil, fmt.Errorf("dedup: join %q: no answer after %d attempts", key, maxJoinAttempts)
}

// attach returns the live local flight of (key, fingerprint) with one more
// reader, or a new one that the caller must resolve (first).
func (g *Group) attach(key, fingerprint string) (f *flight, first bool) {
	id := flightID(key, fingerprint)
	g.mu.Lock()
	defer g.mu.Unlock()
	if f := g.flights[id]; f != nil {
		f.mu.Lock()
		// A local leader past its lease's validity is about to find out it
		// lost it: do not follow it.
		ended := f.err != nil || (f.leader != nil && !time.Now().Before(f.leader.lease.ValidUntil()))
		if !ended {
			f.readers++
		}
		f.mu.Unlock()
		if !ended {
			return f, false
		}
	}
	f = newFlight(g, id, key, fingerprint)
	g.flights[id] = f
	return f, true
}

// detach drops one reader of f; a flight fed from the store is forgotten
// when nobody reads it any more (a later joiner asks the store again).
func (g *Group) detach(f *flight) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f.mu.Lock()
	f.readers--
	drop := f.readers <= 0 && f.remote
	f.mu.Unlock()
	if drop && g.flights[f.id] == f {
		delete(g.flights, f.id)
	}
}

// forget removes f from the local map, so later joiners ask the store.
func (g *Group) forget(f *flight) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flights[f.id] == f {
		delete(g.flights, f.id)
	}
}

// resolve asks the store whether f's first joiner leads or follows.
func (g *Group) resolve(ctx context.Context, f *flight, retain time.Duration) (*Leader, *Follower, error) {
	l, fl, err := g.claim(ctx, f.key, f.fp)
	if err != nil {
		f.mu.Lock()
		f.err = err
		f.mu.Unlock()
		g.forget(f)
		f.resolveErr = err
		close(f.resolved)
		return nil, nil, err
	}
	if l != nil {
		leader := g.lead(f, l, retain)
		return leader, nil, nil
	}
	f.mu.Lock()
	f.remote = true
	f.gen = fl.Gen
	f.quietSince = time.Now()
	f.readers++
	f.mu.Unlock()
	close(f.resolved)
	return nil, &Follower{f: f}, nil
}

// claim finds the flight of key in the store, or starts it with us as the
// leader (then the lease is returned).
func (g *Group) claim(ctx context.Context, key, fingerprint string) (*lock.Lease, Flight, error) {
	backoff := time.Millisecond
	for range maxJoinAttempts {
		lease, err := g.locker.TryAcquire(ctx, key, lock.Options{TTL: g.opts.LeaseTTL})
		var fl Flight
		switch {
		case err == nil:
			fl, err = g.b.Claim(ctx, key, fingerprint, lease.Fence, g.keep)
			if err == nil && fl.State == StateRunning && fl.Gen == lease.Fence {
				return lease, fl, nil
			}
			// A result retained by the previous leader (or a store error):
			// not ours to lead.
			_ = lease.Release(ctx)
			if err != nil {
				return nil, Flight{}, err
			}
		case errors.Is(err, lock.ErrNotObtained):
			// Someone leads, or is about to record that it does.
			if fl, err = g.b.Lookup(ctx, key); err != nil {
				return nil, Flight{}, err
			}
		default:
			return nil, Flight{}, fmt.Errorf("dedup: join %q: %w", key, err)
		}
		if fl.State == StateRunning || fl.State == StateFinished {
			if fl.Fingerprint != fingerprint {
				return nil, Flight{}, fmt.Errorf("%w: %q", ErrConflict, key)
			}
			return nil, fl, nil
		}
		// The lock is held but no flight is recorded yet: its holder is
		// between taking the lock and recording its flight (one round trip),
		// or died in between (its lease runs out). Look again shortly.
		if err := clock.Sleep(ctx, backoff); err != nil {
			return nil, Flight{}, err
		}
		backoff = min(2*backoff, g.wait)
	}
	return nil, Flight{}, fmt.Errorf("dedup: join %q: the lock stayed held without a recorded flight for %d attempts", key, maxJoinAttempts)
}

// probe checks whether the leader of generation gen of key still holds its
// lease. If it does not, the generation is ended in the store (a no-op if it
// finished meanwhile) and probe reports free.
func (g *Group) probe(ctx context.Context, key string, gen uint64) (free bool, err error) {
	lease, err := g.locker.TryAcquire(ctx, key, lock.Options{TTL: g.opts.LeaseTTL})
	if errors.Is(err, lock.ErrNotObtained) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("dedup: check leader of %q: %w", key, err)
	}
	// Holding the lock, nobody else can start a generation while we end
	// the dead one.
	err = g.b.Abort(ctx, key, gen, g.keep)
	_ = lease.Release(ctx) // best effort: the lease runs out by itself
	if err != nil {
		return false, err
	}
	return true, nil
}

// waitFor returns how long one blocking read may wait: the Group's bound,
// cut to leave a margin before ctx's deadline (so the store replies before
// the deadline aborts the call), or 0 for "do not block".
func (g *Group) waitFor(ctx context.Context) time.Duration {
	w := g.wait
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl) - deadlineMargin
		if left < time.Millisecond {
			return 0
		}
		w = min(w, left)
	}
	return w
}

// deadlineMargin is left between a blocking read and its caller's deadline.
const deadlineMargin = 5 * time.Millisecond

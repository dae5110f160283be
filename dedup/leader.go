package dedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/llmgate/llmgate/lock"
)

// lead makes f's first joiner the leader of generation lease.Fence.
func (g *Group) lead(f *flight, lease *lock.Lease, retain time.Duration) *Leader {
	lease.Keepalive()
	l := &Leader{g: g, f: f, lease: lease, retain: retain, lost: make(chan struct{}), stop: make(chan struct{})}
	f.mu.Lock()
	f.gen = lease.Fence
	f.leader = l
	f.mu.Unlock()
	close(f.resolved)
	go l.watch()
	return l
}

// Leader runs a flight: it publishes frames and ends the flight with Finish
// or Abort (one of them must be called). Its methods are safe for concurrent
// use; Publish calls are applied one at a time.
type Leader struct {
	g      *Group
	f      *flight
	lease  *lock.Lease
	retain time.Duration

	lost     chan struct{} // closed when the lease is lost
	lostOnce sync.Once
	stop     chan struct{} // closed by Finish or Abort: ends watch
	stopOnce sync.Once

	opMu   sync.Mutex // serialises Publish, Finish and Abort; protects size, frames
	size   int64
	frames int

	mu    sync.Mutex // protects state
	state leaderState
}

type leaderState uint8

const (
	leading leaderState = iota
	closed              // Finish or Abort was called
	lost                // the lease or the flight was lost
)

// Fence returns the lease's fencing token, which is also the flight's
// generation: pass it upstream so storage can refuse a stale leader.
func (l *Leader) Fence() uint64 { return l.lease.Fence }

// Key returns the flight key.
func (l *Leader) Key() string { return l.f.key }

// Lost is closed when the lease is lost: it was not renewed in time, or the
// store no longer names this leader. The flight is over then (followers may
// take over) and Publish and Finish return ErrLost. It is not closed by
// Finish or Abort.
func (l *Leader) Lost() <-chan struct{} { return l.lost }

// usableLocked reports why the leader cannot act, if it cannot; l.mu held.
func (l *Leader) usableLocked() error {
	switch l.state {
	case closed:
		return ErrClosed
	case lost:
		return fmt.Errorf("%w: %q", ErrLost, l.f.key)
	}
	return nil
}

func (l *Leader) usable() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.usableLocked()
}

// Publish appends one frame; followers see it live, in order. The frame is
// copied. Any error ends the flight (a frame that may or may not have been
// stored cannot be retried safely): ErrTooLarge past the Group's limits,
// ErrLost if the lease was lost, or the store's error; followers then get
// ErrLeaderGone and one of them leads the next generation.
func (l *Leader) Publish(ctx context.Context, frame []byte) error {
	l.opMu.Lock()
	defer l.opMu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	opts := l.g.opts
	if l.size+int64(len(frame)) > opts.MaxBytes || l.frames >= opts.MaxFrames {
		l.abort(ctx, ErrLeaderGone)
		return fmt.Errorf("%w: %q: more than %d bytes or %d frames", ErrTooLarge, l.f.key, opts.MaxBytes, opts.MaxFrames)
	}
	fr := make([]byte, len(frame))
	copy(fr, frame)
	if err := l.g.b.Append(ctx, l.f.key, l.Fence(), fr, l.g.keep); err != nil {
		if errors.Is(err, ErrLost) {
			l.lose()
			return err
		}
		l.abort(ctx, ErrLeaderGone)
		return fmt.Errorf("dedup: publish to %q: %w", l.f.key, err)
	}
	l.size += int64(len(fr))
	l.frames++
	f := l.f
	f.mu.Lock()
	if f.err == nil {
		f.addLocked([][]byte{fr}) // within limits: checked above with the same options
		f.broadcastLocked()
	}
	f.mu.Unlock()
	return nil
}

// Finish completes the flight: followers receive io.EOF after the last
// frame, and the result stays readable for the retain given to Join. It
// releases the lease. If the store does not confirm, the flight is aborted
// and the error returned.
func (l *Leader) Finish(ctx context.Context) error {
	return l.FinishFor(ctx, l.retain)
}

// Retain is how long the result stays readable after Finish (the retain
// given to Join).
func (l *Leader) Retain() time.Duration { return l.retain }

// FinishFor is Finish with a retain of its own instead of the one given to
// Join: for a result that followers still reading should get, but late
// joiners should not for long (an answer the upstream cut short, say).
func (l *Leader) FinishFor(ctx context.Context, retain time.Duration) error {
	if retain < MinRetain {
		return fmt.Errorf("%w: retain %v is below the minimum %v", ErrInvalid, retain, MinRetain)
	}
	l.opMu.Lock()
	defer l.opMu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	if err := l.g.b.Finish(ctx, l.f.key, l.Fence(), retain); err != nil {
		if errors.Is(err, ErrLost) {
			l.lose()
			return err
		}
		// It may have reached the store or not: an abort settles it (it is
		// a no-op on a finished flight).
		l.abort(ctx, ErrLeaderGone)
		return fmt.Errorf("dedup: finish %q: %w", l.f.key, err)
	}
	l.setState(closed)
	l.f.end(io.EOF)
	l.release(ctx)
	return nil
}

// Abort ends the flight without a usable result (for example, our own client
// left before the upstream answered, or a local failure): the flight is
// removed, followers get ErrLeaderGone at once and Join again, and one of
// them leads. It releases the lease. Abort after Finish, Abort or a loss does
// nothing, so it is safe to defer.
func (l *Leader) Abort(ctx context.Context) error {
	l.opMu.Lock()
	defer l.opMu.Unlock()
	if l.usable() != nil {
		return nil
	}
	return l.abort(ctx, ErrLeaderGone)
}

// abort ends the flight in the store and locally; l.opMu must be held.
func (l *Leader) abort(ctx context.Context, cause error) error {
	l.setState(closed)
	l.f.end(cause)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	err := l.g.b.Abort(ctx, l.f.key, l.Fence(), l.g.keep)
	l.release(ctx)
	if err != nil {
		// The lease is released: the generation ends in the store when a
		// follower finds the lock free, or its records expire.
		return fmt.Errorf("dedup: abort %q: %w", l.f.key, err)
	}
	return nil
}

func (l *Leader) setState(s leaderState) {
	l.mu.Lock()
	if l.state == leading {
		l.state = s
	}
	l.mu.Unlock()
}

// release stops the watch and lets the lease go (bounded; errors only mean
// the lock frees itself at its TTL).
func (l *Leader) release(ctx context.Context) {
	l.stopOnce.Do(func() { close(l.stop) })
	_ = l.lease.Release(ctx)
}

// lose ends the flight after the lease or the flight was lost.
func (l *Leader) lose() {
	l.mu.Lock()
	was := l.state
	if l.state == leading {
		l.state = lost
	}
	l.mu.Unlock()
	if was != leading {
		return // Finish or Abort came first: nothing was lost
	}
	l.lostOnce.Do(func() { close(l.lost) })
	l.f.end(ErrLeaderGone)
	// Tell followers elsewhere at once rather than after their next lease
	// check; a no-op if someone else already took over.
	ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
	defer cancel()
	_ = l.g.b.Abort(ctx, l.f.key, l.Fence(), l.g.keep)
	l.release(ctx)
}

// watch follows the lease and keeps the flight's records alive until the
// leader ends.
func (l *Leader) watch() {
	t := time.NewTicker(l.g.keep / 3)
	defer t.Stop()
	for {
		select {
		case <-l.lease.Done():
			if errors.Is(l.lease.Err(), lock.ErrLost) {
				l.lose()
			}
			return
		case <-l.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), l.g.opts.LeaseTTL)
			err := l.g.b.Refresh(ctx, l.f.key, l.Fence(), l.g.keep)
			cancel()
			if errors.Is(err, ErrLost) {
				l.lose()
				return
			}
			// Another error: the next tick tries again; the records live
			// three ticks.
		}
	}
}

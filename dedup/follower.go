package dedup

import (
	"context"
	"github.com/llmgate/llmgate/clock"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// flight is one flight as this process sees it: the frames received so far,
// shared by every local reader. Its frames come from a local Leader or, for
// a flight led elsewhere (remote), from store reads made by whichever local
// reader needs the next frame first; no goroutine runs on its behalf.
type flight struct {
	g   *Group
	id  string // key in g.flights
	key string
	fp  string

	// resolved is closed once the first joiner knows whether it leads or
	// follows; resolveErr is set before, if it failed.
	resolved   chan struct{}
	resolveErr error

	mu         sync.Mutex // protects the fields below
	gen        uint64
	leader     *Leader // the local leader, if any
	remote     bool    // frames come from the store
	cursor     string  // store position after frames (remote)
	frames     [][]byte
	size       int64
	err        error // io.EOF, ErrLeaderGone, ErrTooLarge...; nil while more may come
	fetching   bool  // a reader is reading the store for everyone (remote)
	quietSince time.Time
	changed    chan struct{} // closed and replaced on every change
	readers    int           // Followers not yet closed (and joiners waiting for resolved)
}

func newFlight(g *Group, id, key, fp string) *flight {
	return &flight{g: g, id: id, key: key, fp: fp, resolved: make(chan struct{}), changed: make(chan struct{})}
}

// broadcastLocked wakes every reader waiting for a change; f.mu must be held.
func (f *flight) broadcastLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// end records why no more frames will come (the first cause wins), wakes
// the readers and forgets the flight, so later joiners ask the store.
func (f *flight) end(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
		f.broadcastLocked()
	}
	f.mu.Unlock()
	f.g.forget(f)
}

// addLocked appends frames within the Group's limits; f.mu must be held.
// It reports false (and ends the flight with ErrTooLarge) past them.
func (f *flight) addLocked(frames [][]byte) bool {
	for _, fr := range frames {
		if f.size+int64(len(fr)) > f.g.opts.MaxBytes || len(f.frames) >= f.g.opts.MaxFrames {
			if f.err == nil {
				f.err = ErrTooLarge
			}
			return false
		}
		f.size += int64(len(fr))
		f.frames = append(f.frames, fr)
	}
	return true
}

// fetch reads the next frames of a remote flight from the store for every
// local reader, waiting up to wait for one. The caller set f.fetching; fetch
// clears it.
func (f *flight) fetch(ctx context.Context, wait time.Duration) (err error) {
	g := f.g
	f.mu.Lock()
	cursor, gen, quiet := f.cursor, f.gen, time.Since(f.quietSince)
	f.mu.Unlock()
	var batch Batch
	probed := false
	defer func() {
		f.mu.Lock()
		if err == nil {
			if len(batch.Frames) > 0 || probed {
				f.quietSince = time.Now()
			}
			if f.addLocked(batch.Frames) && f.err == nil {
				if batch.Cursor != "" {
					f.cursor = batch.Cursor
				}
				switch batch.State {
				case StateFinished:
					f.err = io.EOF
				case StateNone:
					f.err = ErrLeaderGone
				}
			}
		}
		f.fetching = false
		f.broadcastLocked()
		ended := f.err != nil
		f.mu.Unlock()
		if ended {
			g.forget(f)
		}
	}()

	batch, err = g.b.Read(ctx, f.key, gen, cursor, readBatch, wait)
	if err != nil || len(batch.Frames) > 0 || batch.State != StateRunning {
		return err
	}
	if quiet+wait < g.wait {
		return nil // not quiet for long enough to suspect the leader yet
	}
	// Nothing for a whole wait: does the leader still hold its lease?
	probed = true
	free, err := g.probe(ctx, f.key, gen)
	if err != nil || !free {
		return err
	}
	// The lease was free and the generation is now ended in the store,
	// unless it finished just before: read once more to tell which.
	batch, err = g.b.Read(ctx, f.key, gen, cursor, readBatch, 0)
	if err == nil && batch.State == StateRunning && len(batch.Frames) == 0 {
		batch.State = StateNone
	}
	return err
}

// Follower receives the frames of a flight led by someone else. Next is for
// one goroutine at a time; Close may be called from any.
type Follower struct {
	f      *flight
	pos    int // frames consumed
	closed atomic.Bool
}

// Next returns the next frame in order; io.EOF after the last frame of a
// finished flight. When the leader died (its lease expired with the flight
// unfinished) or aborted, Next returns ErrLeaderGone: Join again (and
// perhaps lead). The frames of the next generation are the same for a
// deterministic request, so skip as many as were already consumed.
// ErrTooLarge means the flight grew past this Group's limits. A store error
// is retried a few times before it is returned; the Follower stays usable
// after any error but ErrClosed.
//
// Next honours ctx: when it ends, Next returns ctx.Err() promptly and leaves
// nothing running. The returned slice is shared with the other followers
// and must not be modified.
func (fo *Follower) Next(ctx context.Context) ([]byte, error) {
	if fo.closed.Load() {
		return nil, ErrClosed
	}
	f := fo.f
	fails := 0
	polled := false // a non-blocking read found nothing during this call
	for {
		f.mu.Lock()
		if fo.pos < len(f.frames) {
			fr := f.frames[fo.pos]
			fo.pos++
			f.mu.Unlock()
			return fr, nil
		}
		if f.err != nil {
			err := f.err
			f.mu.Unlock()
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			f.mu.Unlock()
			return nil, err
		}
		// A remote flight nobody reads for us: read the store ourselves,
		// blocking for up to wait. Too close to ctx's deadline to block
		// (wait 0), look once and then wait here.
		wait := time.Duration(-1)
		if f.remote && !f.fetching {
			wait = f.g.waitFor(ctx)
		}
		if wait > 0 || (wait == 0 && !polled) {
			polled = wait == 0
			f.fetching = true
			f.mu.Unlock()
			err := f.fetch(ctx, wait)
			if err == nil {
				fails = 0
				continue
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			// A store error: retry a few times (the leader may be fine and
			// the store back in a moment), then report it.
			fails++
			if fails >= maxReadFailures {
				return nil, err
			}
			if err := clock.Sleep(ctx, time.Duration(fails)*20*time.Millisecond); err != nil {
				return nil, err
			}
			continue
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Consumed returns how many frames Next has returned (call it from the
// goroutine that calls Next).
func (fo *Follower) Consumed() int { return fo.pos }

// Close stops following and frees local resources. It is idempotent.
func (fo *Follower) Close() {
	if fo.closed.Swap(true) {
		return
	}
	fo.f.g.detach(fo.f)
}

// Package memory is the in-process dedup backend: flight records and frame logs in memory, leader leases from lock/memory, the same semantics as the Redis backend for a single process.
package memory

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/lock"
	lockmemory "github.com/llmgate/llmgate/lock/memory"
)

// Backend keeps flights in process memory. Groups sharing one Backend see
// each other's flights, like processes sharing one Redis.
type Backend struct {
	clk   clock.Clock
	locks *lockmemory.Backend

	mu      sync.Mutex // protects records, logs, finished, retained
	records map[string]*record
	logs    map[logID]*frameLog
	// finished lists finished records in finish order, so the oldest go
	// first when retained results exceed maxRetained bytes. Entries of
	// records dropped meanwhile are skipped (and compacted away).
	finished    []finishedRef
	retained    int64 // frame bytes of finished records still kept
	maxRetained int64
}

type finishedRef struct {
	key string
	r   *record
}

// DefaultMaxRetainedBytes bounds the results a Backend keeps after their
// flights finished (idempotency-key answers may be kept for a day).
const DefaultMaxRetainedBytes = 256 << 20

// Option configures a Backend.
type Option func(*Backend)

// WithMaxRetainedBytes bounds the frame bytes of finished results kept for
// late joiners; beyond it the oldest results are forgotten first (a late
// joiner of a forgotten result runs the request again). Default
// DefaultMaxRetainedBytes.
func WithMaxRetainedBytes(n int64) Option { return func(b *Backend) { b.maxRetained = n } }

var _ dedup.Backend = (*Backend)(nil)

// record is the current generation of a key.
type record struct {
	gen   uint64
	fp    string
	state dedup.State // StateRunning or StateFinished
	log   *frameLog
	exp   expiry
	size  int64 // frame bytes, counted in retained once finished
}

type logID struct {
	key string
	gen uint64
}

// frameLog is the frames of one generation.
type frameLog struct {
	frames  [][]byte
	state   dedup.State   // StateRunning until it finishes or ends
	changed chan struct{} // closed and replaced on every change
}

// expiry removes something at a time of the Backend's clock.
type expiry struct {
	at    time.Time
	timer clock.Timer
}

// New returns an empty backend on clk (nil means the real clock). The
// clock drives result retention and the leases of its lock store.
func New(clk clock.Clock, opts ...Option) *Backend {
	if clk == nil {
		clk = clock.Real{}
	}
	b := &Backend{clk: clk, locks: lockmemory.New(clk), records: make(map[string]*record), logs: make(map[logID]*frameLog),
		maxRetained: DefaultMaxRetainedBytes}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Locks returns the lock store of this backend's leaders.
func (b *Backend) Locks() lock.Backend { return b.locks }

func (l *frameLog) broadcastLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// expireLocked (re)arms r's expiry d from now; b.mu must be held.
func (b *Backend) expireLocked(key string, r *record, d time.Duration) {
	if r.exp.timer != nil {
		r.exp.timer.Stop()
	}
	r.exp.at = b.clk.Now().Add(d)
	r.exp.timer = b.clk.AfterFunc(d, func() { b.onExpiry(key, r) })
}

func (b *Backend) onExpiry(key string, r *record) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.records[key] != r || b.clk.Now().Before(r.exp.at) {
		return // replaced, or refreshed meanwhile (its new timer will fire)
	}
	b.dropLocked(key, r)
}

// dropLocked forgets r and its frames; its readers see StateNone unless it
// finished. b.mu must be held.
func (b *Backend) dropLocked(key string, r *record) {
	if r.exp.timer != nil {
		r.exp.timer.Stop()
	}
	if b.records[key] == r {
		delete(b.records, key)
	}
	if r.state == dedup.StateFinished && r.size >= 0 {
		b.retained -= r.size
		r.size = -1 // counted out once
	}
	delete(b.logs, logID{key, r.gen})
	if r.log.state == dedup.StateRunning {
		r.log.state = dedup.StateNone
	}
	// Readers still positioned in it find it gone at their next Read.
	r.log.frames = nil
	r.log.broadcastLocked()
}

// liveLocked returns key's record; b.mu must be held. An expired one is
// dropped here too, so a clock that moved past it without running its timer
// yet never shows it.
func (b *Backend) liveLocked(key string) *record {
	r := b.records[key]
	if r != nil && !b.clk.Now().Before(r.exp.at) {
		b.dropLocked(key, r)
		return nil
	}
	return r
}

func flightOf(r *record) dedup.Flight {
	if r == nil {
		return dedup.Flight{}
	}
	return dedup.Flight{State: r.state, Gen: r.gen, Fingerprint: r.fp}
}

// Lookup returns key's record.
func (b *Backend) Lookup(_ context.Context, key string) (dedup.Flight, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return flightOf(b.liveLocked(key)), nil
}

// Claim starts generation gen of key unless a result is retained or a newer
// generation runs.
func (b *Backend) Claim(_ context.Context, key, fingerprint string, gen uint64, keep time.Duration) (dedup.Flight, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.liveLocked(key); r != nil {
		if r.state == dedup.StateFinished || r.gen >= gen {
			return flightOf(r), nil
		}
		b.dropLocked(key, r) // its leader lost the lease: we hold the lock now
	}
	r := &record{gen: gen, fp: fingerprint, state: dedup.StateRunning, log: &frameLog{state: dedup.StateRunning, changed: make(chan struct{})}}
	b.records[key] = r
	b.logs[logID{key, gen}] = r.log
	b.expireLocked(key, r, keep)
	return flightOf(r), nil
}

// runningLocked returns key's record if gen is its running generation;
// b.mu must be held.
func (b *Backend) runningLocked(key string, gen uint64) (*record, error) {
	r := b.liveLocked(key)
	if r == nil || r.gen != gen || r.state != dedup.StateRunning {
		return nil, fmt.Errorf("%w: %q generation %d is not running", dedup.ErrLost, key, gen)
	}
	return r, nil
}

// Append adds frame to running generation gen. The frame is kept as is:
// the caller must not modify it afterwards.
func (b *Backend) Append(_ context.Context, key string, gen uint64, frame []byte, keep time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := b.runningLocked(key, gen)
	if err != nil {
		return err
	}
	r.log.frames = append(r.log.frames, frame)
	r.size += int64(len(frame))
	r.log.broadcastLocked()
	b.expireLocked(key, r, keep)
	return nil
}

// Refresh keeps running generation gen for keep more.
func (b *Backend) Refresh(_ context.Context, key string, gen uint64, keep time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := b.runningLocked(key, gen)
	if err != nil {
		return err
	}
	b.expireLocked(key, r, keep)
	return nil
}

// Finish completes running generation gen and retains it for retain.
func (b *Backend) Finish(_ context.Context, key string, gen uint64, retain time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := b.runningLocked(key, gen)
	if err != nil {
		return err
	}
	r.state = dedup.StateFinished
	r.log.state = dedup.StateFinished
	r.log.broadcastLocked()
	b.expireLocked(key, r, retain)
	b.retained += r.size
	b.finished = append(b.finished, finishedRef{key, r})
	b.evictLocked()
	return nil
}

// evictLocked forgets the oldest finished results while the retained ones
// exceed maxRetained; b.mu must be held.
func (b *Backend) evictLocked() {
	for b.retained > b.maxRetained && len(b.finished) > 0 {
		f := b.finished[0]
		b.finished[0] = finishedRef{}
		b.finished = b.finished[1:]
		if b.records[f.key] == f.r && f.r.state == dedup.StateFinished {
			b.dropLocked(f.key, f.r)
		}
	}
	// Entries of results that expired on their own pile up otherwise.
	if len(b.finished) > 64 && len(b.finished) > 2*len(b.records) {
		live := b.finished[:0]
		for _, f := range b.finished {
			if b.records[f.key] == f.r {
				live = append(live, f)
			}
		}
		clear(b.finished[len(live):])
		b.finished = live
	}
}

// Abort ends running generation gen without a result. Nothing lingers in
// memory: readers find the generation gone at once.
func (b *Backend) Abort(_ context.Context, key string, gen uint64, _ time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.liveLocked(key); r != nil && r.gen == gen && r.state == dedup.StateRunning {
		b.dropLocked(key, r)
	}
	return nil
}

// Read returns up to limit frames of generation gen after cursor (a frame
// index), waiting up to wait for one.
func (b *Backend) Read(ctx context.Context, key string, gen uint64, cursor string, limit int, wait time.Duration) (dedup.Batch, error) {
	pos := 0
	if cursor != "" {
		n, err := strconv.Atoi(cursor)
		if err != nil || n < 0 {
			return dedup.Batch{}, fmt.Errorf("dedup: memory: malformed cursor %q", cursor)
		}
		pos = n
	}
	limit = min(max(limit, 1), 1<<20)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		b.mu.Lock()
		b.liveLocked(key) // expire what is due
		l := b.logs[logID{key, gen}]
		if l == nil {
			b.mu.Unlock()
			return dedup.Batch{Cursor: cursor, State: dedup.StateNone}, nil
		}
		if pos > len(l.frames) {
			b.mu.Unlock()
			return dedup.Batch{}, fmt.Errorf("dedup: memory: cursor %d beyond the %d frames of %q generation %d", pos, len(l.frames), key, gen)
		}
		if pos < len(l.frames) || l.state != dedup.StateRunning || wait <= 0 {
			end := min(len(l.frames), pos+limit)
			batch := dedup.Batch{Frames: l.frames[pos:end:end], Cursor: strconv.Itoa(end), State: dedup.StateRunning}
			if end == len(l.frames) {
				batch.State = l.state
			}
			b.mu.Unlock()
			if len(batch.Frames) == 0 {
				batch.Frames = nil
			}
			return batch, nil
		}
		ch := l.changed
		b.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-ch:
		case <-timer.C:
			wait = 0 // one last look
		case <-ctx.Done():
			return dedup.Batch{}, ctx.Err()
		}
	}
}

// Package memory is the in-process budget backend, persisted to a local file that survives restarts and crashes.
//
// All state lives in process memory behind one mutex, so every operation is
// atomic. With Config.Path set, spend and usage rows are also written to a
// state file: each Settle returns only after a write that contains it is on
// disk. Writes are grouped: while one write is in progress, every Settle
// that arrives waits for the next one, so N concurrent settles cost about
// two writes, not N. A write goes to a temporary file in the same
// directory, is fsynced, renamed over the state file, and the directory is
// fsynced, so a crash at any moment leaves either the old or the new state,
// never a torn file. The file carries a SHA-256 checksum; a file that is
// truncated or altered is refused with an error naming it, never silently
// replaced by an empty state.
//
// Live holds are persisted too, without waiting for the disk: Reserve,
// Renew and Release trigger a write but return at once. After a crash the
// holds of the requests it cut are back, expire and are charged, as a dead
// replica's are on Redis; only those taken, renewed or released since the
// last write (one pace, ~100ms in llmgate serve) are lost or stale. The
// charge of an expired hold is written with the next write, which it
// triggers.
//
// The state file may be used by one process at a time; on Unix a lock file
// next to it (Path + ".lock") enforces that.
package memory

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/clock"
)

// Errors of this backend.
var (
	// ErrCorrupt wraps errors about a state file that cannot be trusted.
	ErrCorrupt = errors.New("budget/memory: corrupt state file")
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("budget/memory: backend closed")
	// ErrInUse means another process holds the state file.
	ErrInUse = errors.New("budget/memory: state file in use")
)

// purgeEvery is how often windows past their retention are dropped.
const purgeEvery = time.Hour

// Config configures a Backend. The zero value is a valid, unpersisted
// backend on the real clock.
type Config struct {
	// Path is the state file. Empty means nothing is persisted. Its
	// directory must exist; the file is created on the first write.
	Path string
	// Clock drives reservation expiry and retention. Default the real clock.
	Clock clock.Clock
	// MinWriteInterval is the least time between two writes of the state
	// file. Settles still return only once a write holding them is on disk,
	// but under load they wait up to this long and share one write, which
	// bounds the disk and CPU cost of accounting. Default 0: write as soon
	// as the previous write is done.
	MinWriteInterval time.Duration
	// Logger receives write failures. Default: discard.
	Logger *slog.Logger
}

// Backend is a budget.Backend in process memory.
type Backend struct {
	clk  clock.Clock
	log  *slog.Logger
	path string        // "" = not persisted
	pace time.Duration // least time between two writes

	mu        sync.Mutex // protects the fields below, up to flushed
	windows   map[budget.Key]*window
	nextPurge time.Time
	closed    bool
	dirty     uint64        // sequence of the latest change to persist
	durable   uint64        // latest sequence known to be on disk
	attempts  uint64        // write attempts started
	failedAt  uint64        // the attempt that failed last (0 = none)
	failErr   error         // why it failed
	flushed   chan struct{} // closed (and replaced) after every write attempt

	kick     chan struct{} // buffered(1): wakes the writer
	stop     chan struct{} // closed by Close
	done     chan struct{} // closed when the writer has exited
	lockFile *os.File      // held for the backend's lifetime (Unix)
	writes   atomic.Uint64
	closeErr error

	// beforeWrite, if set (by tests), runs before each write of the file.
	beforeWrite func()
}

var _ budget.Backend = (*Backend)(nil)

// window is one tenant's state in one period.
type window struct {
	spent, reserved budget.Amount
	holds           map[string]*hold
	expiry          holdHeap
	settled         map[string]time.Time // ID → when it may be forgotten
	settledQ        []settledID          // the same, in settle order
	expired         map[string]*hold     // settled IDs charged by expiry, with what was charged
	rows            map[rowKey]*budget.UsageRow
	keep            time.Time
	line            []*waiter           // requests waiting for room, oldest first
	learned         map[string]*learned // per reserved model
}

// learned is what a window learned of one model's answers.
type learned struct {
	samples  []int64 // recent answers' completion tokens, oldest first
	estimate int64   // budget.LearnedEstimate(samples)
}

// waiter is a place in a window's line.
type waiter struct {
	id    string
	lease time.Time     // dropped from the line after this, unless renewed
	wake  chan struct{} // buffered(1): its turn may have come
}

type hold struct {
	id       string
	amt      budget.Amount
	charge   budget.Charge // counted in the usage rows if it expires
	remember time.Duration // how long its expiry charge is remembered
	expires  time.Time
	index    int // in the expiry heap
}

type settledID struct {
	id     string
	forget time.Time
}

type rowKey struct{ model, deployment string }

// Open returns a backend. With cfg.Path set, it locks the state file and
// loads it; a file that cannot be read or verified is an error that names
// it (wrapping ErrCorrupt when its contents are bad).
func Open(cfg Config) (*Backend, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	b := &Backend{
		clk:     cfg.Clock,
		log:     cfg.Logger,
		path:    cfg.Path,
		pace:    cfg.MinWriteInterval,
		windows: make(map[budget.Key]*window),
		flushed: make(chan struct{}),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if b.path == "" {
		close(b.done)
		return b, nil
	}
	abs, err := filepath.Abs(b.path)
	if err != nil {
		return nil, fmt.Errorf("budget/memory: state file %s: %w", b.path, err)
	}
	b.path = abs
	if fi, err := os.Stat(filepath.Dir(abs)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("budget/memory: state file %s: directory %s does not exist; create it first", abs, filepath.Dir(abs))
	}
	if b.lockFile, err = lockPath(abs + ".lock"); err != nil {
		return nil, err
	}
	removeStaleTemps(abs)
	if err := b.load(); err != nil {
		unlockFile(b.lockFile)
		return nil, err
	}
	go b.writer()
	return b, nil
}

// load reads the state file, if there is one.
func (b *Backend) load() error {
	data, err := os.ReadFile(b.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("budget/memory: read state file %s: %w", b.path, err)
	}
	st, err := decodeState(data)
	if err != nil {
		return fmt.Errorf("%w %s: %w; restore it from a backup, or move it away to start from zero", ErrCorrupt, b.path, err)
	}
	now := b.clk.Now()
	for _, fw := range st.Windows {
		if fw.Keep.Before(now) {
			continue
		}
		w := newWindow(fw.Keep)
		w.spent = fw.Spent
		for i := range fw.Rows {
			r := fw.Rows[i]
			w.rows[rowKey{r.Model, r.Deployment}] = &r
		}
		for _, fh := range fw.Holds {
			h := &hold{id: fh.ID, amt: fh.Amount, charge: fh.Charge, remember: fh.Remember, expires: fh.Expires}
			w.holds[h.id] = h
			heap.Push(&w.expiry, h)
			w.reserved = w.reserved.Add(h.amt)
		}
		b.windows[budget.Key{Tenant: fw.Tenant, WindowID: fw.Window}] = w
	}
	return nil
}

func newWindow(keep time.Time) *window {
	return &window{
		holds:   make(map[string]*hold),
		settled: make(map[string]time.Time),
		expired: make(map[string]*hold),
		rows:    make(map[rowKey]*budget.UsageRow),
		learned: make(map[string]*learned),
		keep:    keep,
	}
}

// Close flushes the state to disk, stops the writer and unlocks the file.
// It returns an error if the last state could not be written. Calls after
// the first return the first one's result.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.done
		return b.closeErr
	}
	b.closed = true
	b.mu.Unlock()
	if b.path == "" {
		return nil
	}
	close(b.stop)
	<-b.done
	b.mu.Lock()
	if b.durable < b.dirty {
		b.closeErr = fmt.Errorf("budget/memory: close: state file %s not saved: %w", b.path, b.failErr)
	}
	err := b.closeErr
	b.mu.Unlock()
	unlockFile(b.lockFile)
	return err
}

// Writes returns how many times the state file has been written.
func (b *Backend) Writes() uint64 { return b.writes.Load() }

// windowLocked returns key's window, creating it; b.mu must be held.
func (b *Backend) windowLocked(key budget.Key, keep time.Time, now time.Time) *window {
	b.purgeLocked(now)
	w := b.windows[key]
	if w == nil {
		w = newWindow(keep)
		b.windows[key] = w
	}
	if keep.After(w.keep) {
		w.keep = keep
	}
	b.sweepLocked(w, now)
	return w
}

// purgeLocked drops windows past their retention, at most once per
// purgeEvery; b.mu must be held.
func (b *Backend) purgeLocked(now time.Time) {
	if now.Before(b.nextPurge) {
		return
	}
	b.nextPurge = now.Add(purgeEvery)
	for k, w := range b.windows {
		if w.keep.Before(now) && len(w.holds) == 0 && len(w.line) == 0 {
			delete(b.windows, k)
		}
	}
}

// sweepLocked charges expired holds and forgets settled IDs past their
// window; b.mu must be held.
func (b *Backend) sweepLocked(w *window, now time.Time) {
	charged := false
	for len(w.expiry) > 0 && !w.expiry[0].expires.After(now) {
		h := heap.Pop(&w.expiry).(*hold)
		delete(w.holds, h.id)
		w.reserved.Tokens -= h.amt.Tokens
		w.reserved.MicroUSD -= h.amt.MicroUSD
		// Charged, not released: the caller died, the provider billed it.
		w.spent = w.spent.Add(h.amt)
		w.count(h.charge.Model, h.charge.Deployment, 1, 1, h.charge.Usage, h.amt.MicroUSD)
		w.expired[h.id] = h
		w.settle(h.id, now.Add(h.remember))
		charged = true
	}
	n := 0
	for n < len(w.settledQ) && !w.settledQ[n].forget.After(now) {
		s := w.settledQ[n]
		if f, ok := w.settled[s.id]; ok && !f.After(now) {
			delete(w.settled, s.id)
			delete(w.expired, s.id)
		}
		n++
	}
	if n > 0 {
		w.settledQ = append(w.settledQ[:0:0], w.settledQ[n:]...)
	}
	if charged {
		b.changedLocked()
	}
}

// changedLocked marks the state as changed and wakes the writer, without
// waiting for the write; b.mu must be held.
func (b *Backend) changedLocked() {
	b.dirty++
	if b.path == "" {
		return
	}
	select {
	case b.kick <- struct{}{}:
	default: // a write is already due
	}
}

// count adds to the usage row of (model, deployment): requests, expired
// requests, usage and cost (negative to take back; a row left without
// requests is removed).
func (w *window) count(model, deployment string, requests, expired int64, u budget.Usage, microUSD int64) {
	rk := rowKey{model, deployment}
	row := w.rows[rk]
	if row == nil {
		row = &budget.UsageRow{Model: model, Deployment: deployment}
		w.rows[rk] = row
	}
	row.Requests += requests
	row.Expired += expired
	row.PromptTokens += u.PromptTokens
	row.CompletionTokens += u.CompletionTokens
	row.CachedTokens += u.CachedTokens
	row.MicroUSD += microUSD
	if row.Requests <= 0 {
		delete(w.rows, rk)
	}
}

// settle remembers id as settled until forget.
func (w *window) settle(id string, forget time.Time) {
	w.settled[id] = forget
	w.settledQ = append(w.settledQ, settledID{id, forget})
}

// unexpire takes back the charge of id's expired hold, if it is
// remembered, and reports whether it was.
func (w *window) unexpire(id string) bool {
	h := w.expired[id]
	if h == nil {
		return false
	}
	delete(w.expired, id)
	w.spent.Tokens -= h.amt.Tokens
	w.spent.MicroUSD -= h.amt.MicroUSD
	neg := budget.Usage{PromptTokens: -h.charge.Usage.PromptTokens, CompletionTokens: -h.charge.Usage.CompletionTokens}
	w.count(h.charge.Model, h.charge.Deployment, -1, -1, neg, -h.amt.MicroUSD)
	return true
}

// learn adds an answer's size to what the estimates of its model are
// learned from.
func (w *window) learn(s budget.Sample) {
	if s.Completion <= 0 || s.Model == "" {
		return
	}
	l := w.learned[s.Model]
	if l == nil {
		l = &learned{}
		w.learned[s.Model] = l
	}
	if len(l.samples) == 2*budget.LearnWindow {
		// Only the last LearnWindow count; dropping the rest now and
		// then keeps the copies rare.
		l.samples = append(l.samples[:0:0], l.samples[budget.LearnWindow:]...)
	}
	l.samples = append(l.samples, s.Completion)
	l.estimate = budget.LearnedEstimate(l.samples)
}

// free ends the live hold h.
func (w *window) free(h *hold) {
	heap.Remove(&w.expiry, h.index)
	delete(w.holds, h.id)
	w.reserved.Tokens -= h.amt.Tokens
	w.reserved.MicroUSD -= h.amt.MicroUSD
}

func (w *window) isSettled(id string, now time.Time) bool {
	f, ok := w.settled[id]
	return ok && f.After(now)
}

// Reserve takes the hold if it fits under every cap and, with a waiter
// lease, if no one waits ahead of it (see budget.Backend).
func (b *Backend) Reserve(ctx context.Context, req budget.ReserveRequest) (budget.ReserveResult, error) {
	if err := ctx.Err(); err != nil {
		return budget.ReserveResult{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return budget.ReserveResult{}, ErrClosed
	}
	now := b.clk.Now()
	w := b.windowLocked(req.Key, req.Keep, now)
	res := budget.ReserveResult{Spent: w.spent, Reserved: w.reserved}
	if l := w.learned[req.Charge.Model]; l != nil {
		res.Learned = l.estimate
	}
	if w.isSettled(req.ID, now) {
		w.leave(req.ID, now)
		return budget.ReserveResult{}, budget.ErrSettledID
	}
	if _, held := w.holds[req.ID]; held {
		w.leave(req.ID, now)
		res.Admitted = true
		return res, nil
	}
	queue := req.WaiterLease > 0
	if queue {
		if first := w.head(now); first != nil && first.id != req.ID {
			// Others wait for room first.
			if !mayFitEver(req.Cap, w.spent, req.Hold) {
				w.leave(req.ID, now)
				return res, nil
			}
			w.join(req.ID, now.Add(req.WaiterLease))
			res.Queued = true
			return res, nil
		}
	}
	if !fits(req.Cap.Tokens, w.spent.Tokens+w.reserved.Tokens, req.Hold.Tokens) ||
		!fits(req.Cap.MicroUSD, w.spent.MicroUSD+w.reserved.MicroUSD, req.Hold.MicroUSD) {
		if queue && mayFitLater(req.Cap, w.spent, w.reserved, req.Hold) {
			w.join(req.ID, now.Add(req.WaiterLease))
			res.Queued = true
		} else if queue {
			w.leave(req.ID, now)
		}
		return res, nil
	}
	h := &hold{id: req.ID, amt: req.Hold, charge: req.Charge, remember: req.Remember, expires: now.Add(req.TTL)}
	w.holds[req.ID] = h
	heap.Push(&w.expiry, h)
	w.reserved = w.reserved.Add(req.Hold)
	res.Admitted, res.Reserved = true, w.reserved
	if queue {
		w.leave(req.ID, now) // the next in line may fit too
	}
	b.changedLocked()
	return res, nil
}

// mayFitEver reports whether hold fits under every cap once nothing is
// reserved.
func mayFitEver(limit, spent, hold budget.Amount) bool {
	return fits(limit.Tokens, spent.Tokens, hold.Tokens) && fits(limit.MicroUSD, spent.MicroUSD, hold.MicroUSD)
}

// mayFitLater reports whether a hold that does not fit now may once the
// holds in flight settle below their amounts: in every dimension that
// denies it something is reserved, and it fits once nothing is.
func mayFitLater(limit, spent, reserved, hold budget.Amount) bool {
	if !fits(limit.Tokens, spent.Tokens+reserved.Tokens, hold.Tokens) && reserved.Tokens <= 0 {
		return false
	}
	if !fits(limit.MicroUSD, spent.MicroUSD+reserved.MicroUSD, hold.MicroUSD) && reserved.MicroUSD <= 0 {
		return false
	}
	return mayFitEver(limit, spent, hold)
}

// head returns the first live waiter of w's line (nil if none), dropping
// those whose lease has passed: they died, or gave up without leaving.
func (w *window) head(now time.Time) *waiter {
	n := 0
	for n < len(w.line) && !w.line[n].lease.After(now) {
		n++
	}
	if n > 0 {
		w.line = append(w.line[:0:0], w.line[n:]...)
	}
	if len(w.line) == 0 {
		return nil
	}
	return w.line[0]
}

// join puts id at the end of w's line, or renews its place.
func (w *window) join(id string, lease time.Time) {
	for _, q := range w.line {
		if q.id == id {
			q.lease = lease
			return
		}
	}
	w.line = append(w.line, &waiter{id: id, lease: lease, wake: make(chan struct{}, 1)})
}

// leave takes id out of w's line; if it was first, the next is woken.
func (w *window) leave(id string, now time.Time) {
	for i, q := range w.line {
		if q.id != id {
			continue
		}
		w.line = append(w.line[:i:i], w.line[i+1:]...)
		if i == 0 {
			w.wakeHead(now)
		}
		return
	}
}

// wakeHead tells the first live waiter of w's line that its turn may have
// come.
func (w *window) wakeHead(now time.Time) {
	if q := w.head(now); q != nil {
		select {
		case q.wake <- struct{}{}:
		default: // already told
		}
	}
}

// waiterLocked returns id's place in key's line, or nil; b.mu must be held.
func (b *Backend) waiterLocked(key budget.Key, id string) *waiter {
	if w := b.windows[key]; w != nil {
		for _, q := range w.line {
			if q.id == id {
				return q
			}
		}
	}
	return nil
}

// Await waits until id's turn in key's line may have come, or timeout
// passes (in real time: it bounds the caller's wait), or ctx ends.
func (b *Backend) Await(ctx context.Context, key budget.Key, id string, timeout time.Duration) (bool, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false, ErrClosed
	}
	q := b.waiterLocked(key, id)
	b.mu.Unlock()
	if q == nil {
		return true, nil // not in line (dropped): the caller asks again
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-q.wake:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// Leave takes id out of key's line.
func (b *Backend) Leave(_ context.Context, key budget.Key, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if w := b.windows[key]; w != nil {
		w.leave(id, b.clk.Now())
	}
	return nil
}

// fits is the admission rule of one dimension; limit 0 means no cap.
func fits(limit, used, need int64) bool {
	return limit == 0 || (used+need <= limit && used < limit)
}

// Settle ends the hold, charges the record once per ID, and waits until
// the change is on disk.
func (b *Backend) Settle(ctx context.Context, req budget.SettleRequest) (budget.SettleResult, error) {
	if err := ctx.Err(); err != nil {
		return budget.SettleResult{}, err // nothing charged
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return budget.SettleResult{}, ErrClosed
	}
	now := b.clk.Now()
	w := b.windowLocked(req.Key, req.Keep, now)
	// An expired hold's remembered charge is replaced by the record.
	if w.isSettled(req.ID, now) && !w.unexpire(req.ID) {
		// A repeat: report success only once the first one is durable.
		res := budget.SettleResult{Spent: w.spent}
		return res, b.waitDurableLocked(ctx, b.dirty)
	}
	if h := w.holds[req.ID]; h != nil {
		w.free(h)
	}
	rec := req.Record
	w.spent = w.spent.Add(budget.Amount{Tokens: rec.Usage.Tokens(), MicroUSD: rec.MicroUSD})
	w.count(rec.Model, rec.Deployment, max(rec.Requests, 1), 0, rec.Usage, rec.MicroUSD)
	w.settle(req.ID, now.Add(req.Remember))
	w.learn(req.Learn)
	w.wakeHead(now)
	res := budget.SettleResult{Applied: true, Spent: w.spent}
	b.dirty++
	return res, b.waitDurableLocked(ctx, b.dirty)
}

// waitDurableLocked waits until the state up to sequence target is on disk.
// b.mu must be held; it is released on return.
func (b *Backend) waitDurableLocked(ctx context.Context, target uint64) error {
	if b.path == "" {
		b.mu.Unlock()
		return nil
	}
	// Each pass waits for one write attempt; the first write that starts
	// after our call covers our change, so this ends after at most two
	// attempts. Only a failure of such a write is ours to report: a retry
	// after an earlier failure gets a fresh attempt.
	since := b.attempts
	for {
		if b.durable >= target {
			b.mu.Unlock()
			return nil
		}
		if b.failedAt > since {
			err := b.failErr
			b.mu.Unlock()
			return fmt.Errorf("budget/memory: charged in memory but not saved to %s: %w", b.path, err)
		}
		if b.closed && b.writerDone() {
			b.mu.Unlock()
			return ErrClosed
		}
		ch := b.flushed
		b.mu.Unlock()
		select {
		case b.kick <- struct{}{}:
		default: // a write is already due
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("budget/memory: charged in memory, not yet saved to %s: %w", b.path, ctx.Err())
		case <-b.done:
		}
		b.mu.Lock()
	}
}

func (b *Backend) writerDone() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// Release ends the hold of id without charging, or takes back the charge
// of its expired hold.
func (b *Backend) Release(_ context.Context, key budget.Key, id string) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false, ErrClosed
	}
	w := b.windows[key]
	if w == nil {
		return false, nil
	}
	now := b.clk.Now()
	b.sweepLocked(w, now)
	if h := w.holds[id]; h != nil {
		w.free(h)
		w.wakeHead(now)
		b.changedLocked()
		return true, nil
	}
	if w.unexpire(id) {
		// Forgotten, so that a later Settle is charged (its settledQ entry
		// finds nothing to forget).
		delete(w.settled, id)
		w.wakeHead(now)
		b.changedLocked()
		return true, nil
	}
	return false, nil
}

// Renew extends the live hold of req.ID and raises it.
func (b *Backend) Renew(ctx context.Context, req budget.RenewRequest) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false, ErrClosed
	}
	now := b.clk.Now()
	w := b.windowLocked(req.Key, req.Keep, now)
	h := w.holds[req.ID]
	if h == nil {
		return false, nil
	}
	amt := budget.Amount{Tokens: max(h.amt.Tokens, req.Hold.Tokens), MicroUSD: max(h.amt.MicroUSD, req.Hold.MicroUSD)}
	w.reserved.Tokens += amt.Tokens - h.amt.Tokens
	w.reserved.MicroUSD += amt.MicroUSD - h.amt.MicroUSD
	h.amt = amt
	h.charge.Usage.PromptTokens = max(h.charge.Usage.PromptTokens, req.Charge.Usage.PromptTokens)
	h.charge.Usage.CompletionTokens = max(h.charge.Usage.CompletionTokens, req.Charge.Usage.CompletionTokens)
	if req.Charge.Model != "" {
		h.charge.Model, h.charge.Deployment = req.Charge.Model, req.Charge.Deployment
	}
	h.expires = now.Add(req.TTL)
	heap.Fix(&w.expiry, h.index)
	b.changedLocked()
	return true, nil
}

// Totals returns the window's spend and live holds.
func (b *Backend) Totals(_ context.Context, key budget.Key) (budget.Totals, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return budget.Totals{}, ErrClosed
	}
	w := b.windows[key]
	if w == nil {
		return budget.Totals{}, nil
	}
	b.sweepLocked(w, b.clk.Now())
	return budget.Totals{Spent: w.spent, Reserved: w.reserved, Holds: len(w.holds)}, nil
}

// Usage returns the window's usage rows.
func (b *Backend) Usage(_ context.Context, key budget.Key) ([]budget.UsageRow, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	w := b.windows[key]
	if w == nil {
		return nil, nil
	}
	b.sweepLocked(w, b.clk.Now()) // expired holds are charged in the rows
	rows := make([]budget.UsageRow, 0, len(w.rows))
	for _, r := range w.rows {
		rows = append(rows, *r)
	}
	return rows, nil
}

// writer writes the state file whenever kicked, until Close.
func (b *Backend) writer() {
	defer close(b.done)
	for {
		select {
		case <-b.kick:
			b.flush()
			if d := b.pace; d > 0 {
				// Pace the writes: settles arriving meanwhile wait for
				// the next one, so N settles cost one write per interval.
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-b.stop:
					t.Stop()
					b.flush()
					b.mu.Lock()
					close(b.flushed)
					b.flushed = make(chan struct{})
					b.mu.Unlock()
					return
				}
			}
		case <-b.stop:
			b.flush()
			b.mu.Lock()
			close(b.flushed) // wake anyone still waiting; they see closed
			b.flushed = make(chan struct{})
			b.mu.Unlock()
			return
		}
	}
}

// flush writes the current state if it has changes not yet on disk.
func (b *Backend) flush() {
	b.mu.Lock()
	seq := b.dirty
	if seq == b.durable {
		b.mu.Unlock()
		return
	}
	st := b.snapshotLocked(b.clk.Now())
	b.attempts++
	attempt := b.attempts
	b.mu.Unlock()

	if b.beforeWrite != nil {
		b.beforeWrite()
	}
	err := b.writeFile(st)
	b.writes.Add(1)

	b.mu.Lock()
	if err == nil {
		b.durable = max(b.durable, seq)
	} else {
		b.failedAt, b.failErr = attempt, err
		b.log.LogAttrs(context.Background(), slog.LevelError, "budget/memory: cannot save state file",
			slog.String("path", b.path), slog.String("error", err.Error()))
	}
	close(b.flushed)
	b.flushed = make(chan struct{})
	b.mu.Unlock()
}

// snapshotLocked copies what is persisted: spend, usage rows and live holds
// of every window still within its retention; b.mu must be held.
func (b *Backend) snapshotLocked(now time.Time) *fileState {
	st := &fileState{Version: fileVersion}
	for k, w := range b.windows {
		if w.keep.Before(now) || (w.spent == (budget.Amount{}) && len(w.rows) == 0 && len(w.holds) == 0) {
			continue
		}
		fw := fileWindow{Tenant: k.Tenant, Window: k.WindowID, Keep: w.keep, Spent: w.spent, Rows: make([]budget.UsageRow, 0, len(w.rows))}
		for _, r := range w.rows {
			fw.Rows = append(fw.Rows, *r)
		}
		for _, h := range w.holds {
			fw.Holds = append(fw.Holds, fileHold{ID: h.id, Amount: h.amt, Charge: h.charge, Remember: h.remember, Expires: h.expires})
		}
		st.Windows = append(st.Windows, fw)
	}
	return st
}

// writeFile replaces the state file with st, atomically and durably.
func (b *Backend) writeFile(st *fileState) (err error) {
	data, err := encodeState(st)
	if err != nil {
		return err
	}
	dir, base := filepath.Split(b.path)
	f, err := os.CreateTemp(dir, tempPrefix(base))
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, b.path); err != nil {
		return err
	}
	return syncDir(dir)
}

func tempPrefix(base string) string { return "." + base + ".tmp-" }

// removeStaleTemps deletes temporary files a crash left behind; the caller
// holds the file lock, so no other writer is using them.
func removeStaleTemps(path string) {
	dir, base := filepath.Split(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix(base)) && e.Type().IsRegular() {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// holdHeap orders holds by expiry.
type holdHeap []*hold

func (h holdHeap) Len() int           { return len(h) }
func (h holdHeap) Less(i, j int) bool { return h[i].expires.Before(h[j].expires) }
func (h holdHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *holdHeap) Push(x any) {
	e := x.(*hold)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *holdHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

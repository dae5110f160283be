// Package lockbench measures distributed locks: throughput, hand-off latency, wait times and fairness.
//
// The harness runs N workers, each with its own Mutex (and so its own store
// client, as separate processes would have), looping acquire → critical
// section → release on one or more keys until a duration or an operation
// count runs out. Any lock algorithm plugs in as an Algo; the built-in ones
// are "llmgate" (package lock) and "poll" (SET NX PX with 1 ms retries), and
// the bench/peers module adds other libraries.
package lockbench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/lock"
)

// Mutex is one worker's handle on a lock algorithm. It is used by one
// goroutine at a time.
type Mutex interface {
	// Lock blocks until key is held or ctx ends; release frees it.
	Lock(ctx context.Context, key string) (release func(ctx context.Context) error, err error)
	// Close releases the worker's resources (its store client).
	Close() error
}

// Pinger is implemented by a Mutex that can send a PING on its own store
// client; --ping-every then times PINGs on the very connection the lock
// uses instead of on a separate client.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Setup is what an Algo needs to know to build its mutexes.
type Setup struct {
	// Store is the store URL (redis://... or memory).
	Store string
	// TTL is the lease duration asked of every acquisition.
	TTL time.Duration
	// Fair asks for FIFO fairness (only for algos with Algo.Fair).
	Fair bool
	// SharedClient makes all workers share one store client instead of
	// having one each.
	SharedClient bool
}

// Factory builds the Mutex of one worker.
type Factory func(ctx context.Context, worker int) (Mutex, error)

// Algo is a lock algorithm the harness can measure.
type Algo struct {
	// Name is what --algo selects.
	Name string
	// Summary is one line for the usage text.
	Summary string
	// Fair is set when the algorithm honours Setup.Fair.
	Fair bool
	// Memory is set when the algorithm can run on the in-process store.
	Memory bool
	// Open prepares one run. The returned closer is called after every
	// worker's Mutex was closed.
	Open func(ctx context.Context, s Setup) (Factory, func() error, error)
}

// Config describes one run.
type Config struct {
	Algo         Algo
	Store        string        // store URL
	Workers      int           // concurrent workers, each with its own Mutex
	Keys         int           // worker w uses key w % Keys
	Duration     time.Duration // how long the workers loop
	MaxOps       int64         // upper bound on acquisitions, all workers
	CS           time.Duration // busy-wait inside the critical section
	TTL          time.Duration
	Fair         bool
	SharedClient bool
	Pings        int // PINGs measured before and after the run (each)
	// PingEvery makes worker 0 also time one PING after every PingEvery-th
	// cycle, outside its timed Lock and release, on its own client if its
	// Mutex is a Pinger (else on the separate PING client): a unit measured
	// on the same connection and in the same scheduling regime as the run.
	// 0: never.
	PingEvery int
	// Warmup makes each worker take and release a key of its own once
	// before the clock starts, so that what a process does once per store
	// client (connect; subscribe to wake-ups, on its first wait) is not
	// counted as waiting for the lock. Main turns it on (--warmup).
	Warmup bool
}

// Defaults used by Main for flags left out.
const (
	DefaultWorkers  = 8
	DefaultDuration = 3 * time.Second
	DefaultMaxOps   = 5_000_000
	DefaultTTL      = 10 * time.Second
	DefaultPings    = 500
	// maxErrors aborts a run whose Lock keeps failing.
	maxErrors = 1000
	// releaseGrace bounds releases that start near the end of the run.
	releaseGrace = 10 * time.Second
)

// Errors from Run.
var (
	// ErrConfig wraps every complaint about a Config.
	ErrConfig = errors.New("lockbench: bad configuration")
	// ErrTooManyErrors means the run was cut short because Lock kept failing.
	ErrTooManyErrors = errors.New("lockbench: too many lock errors")
)

// Validate reports a Config that cannot run, in words a user can act on.
func (c Config) Validate() error {
	switch {
	case c.Algo.Open == nil:
		return fmt.Errorf("%w: no algorithm", ErrConfig)
	case c.Workers < 1 || c.Workers > 10_000:
		return fmt.Errorf("%w: --workers must be between 1 and 10000, got %d", ErrConfig, c.Workers)
	case c.Keys < 1 || c.Keys > c.Workers:
		return fmt.Errorf("%w: --keys must be between 1 and --workers (%d), got %d", ErrConfig, c.Workers, c.Keys)
	case c.Duration <= 0 || c.Duration > time.Hour:
		return fmt.Errorf("%w: --duration must be positive and at most 1h, got %v", ErrConfig, c.Duration)
	case c.MaxOps < 1:
		return fmt.Errorf("%w: --max-ops must be at least 1, got %d", ErrConfig, c.MaxOps)
	case c.CS < 0 || c.CS > time.Second:
		return fmt.Errorf("%w: --cs must be between 0 and 1s, got %v", ErrConfig, c.CS)
	case c.TTL < lock.MinTTL:
		return fmt.Errorf("%w: --ttl must be at least %v, got %v", ErrConfig, lock.MinTTL, c.TTL)
	case c.Pings < 0 || c.Pings > 1_000_000:
		return fmt.Errorf("%w: --ping must be between 0 and 1000000, got %d", ErrConfig, c.Pings)
	case c.PingEvery < 0:
		return fmt.Errorf("%w: --ping-every must not be negative, got %d", ErrConfig, c.PingEvery)
	case c.PingEvery > 0 && storeurl.IsMemory(c.Store):
		return fmt.Errorf("%w: --ping-every needs a Redis store", ErrConfig)
	case c.Fair && !c.Algo.Fair:
		return fmt.Errorf("%w: algorithm %q has no fair mode; leave out --fair", ErrConfig, c.Algo.Name)
	case storeurl.IsMemory(c.Store) && !c.Algo.Memory:
		return fmt.Errorf("%w: algorithm %q needs a Redis store (--store redis://host:port)", ErrConfig, c.Algo.Name)
	}
	return nil
}

// Result is the outcome of one run; Main prints it as JSON.
type Result struct {
	Algo         string  `json:"algo"`
	Store        string  `json:"store"` // password redacted
	Workers      int     `json:"workers"`
	Keys         int     `json:"keys"`
	Fair         bool    `json:"fair"`
	CSUs         float64 `json:"cs_us"`
	TTLS         float64 `json:"ttl_s"`
	SharedClient bool    `json:"shared_client"`
	Warmup       bool    `json:"warmup"`
	DurationS    float64 `json:"duration_s"` // measured: first start to last worker done

	// Acquisitions is the number of completed critical sections.
	Acquisitions int64 `json:"acquisitions"`
	// OpsPerSec is completed critical sections per second, all workers.
	OpsPerSec float64 `json:"ops_per_sec"`
	// CycleUs is the mean time one worker spends per acquire → critical
	// section → release cycle (Workers / OpsPerSec). Uncontended, it is the
	// cost of an acquire+release pair plus the critical section.
	CycleUs float64 `json:"cycle_us"`
	// CyclePings is CycleUs less the critical section, in PING round trips.
	CyclePings float64 `json:"cycle_pings,omitempty"`

	// PingP50Us is the median of the PINGs measured before and after the
	// run on a separate client to the same store: the unit of latency.
	PingP50Us       float64 `json:"ping_p50_us"`
	PingBeforeP50Us float64 `json:"ping_before_p50_us"`
	PingAfterP50Us  float64 `json:"ping_after_p50_us"`
	// PingDuringP50Us is the median PING timed by worker 0 between its
	// cycles (--ping-every), under the run's own load and scheduling, on
	// the lock's own client when the algorithm allows (PingOwnClient).
	PingDuringP50Us float64 `json:"ping_during_p50_us,omitempty"`
	PingOwnClient   bool    `json:"ping_own_client,omitempty"`

	// PairP50Us is the median of Lock latency + release latency per cycle:
	// uncontended, the cost of one acquire+release pair.
	PairP50Us float64 `json:"pair_p50_us"`
	// PairPings is PairP50Us in PINGs (the during-run PING if measured,
	// else ping_p50_us).
	PairPings float64 `json:"pair_pings,omitempty"`

	// Hand-off: from a holder starting Release to the next holder's Lock
	// returning, on the same key, counted when that holder was already
	// waiting when the release started and is not the releaser itself.
	Handoffs      int     `json:"handoffs"`
	HandoffP50Us  float64 `json:"handoff_p50_us"`
	HandoffP99Us  float64 `json:"handoff_p99_us"`
	HandoffMaxUs  float64 `json:"handoff_max_us"`
	HandoffPings  float64 `json:"handoff_p50_pings,omitempty"`
	WaitP50Us     float64 `json:"wait_p50_us"` // Lock call to return
	WaitP99Us     float64 `json:"wait_p99_us"`
	WaitMaxUs     float64 `json:"wait_max_us"`
	ReleaseP50Us  float64 `json:"release_p50_us"`
	ReleaseP99Us  float64 `json:"release_p99_us"`
	Jain          float64 `json:"jain"` // over acquisitions per worker
	PerWorkerMin  int64   `json:"per_worker_min"`
	PerWorkerMax  int64   `json:"per_worker_max"`
	SelfReacqPct  float64 `json:"self_reacquire_pct"`
	Violations    int64   `json:"violations"` // acquisitions that saw an overlapping holder
	LockErrors    int64   `json:"lock_errors"`
	ReleaseErrors int64   `json:"release_errors"`
	FirstError    string  `json:"first_error,omitempty"`

	// Interrupted is set when the run was cancelled before its duration.
	Interrupted bool `json:"interrupted,omitempty"`

	GoMaxProcs int    `json:"gomaxprocs"`
	StartedAt  string `json:"started_at"`
}

// keyState is the harness's own view of one key, used to detect overlapping
// critical sections and to time hand-offs. Each sits on its own cache line.
type keyState struct {
	inside   atomic.Int32 // holders currently inside the critical section
	holder   atomic.Int32 // worker that last acquired the key; -1 before any
	relStart atomic.Int64 // ns since run start when the last release began
	_        [48]byte
}

func newKeyStates(n int) []keyState {
	ks := make([]keyState, n)
	for i := range ks {
		ks[i].holder.Store(-1)
	}
	return ks
}

// enter records worker w taking the key; it reports whether w was also the
// previous holder and whether someone else is inside.
func (k *keyState) enter(w int) (self, overlap bool) {
	overlap = k.inside.Add(1) != 1
	self = k.holder.Swap(int32(w)) == int32(w)
	return self, overlap
}

// leave records the holder leaving at ns since start, just before its
// release is sent; it reports whether someone else was inside meanwhile.
func (k *keyState) leave(ns int64) (overlap bool) {
	overlap = k.inside.Load() != 1
	k.inside.Add(-1)
	k.relStart.Store(ns)
	return overlap
}

type workerStats struct {
	acquisitions int64
	self         int64
	violations   int64
	lockErrors   int64
	relErrors    int64
	firstErr     error
	waits        []time.Duration
	handoffs     []time.Duration
	releases     []time.Duration
	pairs        []time.Duration
	pings        []time.Duration // worker 0 only, with PingEvery
}

// Run measures cfg.Algo under cfg. It fails when the run could not be set
// up or was aborted by errors; violations are reported in the Result. When
// ctx ends early, it returns what was measured so far, marked Interrupted.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &Result{
		Algo: cfg.Algo.Name, Store: storeurl.Redact(cfg.Store), Workers: cfg.Workers, Keys: cfg.Keys,
		Fair: cfg.Fair, CSUs: us(cfg.CS), TTLS: cfg.TTL.Seconds(), SharedClient: cfg.SharedClient, Warmup: cfg.Warmup,
		GoMaxProcs: runtime.GOMAXPROCS(0), StartedAt: time.Now().UTC().Format(time.RFC3339),
	}

	var pg *pinger
	if !storeurl.IsMemory(cfg.Store) && (cfg.Pings > 0 || cfg.PingEvery > 0) {
		p, err := newPinger(cfg.Store)
		if err != nil {
			return nil, err
		}
		defer p.close()
		pg = p
	}
	var pingBefore, pingAfter []time.Duration
	if pg != nil {
		var err error
		if pingBefore, err = pg.measure(ctx, cfg.Pings); err != nil {
			return nil, err
		}
	}

	factory, closeAlgo, err := cfg.Algo.Open(ctx, Setup{Store: cfg.Store, TTL: cfg.TTL, Fair: cfg.Fair, SharedClient: cfg.SharedClient})
	if err != nil {
		return nil, fmt.Errorf("lockbench: %s: %w", cfg.Algo.Name, err)
	}
	mutexes := make([]Mutex, 0, cfg.Workers)
	defer func() {
		for _, m := range mutexes {
			_ = m.Close()
		}
		if closeAlgo != nil {
			_ = closeAlgo()
		}
	}()
	for w := range cfg.Workers {
		m, err := factory(ctx, w)
		if err != nil {
			return nil, fmt.Errorf("lockbench: %s: worker %d: %w", cfg.Algo.Name, w, err)
		}
		mutexes = append(mutexes, m)
	}

	runID := lock.NewToken()[:12]
	if cfg.Warmup {
		if err := warmUp(ctx, mutexes, runID); err != nil {
			return nil, fmt.Errorf("lockbench: %s: warm-up: %w", cfg.Algo.Name, err)
		}
	}
	keys := make([]string, cfg.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("lockbench:%s:%d", runID, i)
	}
	states := newKeyStates(cfg.Keys)
	stats := make([]workerStats, cfg.Workers)

	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	var (
		ops    atomic.Int64 // acquisitions started, all workers
		errs   atomic.Int64 // lock errors, all workers
		wg     sync.WaitGroup
		ready  sync.WaitGroup
		starts = make(chan struct{})
		start  time.Time
		stopAt time.Time
	)
	var loopCtx context.Context
	var cancelLoop context.CancelFunc
	ready.Add(cfg.Workers)
	for w := range cfg.Workers {
		wg.Go(func() {
			ready.Done()
			<-starts
			var p *pinger
			if w == 0 && cfg.PingEvery > 0 {
				p = pg
			}
			worker(loopCtx, runCtx, cancelRun, w, mutexes[w], keys[w%cfg.Keys], &states[w%cfg.Keys],
				start, stopAt, cfg, p, &ops, &errs, &stats[w])
		})
	}
	ready.Wait()
	start = time.Now()
	stopAt = start.Add(cfg.Duration)
	loopCtx, cancelLoop = context.WithDeadline(runCtx, stopAt)
	close(starts)
	wg.Wait()
	elapsed := time.Since(start)
	cancelLoop()
	if cause := context.Cause(runCtx); cause != nil && ctx.Err() == nil {
		return nil, cause
	}
	if ctx.Err() != nil {
		// Interrupted: report what was measured so far.
		res.Interrupted = true
	} else if pg != nil {
		if pingAfter, err = pg.measure(ctx, cfg.Pings); err != nil {
			return nil, err
		}
	}
	_, ownPing := asPinger(mutexes[0])
	fill(res, cfg, stats, elapsed, pingBefore, pingAfter, ownPing)
	return res, nil
}

// worker is one worker's loop; loopCtx ends at the deadline, runCtx only
// when the run is aborted.
func worker(loopCtx, runCtx context.Context, abort context.CancelCauseFunc, w int, m Mutex, key string,
	ks *keyState, start, stopAt time.Time, cfg Config, p *pinger, ops, errs *atomic.Int64, st *workerStats) {
	// Releases that begin before the deadline must finish even after it.
	relCtx, cancel := context.WithDeadline(context.WithoutCancel(runCtx), stopAt.Add(releaseGrace))
	defer cancel()
	for loopCtx.Err() == nil && time.Now().Before(stopAt) {
		if ops.Add(1) > cfg.MaxOps {
			return
		}
		t0 := time.Since(start)
		release, err := m.Lock(loopCtx, key)
		t1 := time.Since(start)
		if err != nil {
			if loopCtx.Err() != nil || !time.Now().Before(stopAt) {
				// The deadline, not a failure (some clients notice it a
				// little before the context does).
				return
			}
			st.lockErrors++
			if st.firstErr == nil {
				st.firstErr = err
			}
			if errs.Add(1) >= maxErrors {
				abort(fmt.Errorf("%w: %d failures, the first: %w", ErrTooManyErrors, maxErrors, st.firstErr))
				return
			}
			sleepCtx(loopCtx, time.Millisecond)
			continue
		}
		self, overlap := ks.enter(w)
		if rs := ks.relStart.Load(); !self && rs > int64(t0) {
			st.handoffs = append(st.handoffs, t1-time.Duration(rs))
		}
		if cfg.CS > 0 {
			spin(cfg.CS)
		}
		r0 := time.Since(start)
		if ks.leave(int64(r0)) {
			overlap = true
		}
		st.acquisitions++
		st.waits = append(st.waits, t1-t0)
		if self {
			st.self++
		}
		if overlap {
			st.violations++
		}
		if err := release(relCtx); err != nil {
			st.relErrors++
			if st.firstErr == nil {
				st.firstErr = fmt.Errorf("release: %w", err)
			}
		}
		r1 := time.Since(start)
		st.releases = append(st.releases, r1-r0)
		st.pairs = append(st.pairs, t1-t0+r1-r0)
		if cfg.PingEvery > 0 && w == 0 && st.acquisitions%int64(cfg.PingEvery) == 0 {
			if d, err := pingOnce(loopCtx, m, p); err == nil {
				st.pings = append(st.pings, d)
			}
		}
	}
}

// spin busy-waits for d, as a critical section that uses the CPU would.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func fill(res *Result, cfg Config, stats []workerStats, elapsed time.Duration, pingBefore, pingAfter []time.Duration, ownPing bool) {
	var waits, handoffs, releases, pairs, during []time.Duration
	counts := make([]int64, len(stats))
	var self int64
	res.PerWorkerMin = -1
	for i := range stats {
		s := &stats[i]
		counts[i] = s.acquisitions
		res.Acquisitions += s.acquisitions
		self += s.self
		res.Violations += s.violations
		res.LockErrors += s.lockErrors
		res.ReleaseErrors += s.relErrors
		if s.firstErr != nil && res.FirstError == "" {
			res.FirstError = s.firstErr.Error()
		}
		if res.PerWorkerMin < 0 || s.acquisitions < res.PerWorkerMin {
			res.PerWorkerMin = s.acquisitions
		}
		res.PerWorkerMax = max(res.PerWorkerMax, s.acquisitions)
		waits = append(waits, s.waits...)
		handoffs = append(handoffs, s.handoffs...)
		releases = append(releases, s.releases...)
		pairs = append(pairs, s.pairs...)
		during = append(during, s.pings...)
	}
	res.DurationS = round(elapsed.Seconds(), 3)
	if elapsed > 0 {
		res.OpsPerSec = round(float64(res.Acquisitions)/elapsed.Seconds(), 1)
	}
	if res.Acquisitions > 0 {
		res.CycleUs = us(time.Duration(float64(elapsed) * float64(cfg.Workers) / float64(res.Acquisitions)))
	}
	res.Jain = round(Jain(counts), 5)
	res.SelfReacqPct = round(pct(self, res.Acquisitions), 2)

	w, h, r := summarize(waits), summarize(handoffs), summarize(releases)
	res.WaitP50Us, res.WaitP99Us, res.WaitMaxUs = us(w.p50), us(w.p99), us(w.max)
	res.Handoffs, res.HandoffP50Us, res.HandoffP99Us, res.HandoffMaxUs = h.n, us(h.p50), us(h.p99), us(h.max)
	res.ReleaseP50Us, res.ReleaseP99Us = us(r.p50), us(r.p99)
	res.PairP50Us = us(summarize(pairs).p50)
	if cfg.PingEvery > 0 && len(during) > 0 {
		res.PingOwnClient = ownPing
	}
	res.PingDuringP50Us = us(summarize(during).p50)

	all := append(append([]time.Duration(nil), pingBefore...), pingAfter...)
	res.PingP50Us = us(summarize(all).p50)
	res.PingBeforeP50Us = us(summarize(pingBefore).p50)
	res.PingAfterP50Us = us(summarize(pingAfter).p50)
	if res.PingP50Us > 0 {
		if res.Handoffs > 0 {
			res.HandoffPings = round(res.HandoffP50Us/res.PingP50Us, 2)
		}
		if res.CycleUs > 0 {
			res.CyclePings = round((res.CycleUs-res.CSUs)/res.PingP50Us, 2)
		}
	}
	unit := res.PingP50Us
	if res.PingDuringP50Us > 0 {
		unit = res.PingDuringP50Us
	}
	if unit > 0 && res.PairP50Us > 0 {
		res.PairPings = round(res.PairP50Us/unit, 2)
	}
}

// warmUpTimeout bounds the warm-up.
const warmUpTimeout = 30 * time.Second

// warmUp has every worker take and release a key of its own once, all at
// the same time (see Config.Warmup).
func warmUp(ctx context.Context, mutexes []Mutex, runID string) error {
	// A deadline, as the measured loop has: a context that can be cancelled
	// but has none would move a rueidis client to background reading for
	// good (see lock/redis callCtx), penalising the algorithms on rueidis
	// for the harness's choice rather than their own.
	ctx, cancel := context.WithTimeout(ctx, warmUpTimeout)
	defer cancel()
	errs := make([]error, len(mutexes))
	var wg sync.WaitGroup
	for w, m := range mutexes {
		wg.Go(func() {
			release, err := m.Lock(ctx, fmt.Sprintf("lockbench:%s:warmup:%d", runID, w))
			if err == nil {
				err = release(ctx)
			}
			errs[w] = err
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

package tenants

import (
	"context"
	"log/slog"
	"time"
)

// DefaultPollInterval is how often a Watcher asks the store for its
// version: one small read per replica, and a change in effect everywhere
// well within a second.
const DefaultPollInterval = 250 * time.Millisecond

// Watcher hands every new version of the registry to a function: it polls
// the store's version and loads the records only when it changed.
type Watcher struct {
	reg   *Registry
	every time.Duration
	log   *slog.Logger
	apply func(Snapshot)
	poke  chan struct{}
	// Observe, if set before the first Sync, is told the round trip of
	// each version poll (a steady sample of the store's latency).
	Observe func(d time.Duration, err error)
	// Only the goroutine running Sync (Run's, or the caller's before Run)
	// touches these.
	ver    int64
	loaded bool
	failed bool
}

// NewWatcher returns a watcher of reg calling apply with each new
// snapshot; every <= 0 means DefaultPollInterval.
func NewWatcher(reg *Registry, every time.Duration, log *slog.Logger, apply func(Snapshot)) *Watcher {
	if every <= 0 {
		every = DefaultPollInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{reg: reg, every: every, log: log, apply: apply, poke: make(chan struct{}, 1)}
}

// Sync applies the registry's current version if it is not the one
// applied last. Call it from one goroutine at a time: before Run, or not
// at all once Run runs.
func (w *Watcher) Sync(ctx context.Context) error {
	err := w.sync(ctx)
	switch {
	case err != nil && !w.failed:
		w.failed = true
		w.log.Warn("tenant registry: cannot read the store; the tenants last read stay in force", "err", err)
	case err == nil && w.failed:
		w.failed = false
		w.log.Info("tenant registry: the store answers again")
	}
	return err
}

func (w *Watcher) sync(ctx context.Context) error {
	start := time.Now()
	v, err := w.reg.store.Version(ctx)
	if w.Observe != nil {
		w.Observe(time.Since(start), err)
	}
	if err != nil {
		return err
	}
	if w.loaded && v == w.ver {
		return nil
	}
	s, err := w.reg.Snapshot(ctx)
	if err != nil {
		return err
	}
	w.apply(s)
	w.ver, w.loaded = s.Version, true
	return nil
}

// Poke makes Run sync now instead of at its next tick (a change made on
// this replica is then in force here at once).
func (w *Watcher) Poke() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// Run syncs every interval and on each Poke until ctx is done.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.poke:
		}
		sctx, cancel := context.WithTimeout(ctx, 2*w.every+time.Second)
		_ = w.Sync(sctx)
		cancel()
	}
}

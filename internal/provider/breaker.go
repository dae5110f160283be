package provider

import (
	"sync"
	"sync/atomic"
	"time"
)

// Breaker states, kept in the low two bits of breaker.word.
const (
	stateClosed uint64 = iota
	stateOpen
	stateHalfOpen
)

// outcome is what one Do call tells the breaker.
type outcome uint8

const (
	// neutral calls say nothing about the upstream's health: a 429 (rate
	// limiting, handled through Feedback), the caller's cancellation, or
	// no request sent.
	neutral outcome = iota
	success
	failure
)

// transition is a breaker state change worth logging.
type transition uint8

const (
	noChange transition = iota
	opened              // closed → open: too many consecutive failures
	reopened            // half-open → open: the trial failed
	closed              // half-open → closed: the trial succeeded
)

// ticket is a permission to call, from breaker.allow. gen is the breaker
// generation it was issued in: results of calls that started before the
// last state change are ignored, so a slow call that started while the
// breaker was closed cannot close it again after it opened.
type ticket struct {
	gen   uint64
	trial bool // the one call let through by a half-open breaker
}

// breaker is the circuit breaker of one target. State and generation share
// one atomic word so that the hot path of a healthy target (allow, and
// record of a success after another success) takes no lock.
type breaker struct {
	word  atomic.Uint64 // gen<<2 | state; written under mu
	fails atomic.Int64  // consecutive failures in this closed generation; written under mu

	mu        sync.Mutex // protects openUntil, trial and every change of word and fails
	openUntil time.Time
	trial     bool // the half-open trial call is in flight
}

// allow reports whether a call may be sent now and returns its ticket.
// An open breaker whose time is up turns half-open, and its first caller
// becomes the trial; everyone else is refused until the trial ends.
func (b *breaker) allow(now time.Time) (ticket, bool) {
	if w := b.word.Load(); w&3 == stateClosed {
		return ticket{gen: w >> 2}, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	switch w & 3 {
	case stateClosed:
		return ticket{gen: w >> 2}, true
	case stateOpen:
		if now.Before(b.openUntil) {
			return ticket{}, false
		}
		w = b.setLocked(stateHalfOpen)
		b.trial = false
	}
	if b.trial {
		return ticket{}, false
	}
	b.trial = true
	return ticket{gen: w >> 2, trial: true}, true
}

// record applies the outcome of a call made with tk.
func (b *breaker) record(tk ticket, o outcome, now time.Time, failures int, openFor time.Duration) transition {
	switch o {
	case success:
		//lint:ignore SA4016 stateClosed is 0; it is written out for the reader
		if !tk.trial && b.word.Load() == tk.gen<<2|stateClosed && b.fails.Load() == 0 {
			return noChange // the healthy fast path
		}
	case neutral:
		if !tk.trial {
			return noChange
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	if w>>2 != tk.gen {
		return noChange // stale: the state changed since the call started
	}
	switch w & 3 {
	case stateClosed:
		switch o {
		case success:
			b.fails.Store(0)
		case failure:
			return b.failLocked(now, failures, openFor)
		}
	case stateHalfOpen:
		if !tk.trial {
			return noChange
		}
		b.trial = false
		switch o {
		case success:
			b.setLocked(stateClosed)
			return closed
		case failure:
			b.openLocked(now, openFor)
			return reopened
		}
		// neutral: the trial told nothing; the next caller becomes the trial.
	}
	return noChange
}

// reportFailure counts a failure seen after the call returned (a stream
// broken halfway). It only applies to a closed breaker: an open one has
// already judged, and a half-open one waits for its own trial.
func (b *breaker) reportFailure(now time.Time, failures int, openFor time.Duration) transition {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.word.Load()&3 != stateClosed {
		return noChange
	}
	return b.failLocked(now, failures, openFor)
}

// failLocked counts one failure of a closed breaker and opens it at the
// threshold. b.mu must be held.
func (b *breaker) failLocked(now time.Time, failures int, openFor time.Duration) transition {
	if b.fails.Add(1) < int64(failures) {
		return noChange
	}
	b.openLocked(now, openFor)
	return opened
}

// openLocked opens the breaker until now+openFor. b.mu must be held.
func (b *breaker) openLocked(now time.Time, openFor time.Duration) {
	b.openUntil = now.Add(openFor)
	b.setLocked(stateOpen)
}

// setLocked moves to state s in a new generation. b.mu must be held.
func (b *breaker) setLocked(s uint64) uint64 {
	w := (b.word.Load()>>2+1)<<2 | s
	b.fails.Store(0)
	b.word.Store(w)
	return w
}

// status returns the state as the caller would find it now (an open
// breaker whose time is up reads as half-open) and whether a call would be
// let through, without taking the half-open trial.
func (b *breaker) status(now time.Time) (state string, available bool) {
	if b.word.Load()&3 == stateClosed {
		return "closed", true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.word.Load() & 3 {
	case stateClosed:
		return "closed", true
	case stateOpen:
		if now.Before(b.openUntil) {
			return "open", false
		}
		return "half-open", true
	}
	return "half-open", !b.trial
}

// retryIn returns how long until an open breaker lets a trial through.
func (b *breaker) retryIn(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(b.openUntil.Sub(now), 0)
}

// isOpen reports whether the breaker is open, for a retry loop that should
// stop hammering a target that other calls have just judged down.
func (b *breaker) isOpen() bool { return b.word.Load()&3 == stateOpen }

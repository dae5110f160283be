package dedup

import (
	"context"
	"time"

	"github.com/llmgate/llmgate/lock"
)

// State is where a flight, or one generation of it, stands in the store.
type State uint8

const (
	// StateNone: no flight (never started, expired, or ended without a
	// result). For a generation: it ended without a result.
	StateNone State = iota
	// StateRunning: a leader is producing the result.
	StateRunning
	// StateFinished: the result is complete and retained.
	StateFinished
)

func (s State) String() string {
	switch s {
	case StateNone:
		return "none"
	case StateRunning:
		return "running"
	case StateFinished:
		return "finished"
	}
	return "invalid"
}

// Flight is the store's record of a key.
type Flight struct {
	State State
	// Gen identifies the generation: the fencing token of the lease its
	// leader held when it claimed the key. Generations of a key therefore
	// never repeat, and a later one has a larger Gen.
	Gen uint64
	// Fingerprint is the request the generation runs.
	Fingerprint string
}

// Batch is the result of one Backend.Read.
type Batch struct {
	// Frames are the next frames of the generation, in order. They are
	// shared with other readers and must not be modified.
	Frames [][]byte
	// Cursor is the position after Frames, to pass to the next Read (the
	// cursor passed in if Frames is empty).
	Cursor string
	// State is StateRunning if more frames may follow, StateFinished if
	// Frames end the result, and StateNone if the generation ended without
	// a result (aborted, taken over, or expired).
	State State
}

// Backend is the store side of a Group: a record per key naming its current
// generation, and an append-only frame log per generation. Leadership is a
// lock (from Locks) named by the flight key; Group takes it before Claim and
// holds it until Finish or Abort. Implementations are safe for concurrent
// use. Keys and fingerprints have been validated by the Group.
type Backend interface {
	// Locks returns the lock store that leaders take their leases from.
	// Every Backend sharing one flight store must return a lock backend
	// sharing one lock store, with lock names kept apart from other users.
	Locks() lock.Backend
	// Lookup returns the record of key (StateNone if there is none).
	Lookup(ctx context.Context, key string) (Flight, error)
	// Claim starts generation gen (the caller's fencing token, which holds
	// the lock) of key, running fingerprint, unless a result is retained or
	// a generation at least as new is running: then it changes nothing and
	// returns that record. A running generation older than gen has lost its
	// lease: it is ended (its readers see StateNone) and replaced. A new
	// generation's records live for keep unless refreshed.
	Claim(ctx context.Context, key, fingerprint string, gen uint64, keep time.Duration) (Flight, error)
	// Append adds one frame to generation gen and refreshes its records for
	// keep. ErrLost if gen is not the running generation of key.
	Append(ctx context.Context, key string, gen uint64, frame []byte, keep time.Duration) error
	// Refresh keeps the records of running generation gen for keep more.
	// ErrLost if gen is not the running generation of key.
	Refresh(ctx context.Context, key string, gen uint64, keep time.Duration) error
	// Finish marks generation gen complete; its record and frames stay
	// readable for retain. ErrLost if gen is not the running generation.
	Finish(ctx context.Context, key string, gen uint64, retain time.Duration) error
	// Abort ends running generation gen without a result: the record is
	// removed, its readers see StateNone at once (a tombstone stays
	// readable for up to linger), and the frames are dropped. It is a no-op
	// if gen is not the running generation (it finished, or was replaced).
	Abort(ctx context.Context, key string, gen uint64, linger time.Duration) error
	// Read returns up to limit frames of generation gen after cursor ("" is
	// the start). If none are available it waits up to wait (0: not at
	// all) for one to be appended or for the generation to end, or until
	// ctx ends (then ctx.Err()). A generation the store no longer knows is
	// StateNone.
	Read(ctx context.Context, key string, gen uint64, cursor string, limit int, wait time.Duration) (Batch, error)
}

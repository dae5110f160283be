// Package lockcheck checks recorded histories of fenced writes made under a distributed lock for linearizability, with porcupine.
//
// A history is what the processes that shared one lock saw: each
// acquisition (the fence it returned) and each write to a fenced register
// (the fence it carried, and whether the register accepted it), with
// invocation and response times. The model is the promise of a fenced lock:
//
//   - every acquisition returns a fence above every fence granted before it;
//   - an accepted write carries a fence no lower than any accepted before it,
//     so accepted writes carry strictly increasing fences from one holder to
//     the next (one acquisition writes with one fence);
//   - a rejected write carries a fence lower than one accepted before it:
//     once holder B's first write was accepted, a write by an earlier
//     holder A is rejected, so no two holders' writes interleave.
//
// A write whose answer was never seen (its process was killed) may or may
// not have taken effect; the model allows both.
package lockcheck

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// Op names an event of a history.
type Op string

// Events a process records.
const (
	// OpAcquire is a successful acquisition: Call, Ret, Fence.
	OpAcquire Op = "acq"
	// OpWriteCall is the start of a write: Call, Fence, Seq.
	OpWriteCall Op = "w"
	// OpWriteRet is the answer to the write with the same Proc and Seq:
	// Ret, OK (accepted), Unknown (no answer: an error).
	OpWriteRet Op = "wret"
	// OpRelease is a release (successful or not): Call, Ret.
	OpRelease Op = "rel"
	// OpLost is a holder learning it lost the lock (a renewal refused or
	// its validity ran out) before releasing: Call.
	OpLost Op = "lost"
)

// Event is one record of a history.
type Event struct {
	Op      Op     `json:"op"`
	Key     int    `json:"k"` // which history (one lock key each)
	Proc    int    `json:"p"` // the process, from 0
	Seq     int    `json:"s,omitempty"`
	Call    int64  `json:"c,omitempty"` // Unix ns
	Ret     int64  `json:"r,omitempty"`
	Fence   uint64 `json:"f,omitempty"`
	OK      bool   `json:"ok,omitempty"`
	Unknown bool   `json:"u,omitempty"`
}

type kind uint8

const (
	acquireKind kind = iota
	writeKind
)

// input and output are the porcupine operation's.
type input struct {
	kind  kind
	fence uint64 // a write's fence
}

type output struct {
	fence    uint64 // an acquisition's
	accepted bool
	unknown  bool
}

// state is the highest fence granted and the highest accepted.
type state struct {
	granted, accepted uint64
}

// Model is the porcupine model of a fenced lock and register (see the
// package documentation).
var Model = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{state{}} },
	Step: func(st, in, out any) []any {
		s, i, o := st.(state), in.(input), out.(output)
		switch i.kind {
		case acquireKind:
			if o.fence <= s.granted {
				return nil
			}
			s.granted = o.fence
			return []any{s}
		default:
			if i.fence > s.granted {
				return nil // a write with a fence nobody was granted
			}
			ok := i.fence >= s.accepted
			switch {
			case o.unknown:
				next := []any{s} // it never reached the register
				if ok {
					next = append(next, state{s.granted, i.fence})
				}
				return next
			case o.accepted && ok:
				s.accepted = i.fence
				return []any{s}
			case !o.accepted && !ok:
				return []any{s}
			}
			return nil
		}
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(input), out.(output)
		if i.kind == acquireKind {
			return fmt.Sprintf("acquire -> fence %d", o.fence)
		}
		switch {
		case o.unknown:
			return fmt.Sprintf("write(fence %d) -> ?", i.fence)
		case o.accepted:
			return fmt.Sprintf("write(fence %d) -> accepted", i.fence)
		}
		return fmt.Sprintf("write(fence %d) -> rejected", i.fence)
	},
	DescribeState: func(st any) string {
		s := st.(state)
		return fmt.Sprintf("granted ≤ %d, accepted ≤ %d", s.granted, s.accepted)
	},
}).ToModel()

// Operations turns the events of one history into porcupine operations. A
// write without an answer (its process died, or the register call failed)
// is open until after the last event, with an unknown outcome.
func Operations(events []Event) []porcupine.Operation {
	var ops []porcupine.Operation
	var last int64
	type id struct{ proc, seq int }
	rets := make(map[id]Event)
	for _, e := range events {
		last = max(last, e.Call, e.Ret)
		if e.Op == OpWriteRet {
			rets[id{e.Proc, e.Seq}] = e
		}
	}
	for _, e := range events {
		switch e.Op {
		case OpAcquire:
			ops = append(ops, porcupine.Operation{ClientId: e.Proc, Input: input{kind: acquireKind}, Call: e.Call, Output: output{fence: e.Fence}, Return: e.Ret})
		case OpWriteCall:
			op := porcupine.Operation{ClientId: e.Proc, Input: input{kind: writeKind, fence: e.Fence}, Call: e.Call}
			if r, ok := rets[id{e.Proc, e.Seq}]; ok && !r.Unknown {
				op.Output, op.Return = output{accepted: r.OK}, r.Ret
			} else {
				op.Output, op.Return = output{unknown: true}, last+1
			}
			ops = append(ops, op)
		}
	}
	slices.SortFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	return ops
}

// Result is the verdict on one history.
type Result struct {
	Ops      int
	Accepted int // writes the register accepted
	Rejected int // writes it rejected (stale fences)
	// Overlaps counts pairs of holds by different processes that overlapped
	// in time, each process believing it held the lock: from an
	// acquisition's answer to its release, or to the moment the holder
	// learnt it had lost the lock, or (killed) to its last write.
	Overlaps int
	Verdict  porcupine.CheckResult
	Info     porcupine.LinearizationInfo
}

// Check checks one history; timeout bounds porcupine's search.
func Check(events []Event, timeout time.Duration) Result {
	ops := Operations(events)
	res, info := porcupine.CheckOperationsVerbose(Model, ops, timeout)
	r := Result{Ops: len(ops), Verdict: res, Info: info, Overlaps: overlaps(events)}
	for _, e := range events {
		if e.Op == OpWriteRet && !e.Unknown {
			if e.OK {
				r.Accepted++
			} else {
				r.Rejected++
			}
		}
	}
	return r
}

// overlaps counts overlapping holds of different processes.
func overlaps(events []Event) int {
	type hold struct {
		proc       int
		start, end int64
	}
	var holds []hold
	open := make(map[int]int) // proc -> index in holds of its open hold
	for _, e := range slices.SortedFunc(slices.Values(events), func(a, b Event) int {
		return cmp.Compare(max(a.Call, a.Ret), max(b.Call, b.Ret))
	}) {
		switch e.Op {
		case OpAcquire:
			open[e.Proc] = len(holds)
			holds = append(holds, hold{e.Proc, e.Ret, e.Ret})
		case OpWriteCall, OpWriteRet:
			if i, ok := open[e.Proc]; ok {
				holds[i].end = max(holds[i].end, e.Call, e.Ret)
			}
		case OpRelease, OpLost:
			if i, ok := open[e.Proc]; ok {
				holds[i].end = max(holds[i].end, e.Call)
				delete(open, e.Proc)
			}
		}
	}
	n := 0
	for i, a := range holds {
		for _, b := range holds[i+1:] {
			if a.proc != b.proc && a.start < b.end && b.start < a.end {
				n++
			}
		}
	}
	return n
}

// Visualize writes porcupine's HTML visualisation of a checked history.
func Visualize(r Result, path string) error {
	return porcupine.VisualizePath(Model, r.Info, path)
}

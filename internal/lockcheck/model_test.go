package lockcheck

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Crafted histories: times are small integers, one unit apart.
func TestModel(t *testing.T) {
	acq := func(p int, c, r int64, f uint64) Event {
		return Event{Op: OpAcquire, Proc: p, Call: c, Ret: r, Fence: f}
	}
	w := func(p, seq int, c, r int64, f uint64, ok bool) []Event {
		return []Event{{Op: OpWriteCall, Proc: p, Seq: seq, Call: c, Fence: f}, {Op: OpWriteRet, Proc: p, Seq: seq, Ret: r, OK: ok}}
	}
	cat := func(parts ...any) []Event {
		var es []Event
		for _, p := range parts {
			switch v := p.(type) {
			case Event:
				es = append(es, v)
			case []Event:
				es = append(es, v...)
			}
		}
		return es
	}
	for _, tc := range []struct {
		name   string
		events []Event
		want   porcupine.CheckResult
	}{
		{"holders in turn", cat(acq(0, 1, 2, 10), w(0, 1, 3, 4, 10, true), w(0, 2, 5, 6, 10, true), acq(1, 7, 8, 11), w(1, 1, 9, 10, 11, true)), porcupine.Ok},
		{"stale write rejected", cat(acq(0, 1, 2, 10), acq(1, 3, 4, 11), w(1, 1, 5, 6, 11, true), w(0, 1, 7, 8, 10, false)), porcupine.Ok},
		{"stale write accepted after the next holder's", cat(acq(0, 1, 2, 10), acq(1, 3, 4, 11), w(1, 1, 5, 6, 11, true), w(0, 1, 7, 8, 10, true)), porcupine.Illegal},
		{"concurrent writes may order either way", cat(acq(0, 1, 2, 10), acq(1, 3, 4, 11), w(1, 1, 5, 8, 11, true), w(0, 1, 6, 7, 10, true)), porcupine.Ok},
		{"fence repeated by a later acquisition", cat(acq(0, 1, 2, 10), acq(1, 3, 4, 10)), porcupine.Illegal},
		{"fence going backwards", cat(acq(0, 1, 2, 10), acq(1, 3, 4, 9)), porcupine.Illegal},
		{"fresh write rejected", cat(acq(0, 1, 2, 10), w(0, 1, 3, 4, 10, false)), porcupine.Illegal},
		{"write with a fence nobody was granted", cat(acq(0, 1, 2, 10), w(0, 1, 3, 4, 12, true)), porcupine.Illegal},
		{"unanswered write may have been accepted", cat(acq(0, 1, 2, 10), Event{Op: OpWriteCall, Proc: 0, Seq: 1, Call: 3, Fence: 10}, acq(1, 5, 6, 11), w(1, 1, 7, 8, 11, true)), porcupine.Ok},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.events, 10*time.Second)
			if r.Verdict != tc.want {
				t.Fatalf("verdict %v, want %v", r.Verdict, tc.want)
			}
		})
	}
}

func TestOverlapsAndVisualize(t *testing.T) {
	events := []Event{
		{Op: OpAcquire, Proc: 0, Call: 1, Ret: 2, Fence: 10},
		{Op: OpAcquire, Proc: 1, Call: 3, Ret: 4, Fence: 11}, // while 0 still believes it holds
		{Op: OpWriteCall, Proc: 1, Seq: 1, Call: 5, Fence: 11},
		{Op: OpWriteRet, Proc: 1, Seq: 1, Ret: 6, OK: true},
		{Op: OpWriteCall, Proc: 0, Seq: 1, Call: 7, Fence: 10},
		{Op: OpWriteRet, Proc: 0, Seq: 1, Ret: 8, OK: true},
		{Op: OpRelease, Proc: 0, Call: 9, Ret: 10},
		{Op: OpRelease, Proc: 1, Call: 9, Ret: 10},
	}
	r := Check(events, 10*time.Second)
	if r.Overlaps != 1 || r.Accepted != 2 || r.Rejected != 0 || r.Verdict != porcupine.Illegal {
		t.Fatalf("overlaps %d accepted %d rejected %d verdict %v; want 1 2 0 Illegal", r.Overlaps, r.Accepted, r.Rejected, r.Verdict)
	}
	path := filepath.Join(t.TempDir(), "h.html")
	if err := Visualize(r, path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("visualisation not written: %v", err)
	}
}

package redis

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/dedup"
)

// errMalformed is wrapped by every error about stored data this package
// cannot read.
var errMalformed = errors.New("malformed stored data")

// recordState is what check.lua says of a generation's record.
type recordState int

const (
	stateUnknown  recordState = -1 // not asked (an XREAD that returned entries)
	stateOther    recordState = 0  // the record names another generation, or none
	stateRunning  recordState = 1
	stateFinished recordState = 2
)

// decodeRecord reads the fields g, s, f of a flight record (nil: absent).
func decodeRecord(fields []*string) (dedup.Flight, error) {
	if len(fields) != 3 {
		return dedup.Flight{}, fmt.Errorf("%w: record of %d fields, want 3", errMalformed, len(fields))
	}
	g, s, f := fields[0], fields[1], fields[2]
	if g == nil && s == nil && f == nil {
		return dedup.Flight{}, nil
	}
	if g == nil || s == nil || f == nil {
		return dedup.Flight{}, fmt.Errorf("%w: record lacks a field (g %v, s %v, f %v)", errMalformed, g != nil, s != nil, f != nil)
	}
	gen, ok := parseGen(*g)
	if !ok {
		return dedup.Flight{}, fmt.Errorf("%w: generation %q", errMalformed, clip(*g))
	}
	fl := dedup.Flight{Gen: gen, Fingerprint: *f}
	switch *s {
	case "r":
		fl.State = dedup.StateRunning
	case "f":
		fl.State = dedup.StateFinished
	default:
		return dedup.Flight{}, fmt.Errorf("%w: state %q", errMalformed, clip(*s))
	}
	return fl, nil
}

// parseGen parses a canonical positive decimal (what the scripts compare as
// strings: no sign, no leading zero).
func parseGen(s string) (uint64, bool) {
	if s == "" || s[0] == '0' || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// streamID is a parsed stream entry ID "ms-seq".
type streamID struct{ ms, seq uint64 }

func parseID(s string) (streamID, bool) {
	a, b, ok := strings.Cut(s, "-")
	if !ok || a == "" || b == "" || strings.TrimLeft(a, "0123456789") != "" || strings.TrimLeft(b, "0123456789") != "" {
		return streamID{}, false
	}
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	return streamID{ms, seq}, err1 == nil && err2 == nil
}

func validID(s string) bool {
	_, ok := parseID(s)
	return ok
}

func (a streamID) less(b streamID) bool {
	return a.ms < b.ms || (a.ms == b.ms && a.seq < b.seq)
}

// decodeEntries turns stream entries read after cursor into a Batch. An
// entry is one field: "d" a frame, "e" the end of a finished result, "a" the
// end of an aborted one. Without an end entry the state comes from st
// (check.lua's verdict), unless the read was cut at limit or st is unknown:
// then more may follow.
func decodeEntries(entries []rueidis.XRangeEntry, cursor string, limit int, st recordState) (dedup.Batch, error) {
	last, ok := parseID(cursor)
	if !ok {
		return dedup.Batch{}, fmt.Errorf("%w: cursor %q", errMalformed, clip(cursor))
	}
	batch := dedup.Batch{Cursor: cursor, State: dedup.StateRunning}
	for _, e := range entries {
		id, ok := parseID(e.ID)
		if !ok {
			return dedup.Batch{}, fmt.Errorf("%w: entry ID %q", errMalformed, clip(e.ID))
		}
		if !last.less(id) {
			return dedup.Batch{}, fmt.Errorf("%w: entry ID %q is not after %q", errMalformed, clip(e.ID), clip(batch.Cursor))
		}
		if len(e.FieldValues) != 1 {
			return dedup.Batch{}, fmt.Errorf("%w: entry %q has %d fields, want 1", errMalformed, clip(e.ID), len(e.FieldValues))
		}
		last, batch.Cursor = id, e.ID
		for kind, value := range e.FieldValues {
			switch kind {
			case "d":
				batch.Frames = append(batch.Frames, []byte(value))
			case "e":
				batch.State = dedup.StateFinished
				return batch, nil
			case "a":
				batch.State = dedup.StateNone
				return batch, nil
			default:
				return dedup.Batch{}, fmt.Errorf("%w: entry %q of kind %q", errMalformed, clip(e.ID), clip(kind))
			}
		}
	}
	if st != stateUnknown && len(entries) < limit {
		switch st {
		case stateRunning:
		case stateFinished, stateOther:
			// Finished without an end entry after the cursor: the frames
			// expired before the record. Either way the result is gone.
			batch.State = dedup.StateNone
		default:
			return dedup.Batch{}, fmt.Errorf("%w: record state %d", errMalformed, st)
		}
	}
	return batch, nil
}

// clip shortens stored data quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

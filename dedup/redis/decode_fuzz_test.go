package redis

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/dedup"
)

// FuzzDecodeRecord feeds decodeRecord arbitrary record fields, each present
// or not: it never panics; it accepts only a canonical positive generation
// and a known state, or a record with no field at all; and what it accepts
// says exactly what was stored.
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range [][3]string{
		{"1733000000000000", "r", "sha256:abc"},
		{"1", "f", ""},
		{"0", "r", "x"},
		{"01", "r", "x"},
		{"18446744073709551616", "f", "x"},
		{"-5", "r", "x"},
		{"5", "x", "x"},
		{" 5", "r", "x"},
	} {
		f.Add(s[0], s[1], s[2], uint8(7))
	}
	f.Add("", "", "", uint8(0))
	f.Add("1", "r", "", uint8(3))
	f.Fuzz(func(t *testing.T, g, s, fp string, present uint8) {
		fields := make([]*string, 3)
		for i, v := range []string{g, s, fp} {
			if present&(1<<i) != 0 {
				fields[i] = &v
			}
		}
		fl, err := decodeRecord(fields)
		if err != nil {
			return
		}
		if present&7 == 0 {
			if fl != (dedup.Flight{}) {
				t.Fatalf("no fields decoded as %+v", fl)
			}
			return
		}
		if present&7 != 7 {
			t.Fatalf("record with fields %03b accepted as %+v", present&7, fl)
		}
		if fl.Gen == 0 || strconv.FormatUint(fl.Gen, 10) != g {
			t.Fatalf("generation %q decoded as %d", g, fl.Gen)
		}
		if want := map[string]dedup.State{"r": dedup.StateRunning, "f": dedup.StateFinished}[s]; want == dedup.StateNone || fl.State != want {
			t.Fatalf("state %q decoded as %v", s, fl.State)
		}
		if fl.Fingerprint != fp {
			t.Fatalf("fingerprint %q decoded as %q", fp, fl.Fingerprint)
		}
	})
}

// FuzzDecodeEntries feeds decodeEntries arbitrary stream entries (IDs,
// field names, values, counts of fields), cursors, limits and record
// states: it never panics, and a Batch it returns is consistent: its frames
// are the values of the leading "d" entries, in order; its cursor is the
// input cursor or the ID of the last entry it consumed; it ends at the first
// "e" (finished) or "a" (gone), and otherwise the state follows the record
// unless the read was cut at its limit.
func FuzzDecodeEntries(f *testing.F) {
	f.Add("1-0,1-1,2-0", "dde", "a,b,", "0-0", uint8(10), int8(1), uint8(0))
	f.Add("5-0", "a", "", "4-9", uint8(1), int8(0), uint8(0))
	f.Add("1-0,1-0", "dd", "x,y", "0-0", uint8(10), int8(-1), uint8(0))
	f.Add("1-0", "d", "x", "2-0", uint8(10), int8(2), uint8(0))
	f.Add("x,1-", "dz", "\x00,\xff", "0-0", uint8(0), int8(7), uint8(1))
	f.Add("", "", "", "", uint8(5), int8(2), uint8(0))
	f.Fuzz(func(t *testing.T, ids, kinds, values, cursor string, limit uint8, st int8, extra uint8) {
		idList, valList := strings.Split(ids, ","), strings.Split(values, ",")
		n := min(len(idList), len(kinds), len(valList), 64)
		if ids == "" {
			n = 0
		}
		entries := make([]rueidis.XRangeEntry, n)
		for i := range n {
			fv := map[string]string{kinds[i : i+1]: valList[i]}
			if extra&(1<<(i%8)) != 0 {
				fv["x"] = "" // a second field
			}
			entries[i] = rueidis.XRangeEntry{ID: idList[i], FieldValues: fv}
		}
		b, err := decodeEntries(entries, cursor, int(limit), recordState(st))
		if err != nil {
			return
		}
		if !validID(cursor) {
			t.Fatalf("accepted malformed cursor %q", cursor)
		}
		var want [][]byte
		wantState := dedup.StateRunning
		consumed := 0
		terminal := false
		for _, e := range entries {
			consumed++
			if len(e.FieldValues) != 1 {
				t.Fatalf("accepted an entry with %d fields", len(e.FieldValues))
			}
			if v, ok := e.FieldValues["d"]; ok {
				want = append(want, []byte(v))
				continue
			}
			if _, ok := e.FieldValues["e"]; ok {
				wantState, terminal = dedup.StateFinished, true
			} else if _, ok := e.FieldValues["a"]; ok {
				wantState, terminal = dedup.StateNone, true
			} else {
				t.Fatalf("accepted entry %+v of an unknown kind", e)
			}
			break
		}
		if !terminal && recordState(st) != stateUnknown && len(entries) < int(limit) {
			switch recordState(st) {
			case stateRunning:
			case stateFinished, stateOther:
				wantState = dedup.StateNone
			default:
				t.Fatalf("accepted record state %d", st)
			}
		}
		if b.State != wantState {
			t.Fatalf("state %v, want %v", b.State, wantState)
		}
		if len(b.Frames) != len(want) {
			t.Fatalf("%d frames, want %d", len(b.Frames), len(want))
		}
		for i := range want {
			if !bytes.Equal(b.Frames[i], want[i]) {
				t.Fatalf("frame %d = %q, want %q", i, b.Frames[i], want[i])
			}
		}
		wantCursor := cursor
		if consumed > 0 {
			wantCursor = entries[consumed-1].ID
		}
		if b.Cursor != wantCursor {
			t.Fatalf("cursor %q, want %q", b.Cursor, wantCursor)
		}
		// IDs consumed strictly increase from the cursor.
		prev, _ := parseID(cursor)
		for _, e := range entries[:consumed] {
			id, ok := parseID(e.ID)
			if !ok || !prev.less(id) {
				t.Fatalf("accepted ID %q after %v", e.ID, prev)
			}
			prev = id
		}
	})
}

// FuzzParseID: parseID never panics and accepts exactly "digits-digits"
// whose parts fit in 64 bits.
func FuzzParseID(f *testing.F) {
	for _, s := range []string{"0-0", "1733000000000-5", "18446744073709551615-18446744073709551615", "18446744073709551616-0", "1-", "-1", "a-b", "1-2-3", "+1-2", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, ok := parseID(s)
		a, b, cut := strings.Cut(s, "-")
		digits := func(x string) bool { return x != "" && strings.Trim(x, "0123456789") == "" }
		if !cut || !digits(a) || !digits(b) {
			if ok {
				t.Fatalf("accepted %q", s)
			}
			return
		}
		ma, err1 := strconv.ParseUint(a, 10, 64)
		mb, err2 := strconv.ParseUint(b, 10, 64)
		if fits := err1 == nil && err2 == nil; fits != ok {
			t.Fatalf("parseID(%q) ok=%v, want %v", s, ok, fits)
		}
		if ok && (id.ms != ma || id.seq != mb) {
			t.Fatalf("parseID(%q) = %+v", s, id)
		}
	})
}

package respcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"net/http"
	"reflect"
	"testing"
	"time"
)

// reseal replaces the checksum of an encoded entry, so that a test can
// reach the checks behind it.
func reseal(b []byte) []byte {
	body := bytes.Clone(b[:len(b)-crcLen])
	return binary.BigEndian.AppendUint32(body, crc32.Checksum(body, castagnoli))
}

func TestCodecGolden(t *testing.T) {
	e := &Entry{
		Status:  200,
		Header:  http.Header{"B": {"2"}, "A": {"1", ""}},
		Body:    []byte("{}"),
		Created: time.Unix(1, 5),
	}
	want := []byte("LGRC\x01\x05" + // magic, version, flags body|created
		"\xc8\x01" + // status 200
		"\x02\x05" + // created: varint 1 (zig-zag 2), 5 ns
		"\x02" + "\x01A\x02\x011\x00" + "\x01B\x01\x012" + // header, names sorted
		"\x02{}") // body
	want = binary.BigEndian.AppendUint32(want, crc32.Checksum(want, castagnoli))
	got := encodeEntry(e)
	if !bytes.Equal(got, want) {
		t.Fatalf("encodeEntry =\n%q\nwant\n%q", got, want)
	}
	if encodedLen(e) != len(got) {
		t.Fatalf("encodedLen = %d, len = %d", encodedLen(e), len(got))
	}
}

func TestDecodeRefusesStructuralErrors(t *testing.T) {
	good := encodeEntry(&Entry{Status: 200, Header: http.Header{"A": {"1"}, "B": {"2"}}, Body: []byte("{}")})
	if _, err := decodeEntry(good); err != nil {
		t.Fatalf("decodeEntry(good): %v", err)
	}
	for name, b := range map[string][]byte{
		"version 2":        reseal(append([]byte("LGRC\x02"), good[5:]...)),
		"version 0":        reseal(append([]byte("LGRC\x00"), good[5:]...)),
		"unknown flag":     reseal(append([]byte("LGRC\x01\x09"), good[6:]...)),
		"body and events":  reseal(append([]byte("LGRC\x01\x03"), good[6:]...)),
		"headers unsorted": reseal(bytes.Replace(good, []byte("\x01A\x01\x011\x01B"), []byte("\x01B\x01\x011\x01A"), 1)),
		"header repeated":  reseal(bytes.Replace(good, []byte("\x01A\x01\x011\x01B"), []byte("\x01A\x01\x011\x01A"), 1)),
		"trailing byte":    reseal(append(bytes.Clone(good[:len(good)-4]), 0, 0, 0, 0, 0)),
		"status 99":        reseal(append([]byte("LGRC\x01\x01\x63"), good[8:]...)),
		"count too large":  reseal(append([]byte("LGRC\x01\x01\xc8\x01\xff\xff\xff\xff\x0f"), good[9:]...)),
		"magic":            reseal(append([]byte("LGRX"), good[4:]...)),
	} {
		if e, err := decodeEntry(b); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: decodeEntry = %+v, %v; want errCorrupt", name, e, err)
		}
	}
	for name, nsec := range map[string]uint64{"1e9": 1e9, "max": 1<<64 - 1} {
		b := []byte("LGRC\x01\x04\xc8\x01\x02") // flags created, status 200, 1 s
		b = binary.AppendUvarint(b, nsec)
		b = append(b, 0, 0, 0, 0, 0) // no headers, checksum
		if e, err := decodeEntry(reseal(b)); !errors.Is(err, errCorrupt) {
			t.Errorf("nanoseconds %s: %+v, %v; want errCorrupt", name, e, err)
		}
	}
	ok := reseal([]byte("LGRC\x01\x04\xc8\x01\x02\x05\x00\x00\x00\x00\x00"))
	if e, err := decodeEntry(ok); err != nil || !e.Created.Equal(time.Unix(1, 5)) {
		t.Fatalf("decodeEntry(created 1.000000005) = %+v, %v", e, err)
	}
}

func TestDecodeDoesNotAliasInput(t *testing.T) {
	in := encodeEntry(&Entry{Status: 200, Header: http.Header{"A": {"v"}}, Events: [][]byte{[]byte("data: x\n\n"), []byte("data: [DONE]\n\n")}})
	e, err := decodeEntry(in)
	if err != nil {
		t.Fatal(err)
	}
	want := clone(e)
	for i := range in {
		in[i] = 0
	}
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("the entry changed with its input: %+v", e)
	}
}

// entryFromFuzz builds an entry from fuzz input, covering nil and empty
// headers, bodies, events and values.
func entryFromFuzz(status uint16, flags uint8, sec int64, nsec uint32, hdr, body []byte, events []byte) *Entry {
	e := &Entry{Status: 100 + int(status)%900}
	if flags&1 != 0 {
		e.Created = time.Unix(sec%(1<<40), int64(nsec%1e9))
	}
	if flags&2 != 0 {
		e.Header = http.Header{}
		for i, part := range bytes.Split(hdr, []byte{0}) {
			name, vals, _ := bytes.Cut(part, []byte{'='})
			var vs []string
			if i%2 == 0 || len(vals) > 0 {
				vs = []string{}
				for v := range bytes.SplitSeq(vals, []byte{','}) {
					vs = append(vs, string(v))
				}
			}
			e.Header[string(name)] = vs
		}
	}
	switch flags >> 2 & 3 {
	case 1:
		e.Body = body
	case 2:
		e.Events = [][]byte{}
		if len(events) > 0 {
			e.Events = bytes.Split(events, []byte{0})
		}
	}
	return e
}

func FuzzEntryRoundTrip(f *testing.F) {
	f.Add(uint16(100), uint8(0xff), int64(1700000000), uint32(5), []byte("Content-Type=application/json\x00X=a,b"), []byte(`{"a":1}`), []byte("data: x\n\n\x00data: [DONE]\n\n"))
	f.Add(uint16(0), uint8(0), int64(-1), uint32(0), []byte{}, []byte{}, []byte{})
	f.Add(uint16(899), uint8(0x0b), int64(0), uint32(999999999), []byte("\x00\x00="), []byte(nil), []byte("\x00"))
	f.Fuzz(func(t *testing.T, status uint16, flags uint8, sec int64, nsec uint32, hdr, body, events []byte) {
		e := entryFromFuzz(status, flags, sec, nsec, hdr, body, events)
		b := encodeEntry(e)
		if len(b) != encodedLen(e) {
			t.Fatalf("encodedLen = %d, encoded %d bytes", encodedLen(e), len(b))
		}
		got, err := decodeEntry(b)
		if err != nil {
			t.Fatalf("decodeEntry(encodeEntry(%+v)): %v", e, err)
		}
		if got.Status != e.Status || !got.Created.Equal(e.Created) || got.Created.IsZero() != e.Created.IsZero() {
			t.Fatalf("status/created: got %+v, want %+v", got, e)
		}
		if (got.Body == nil) != (e.Body == nil) || !bytes.Equal(got.Body, e.Body) {
			t.Fatalf("Body = %q, want %q", got.Body, e.Body)
		}
		if (got.Events == nil) != (e.Events == nil) || len(got.Events) != len(e.Events) {
			t.Fatalf("Events = %q, want %q", got.Events, e.Events)
		}
		for i := range e.Events {
			if !bytes.Equal(got.Events[i], e.Events[i]) {
				t.Fatalf("Events[%d] = %q, want %q", i, got.Events[i], e.Events[i])
			}
		}
		if len(got.Header) != len(e.Header) {
			t.Fatalf("Header = %q, want %q", got.Header, e.Header)
		}
		for k, vs := range e.Header {
			g, ok := got.Header[k]
			if !ok || len(g) != len(vs) || (len(vs) > 0 && !reflect.DeepEqual(g, vs)) {
				t.Fatalf("Header[%q] = %q, want %q", k, g, vs)
			}
		}
		if !bytes.Equal(encodeEntry(got), b) {
			t.Fatal("re-encoding the decoded entry changed it")
		}
	})
}

// FuzzDecodeEntry feeds decodeEntry arbitrary values, including valid ones
// with a recomputed checksum, so that the fuzzer gets past the CRC: it
// never panics, and whatever it accepts is a valid entry that re-encodes to
// a value decoding to the same entry.
func FuzzDecodeEntry(f *testing.F) {
	for _, e := range []*Entry{
		{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"a":1}`), Created: time.Unix(1700000000, 1)},
		{Status: 200, Events: [][]byte{[]byte("data: x\n\n"), {}, []byte("data: [DONE]\n\n")}},
		{Status: 599, Body: []byte{}},
		{Status: 100},
	} {
		f.Add(encodeEntry(e), false)
		f.Add(encodeEntry(e)[:len(encodeEntry(e))-crcLen], true)
	}
	f.Add([]byte("LGRC\x01\x00"), true)
	f.Add([]byte{}, false)
	f.Fuzz(func(t *testing.T, b []byte, seal bool) {
		if seal {
			b = binary.BigEndian.AppendUint32(bytes.Clone(b), crc32.Checksum(b, castagnoli))
		}
		e, err := decodeEntry(b)
		if err != nil {
			if !errors.Is(err, errCorrupt) || e != nil {
				t.Fatalf("decodeEntry = %v, %v", e, err)
			}
			return
		}
		if check(e, time.Second) != nil {
			t.Fatalf("decodeEntry accepted an invalid entry %+v", e)
		}
		again, err := decodeEntry(encodeEntry(e))
		if err != nil {
			t.Fatalf("re-decoding: %v", err)
		}
		if !reflect.DeepEqual(normalise(again), normalise(e)) {
			t.Fatalf("re-decoded %+v, want %+v", again, e)
		}
	})
}

// normalise drops what DeepEqual would see but an entry does not mean: the
// capacity of slices and the time zone.
func normalise(e *Entry) *Entry {
	c := clone(e)
	c.Created = c.Created.UTC()
	return c
}

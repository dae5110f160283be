package respcache

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"net/http"
	"sort"
	"time"
)

// The binary form of an Entry, as the Redis backend stores it:
//
//	magic    "LGRC"
//	version  1 byte (codecVersion)
//	flags    1 byte: flagBody, flagEvents, flagCreated; other bits must be 0
//	status   uvarint, 100-999
//	created  if flagCreated: varint Unix seconds, uvarint nanoseconds (< 1e9)
//	header   uvarint count; per name, in strictly increasing order:
//	         uvarint length + name, uvarint count, per value uvarint length + value
//	body     if flagBody: uvarint length + bytes
//	events   if flagEvents: uvarint count; per event uvarint length + bytes
//	crc      CRC-32C (Castagnoli) of everything before it, 4 bytes big-endian
//
// The flags keep a nil body apart from an empty one (and nil events from
// none), so an entry reads back exactly as it was written. Any value that
// does not follow this layout to the last byte is refused by decodeEntry.
const (
	codecMagic   = "LGRC"
	codecVersion = 1

	flagBody    = 1 << 0
	flagEvents  = 1 << 1
	flagCreated = 1 << 2
	flagsKnown  = flagBody | flagEvents | flagCreated

	crcLen = 4
)

// errCorrupt is returned by decodeEntry for any value it cannot read.
var errCorrupt = errors.New("respcache: corrupt or foreign cache value")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sortedNames returns h's names in increasing order.
func sortedNames(h http.Header) []string {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func bytesLen(n int) int { return uvarintLen(uint64(n)) + n }

// encodedLen returns len(encodeEntry(e)) without encoding it.
func encodedLen(e *Entry) int {
	n := len(codecMagic) + 2 + uvarintLen(uint64(e.Status))
	if !e.Created.IsZero() {
		sec := e.Created.Unix()
		n += uvarintLen(uint64(sec<<1)^uint64(sec>>63)) + uvarintLen(uint64(e.Created.Nanosecond())) // zig-zag, as binary.AppendVarint
	}
	n += uvarintLen(uint64(len(e.Header)))
	for name, vs := range e.Header {
		n += bytesLen(len(name)) + uvarintLen(uint64(len(vs)))
		for _, v := range vs {
			n += bytesLen(len(v))
		}
	}
	if e.Body != nil {
		n += bytesLen(len(e.Body))
	}
	if e.Events != nil {
		n += uvarintLen(uint64(len(e.Events)))
		for _, ev := range e.Events {
			n += bytesLen(len(ev))
		}
	}
	return n + crcLen
}

// encodeEntry returns the binary form of a valid entry (see check).
func encodeEntry(e *Entry) []byte {
	b := make([]byte, 0, encodedLen(e))
	b = append(b, codecMagic...)
	var flags byte
	if e.Body != nil {
		flags |= flagBody
	}
	if e.Events != nil {
		flags |= flagEvents
	}
	if !e.Created.IsZero() {
		flags |= flagCreated
	}
	b = append(b, codecVersion, flags)
	b = binary.AppendUvarint(b, uint64(e.Status))
	if !e.Created.IsZero() {
		b = binary.AppendVarint(b, e.Created.Unix())
		b = binary.AppendUvarint(b, uint64(e.Created.Nanosecond()))
	}
	b = binary.AppendUvarint(b, uint64(len(e.Header)))
	for _, name := range sortedNames(e.Header) {
		vs := e.Header[name]
		b = appendBytes(b, name)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendBytes(b, v)
		}
	}
	if e.Body != nil {
		b = appendBytes(b, e.Body)
	}
	if e.Events != nil {
		b = binary.AppendUvarint(b, uint64(len(e.Events)))
		for _, ev := range e.Events {
			b = appendBytes(b, ev)
		}
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func appendBytes[T string | []byte](b []byte, v T) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// decoder reads the fields of an encoded entry; the first failure sticks.
type decoder struct {
	b  []byte
	ok bool
}

func (d *decoder) uvarint() uint64 {
	if !d.ok {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.ok = false
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if !d.ok {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.ok = false
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of items that take at least one byte each, so that a
// corrupt count cannot make the caller allocate more than the value holds.
func (d *decoder) count() int {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.ok = false
		return 0
	}
	return int(n)
}

// bytes reads a length-prefixed byte string; the result aliases the input.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if !d.ok || n > uint64(len(d.b)) {
		d.ok = false
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// decodeEntry parses the binary form of an entry. It never panics and never
// keeps a reference to b: a Redis reply's bytes may be read-only.
func decodeEntry(b []byte) (*Entry, error) {
	if len(b) < len(codecMagic)+2+crcLen || string(b[:len(codecMagic)]) != codecMagic {
		return nil, errCorrupt
	}
	body, sum := b[:len(b)-crcLen], binary.BigEndian.Uint32(b[len(b)-crcLen:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, errCorrupt
	}
	if body[len(codecMagic)] != codecVersion {
		return nil, errCorrupt
	}
	flags := body[len(codecMagic)+1]
	if flags&^flagsKnown != 0 || flags&(flagBody|flagEvents) == flagBody|flagEvents {
		return nil, errCorrupt
	}
	d := &decoder{b: body[len(codecMagic)+2:], ok: true}
	e := &Entry{}
	status := d.uvarint()
	if status < 100 || status > 999 {
		return nil, errCorrupt
	}
	e.Status = int(status)
	if flags&flagCreated != 0 {
		sec, nsec := d.varint(), d.uvarint()
		if !d.ok || nsec >= 1e9 {
			return nil, errCorrupt
		}
		e.Created = time.Unix(sec, int64(nsec)).UTC()
		// A second count time.Time cannot hold wraps around; the zero time
		// is written without flagCreated.
		if e.Created.Unix() != sec || e.Created.IsZero() {
			return nil, errCorrupt
		}
	}
	if n := d.count(); n > 0 {
		e.Header = make(http.Header, n)
		prev := ""
		for i := range n {
			name := string(d.bytes())
			if !d.ok || (i > 0 && name <= prev) {
				return nil, errCorrupt
			}
			prev = name
			vs := make([]string, d.count())
			for j := range vs {
				vs[j] = string(d.bytes())
			}
			if len(vs) == 0 {
				vs = nil
			}
			e.Header[name] = vs
		}
	}
	var raw [][]byte // body and events, aliasing b until copied below
	size := 0
	if flags&flagBody != 0 {
		v := d.bytes()
		raw = append(raw, v)
		size += len(v)
	}
	if flags&flagEvents != 0 {
		n := d.count()
		for range n {
			v := d.bytes()
			raw = append(raw, v)
			size += len(v)
		}
	}
	if !d.ok || len(d.b) != 0 {
		return nil, errCorrupt
	}
	buf := make([]byte, 0, size)
	cp := func(v []byte) []byte {
		start := len(buf)
		buf = append(buf, v...)
		return buf[start:len(buf):len(buf)]
	}
	if flags&flagBody != 0 {
		e.Body, raw = cp(raw[0]), raw[1:]
	}
	if flags&flagEvents != 0 {
		e.Events = make([][]byte, len(raw))
		for i, v := range raw {
			e.Events[i] = cp(v)
		}
	}
	return e, nil
}

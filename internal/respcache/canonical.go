package respcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds how deeply arrays and objects may nest in a body that
// Canonical accepts; it is encoding/json's own bound.
const MaxDepth = 10000

// keyVersion starts every hashed key: changing what a key covers (the
// dropped fields, the canonical form) must change this, so that old entries
// become unreachable instead of being served for requests they do not match.
const keyVersion = "llmgate-respcache-v1\x00"

// volatileFields are the top-level request fields Key leaves out: none of
// them changes the answer. "stream" is replaced by Key's stream flag, which
// also covers a body that says nothing about streaming; "user",
// "safety_identifier" and "prompt_cache_key" only label the request for the
// provider's abuse monitoring and prompt caching. Everything else, including
// "n", "seed", "stream_options" (which adds a usage chunk to a stream),
// "metadata" and "store" (which ask for a side effect), is part of the key.
var volatileFields = []string{"stream", "user", "safety_identifier", "prompt_cache_key"}

// Canonical returns the canonical JSON form of a request body, so that two
// bodies a JSON parser reads as the same value canonicalise to the same
// bytes:
//   - insignificant whitespace is removed;
//   - object members are sorted by the bytes of their canonical key (UTF-8
//     after the string escaping below), recursively;
//   - a duplicate key keeps its last value, as encoding/json and the
//     providers' parsers (Python's json) do;
//   - strings are re-encoded in one escaping: `\"`, `\\`, \b \f \n \r \t,
//     other control characters as lower-case \u00XX, everything else as
//     literal UTF-8 ("\u00e9" and "é" are the same string);
//   - numbers are kept as written (1, 1.0 and 1e0 stay different: merging
//     them is only safe for a parser that reads them all as one float).
//
// A body that is not one strict JSON value returns an error wrapping
// ErrInvalidJSON: bad syntax, trailing data, invalid UTF-8, an unpaired
// surrogate escape, or nesting deeper than MaxDepth. Encoding/json would
// read invalid UTF-8 and unpaired surrogates as U+FFFD, merging strings
// that other parsers keep apart, so a canonical form for them could map two
// different requests to one key.
func Canonical(body []byte) ([]byte, error) {
	c := canonPool.Get().(*canonicalizer)
	defer c.release()
	// The canonical form is never longer than the input.
	out, err := c.run(make([]byte, 0, len(body)), body, false)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Key returns the cache key of a request: the hex SHA-256 of scope, model,
// the stream flag and the canonical JSON of the body without the top-level
// fields that do not change the answer ("stream", "user",
// "safety_identifier", "prompt_cache_key"). Bodies that differ only in
// formatting, member order or those fields have the same key; a different
// scope, model or stream flag gives a different key, so a stream is only
// ever replayed to a stream. An error (wrapping ErrInvalidJSON) means the
// body is not cacheable.
func Key(scope, model string, body []byte, stream bool) (string, error) {
	c := canonPool.Get().(*canonicalizer)
	defer c.release()
	out := append(c.buf[:0], keyVersion...)
	out = binary.AppendUvarint(out, uint64(len(scope)))
	out = append(out, scope...)
	out = binary.AppendUvarint(out, uint64(len(model)))
	out = append(out, model...)
	if stream {
		out = append(out, 1)
	} else {
		out = append(out, 0)
	}
	out, err := c.run(out, body, true)
	c.buf = out
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(out)
	var digits [2 * sha256.Size]byte
	hex.Encode(digits[:], sum[:])
	return string(digits[:]), nil
}

var canonPool = sync.Pool{New: func() any { return new(canonicalizer) }}

// maxPooled bounds the buffers a pooled canonicalizer keeps, so that one
// huge body does not pin its memory for the life of the process.
const maxPooled = 64 << 10

// canonicalizer writes the canonical form of one JSON text. The output
// buffer is passed and returned by every method instead of living in a
// field: appending to a field of this heap object would cost a GC write
// barrier per append.
type canonicalizer struct {
	in      []byte
	i       int      // read offset in in
	members []member // object members being written, a stack shared by nesting levels
	scratch []byte   // a copy of an object's members while they are reordered
	buf     []byte   // Key's output buffer, kept between uses
	depth   int
	drop    bool // leave out volatileFields at the top level
}

// member locates one object member in the output.
type member struct {
	start  int // offset of the key's opening quote
	keyEnd int // offset of the key's closing quote
	end    int // offset just past the value
}

func (c *canonicalizer) release() {
	c.in = nil
	c.members = c.members[:0]
	if cap(c.scratch) > maxPooled {
		c.scratch = nil
	}
	if cap(c.buf) > maxPooled {
		c.buf = nil
	}
	if cap(c.members) > maxPooled/16 {
		c.members = nil
	}
	canonPool.Put(c)
}

// run appends the canonical form of in to out.
func (c *canonicalizer) run(out, in []byte, drop bool) ([]byte, error) {
	c.in, c.i, c.depth, c.drop = in, 0, 0, drop
	c.skipSpace()
	out, err := c.value(out)
	if err != nil {
		return out, err
	}
	c.skipSpace()
	if c.i != len(c.in) {
		return out, c.fail("data after the top-level value")
	}
	return out, nil
}

func (c *canonicalizer) fail(what string) error {
	return fmt.Errorf("%w: %s at offset %d", ErrInvalidJSON, what, c.i)
}

func (c *canonicalizer) skipSpace() {
	for c.i < len(c.in) {
		switch c.in[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

func (c *canonicalizer) value(out []byte) ([]byte, error) {
	if c.i >= len(c.in) {
		return out, c.fail("unexpected end")
	}
	switch b := c.in[c.i]; {
	case b == '{':
		return c.object(out)
	case b == '[':
		return c.array(out)
	case b == '"':
		return c.string(out)
	case b == '-' || (b >= '0' && b <= '9'):
		return c.number(out)
	case b == 't':
		return c.literal(out, "true")
	case b == 'f':
		return c.literal(out, "false")
	case b == 'n':
		return c.literal(out, "null")
	default:
		return out, c.fail(fmt.Sprintf("unexpected character %q", b))
	}
}

func (c *canonicalizer) literal(out []byte, lit string) ([]byte, error) {
	if !bytes.HasPrefix(c.in[c.i:], []byte(lit)) {
		return out, c.fail("invalid literal")
	}
	c.i += len(lit)
	return append(out, lit...), nil
}

// number checks the number grammar and copies the number as written.
func (c *canonicalizer) number(out []byte) ([]byte, error) {
	in, start := c.in, c.i
	i := c.i
	if in[i] == '-' {
		i++
	}
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && in[i] >= '1' && in[i] <= '9':
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
	default:
		c.i = i
		return out, c.fail("invalid number")
	}
	if i < len(in) && in[i] == '.' {
		i++
		if i >= len(in) || in[i] < '0' || in[i] > '9' {
			c.i = i
			return out, c.fail("invalid number")
		}
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		if i >= len(in) || in[i] < '0' || in[i] > '9' {
			c.i = i
			return out, c.fail("invalid number")
		}
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
	}
	c.i = i
	return append(out, in[start:i]...), nil
}

func (c *canonicalizer) array(out []byte) ([]byte, error) {
	if c.depth++; c.depth > MaxDepth {
		return out, c.fail("nested too deeply")
	}
	c.i++ // [
	out = append(out, '[')
	c.skipSpace()
	if c.i < len(c.in) && c.in[c.i] == ']' {
		c.i++
		c.depth--
		return append(out, ']'), nil
	}
	for {
		c.skipSpace()
		var err error
		if out, err = c.value(out); err != nil {
			return out, err
		}
		c.skipSpace()
		if c.i >= len(c.in) {
			return out, c.fail("unexpected end in array")
		}
		switch c.in[c.i] {
		case ',':
			c.i++
			out = append(out, ',')
		case ']':
			c.i++
			c.depth--
			return append(out, ']'), nil
		default:
			return out, c.fail("expected , or ] in array")
		}
	}
}

func (c *canonicalizer) object(out []byte) ([]byte, error) {
	if c.depth++; c.depth > MaxDepth {
		return out, c.fail("nested too deeply")
	}
	c.i++ // {
	out = append(out, '{')
	base := len(c.members)
	c.skipSpace()
	if c.i < len(c.in) && c.in[c.i] == '}' {
		c.i++
		c.depth--
		return append(out, '}'), nil
	}
	for {
		c.skipSpace()
		if c.i >= len(c.in) || c.in[c.i] != '"' {
			return out, c.fail("expected a string key in object")
		}
		comma := len(out)
		if len(c.members) > base {
			out = append(out, ',')
		}
		start := len(out)
		var err error
		if out, err = c.string(out); err != nil {
			return out, err
		}
		keyEnd := len(out) - 1
		c.skipSpace()
		if c.i >= len(c.in) || c.in[c.i] != ':' {
			return out, c.fail("expected : after object key")
		}
		c.i++
		out = append(out, ':')
		c.skipSpace()
		if out, err = c.value(out); err != nil {
			return out, err
		}
		if c.drop && c.depth == 1 && volatile(out[start+1:keyEnd]) {
			out = out[:comma]
		} else {
			c.members = append(c.members, member{start: start, keyEnd: keyEnd, end: len(out)})
		}
		c.skipSpace()
		if c.i >= len(c.in) {
			return out, c.fail("unexpected end in object")
		}
		if c.in[c.i] == ',' {
			c.i++
			continue
		}
		if c.in[c.i] != '}' {
			return out, c.fail("expected , or } in object")
		}
		c.i++
		break
	}
	out = c.sortMembers(out, c.members[base:])
	c.members = c.members[:base]
	c.depth--
	return append(out, '}'), nil
}

func volatile(key []byte) bool {
	for _, f := range volatileFields {
		if string(key) == f {
			return true
		}
	}
	return false
}

// sortMembers rewrites the members ms, the last thing written to out, in
// key order, keeping only the last of duplicate keys. Members already in
// strictly increasing order are left alone: most objects need no copy.
func (c *canonicalizer) sortMembers(out []byte, ms []member) []byte {
	key := func(m member) []byte { return out[m.start+1 : m.keyEnd] }
	ordered := true
	for k := 1; k < len(ms) && ordered; k++ {
		ordered = bytes.Compare(key(ms[k-1]), key(ms[k])) < 0
	}
	if ordered {
		return out
	}
	off := ms[0].start
	scratch := append(c.scratch[:0], out[off:]...)
	c.scratch = scratch
	// Stable, so that among equal keys the last written is the last here.
	slices.SortStableFunc(ms, func(a, b member) int { return bytes.Compare(key(a), key(b)) })
	skey := func(m member) []byte { return scratch[m.start+1-off : m.keyEnd-off] }
	out = out[:off]
	for k, m := range ms {
		if k+1 < len(ms) && bytes.Equal(skey(m), skey(ms[k+1])) {
			continue // a later duplicate wins
		}
		if len(out) > off {
			out = append(out, ',')
		}
		out = append(out, scratch[m.start-off:m.end-off]...)
	}
	return out
}

// plain marks the ASCII bytes a string carries as they are.
var plain = func() (t [256]bool) {
	for b := 0x20; b < 0x80; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// special8 reports whether any of the eight bytes in x is a quote, a
// backslash, a control character or not ASCII (the classic "has a zero
// byte" bit tricks: exact for "any", which is all this needs).
func special8(x uint64) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	q, b := x^(lo*'"'), x^(lo*'\\')
	return ((q-lo)&^q|(b-lo)&^b|(x-lo*0x20)|x)&hi != 0
}

// string re-encodes a string in the canonical escaping.
func (c *canonicalizer) string(out []byte) ([]byte, error) {
	in := c.in
	i := c.i + 1 // past the opening quote
	out = append(out, '"')
	run := i // start of bytes not yet copied
	for {
		// Eight bytes at a time while none needs a look: most of a chat
		// body is plain ASCII text.
		for i+8 <= len(in) && !special8(binary.LittleEndian.Uint64(in[i:])) {
			i += 8
		}
		for i < len(in) && plain[in[i]] {
			i++
		}
		if i >= len(in) {
			c.i = i
			return out, c.fail("unterminated string")
		}
		switch b := in[i]; {
		case b == '"':
			c.i = i + 1
			out = append(out, in[run:i]...)
			return append(out, '"'), nil
		case b == '\\':
			out = append(out, in[run:i]...)
			c.i = i
			var err error
			if out, err = c.escape(out); err != nil {
				return out, err
			}
			i, run = c.i, c.i
		case b < 0x20:
			c.i = i
			return out, c.fail("control character in string")
		default:
			r, size := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && size <= 1 {
				c.i = i
				return out, c.fail("invalid UTF-8 in string")
			}
			i += size
		}
	}
}

// escape decodes the escape sequence at c.i and writes its character in the
// canonical escaping.
func (c *canonicalizer) escape(out []byte) ([]byte, error) {
	in := c.in
	if c.i+1 >= len(in) {
		return out, c.fail("unterminated escape")
	}
	var r rune
	switch in[c.i+1] {
	case '"', '\\', '/':
		r = rune(in[c.i+1])
	case 'b':
		r = '\b'
	case 'f':
		r = '\f'
	case 'n':
		r = '\n'
	case 'r':
		r = '\r'
	case 't':
		r = '\t'
	case 'u':
		r = hex4(in[c.i+2:])
		if r < 0 {
			return out, c.fail("invalid \\u escape")
		}
		switch {
		case utf16.IsSurrogate(r) && r < 0xdc00:
			lo := rune(-1)
			if c.i+7 < len(in) && in[c.i+6] == '\\' && in[c.i+7] == 'u' {
				lo = hex4(in[c.i+8:])
			}
			if lo < 0xdc00 || lo > 0xdfff {
				return out, c.fail("unpaired surrogate escape")
			}
			r = utf16.DecodeRune(r, lo)
			c.i += 6
		case utf16.IsSurrogate(r):
			return out, c.fail("unpaired surrogate escape")
		}
		c.i += 4
	default:
		return out, c.fail("invalid escape")
	}
	c.i += 2
	return appendRune(out, r), nil
}

// hex4 parses four hex digits, or returns -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, x := range b[:4] {
		switch {
		case x >= '0' && x <= '9':
			x -= '0'
		case x >= 'a' && x <= 'f':
			x -= 'a' - 10
		case x >= 'A' && x <= 'F':
			x -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(x)
	}
	return r
}

const hexDigits = "0123456789abcdef"

// appendRune writes r in the canonical string escaping.
func appendRune(out []byte, r rune) []byte {
	switch r {
	case '"':
		return append(out, '\\', '"')
	case '\\':
		return append(out, '\\', '\\')
	case '\b':
		return append(out, '\\', 'b')
	case '\f':
		return append(out, '\\', 'f')
	case '\n':
		return append(out, '\\', 'n')
	case '\r':
		return append(out, '\\', 'r')
	case '\t':
		return append(out, '\\', 't')
	}
	if r < 0x20 {
		return append(out, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
	}
	return utf8.AppendRune(out, r)
}

package respcache_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/llmgate/llmgate/internal/respcache"
)

// node is a JSON value for the formatting property test.
type node struct {
	kind  byte // 'o' object, 'a' array, 's' string, 'n' number, 'l' literal
	text  string
	keys  []string
	elems []*node
}

var sampleText = []string{"", "a", "role", "content", "héllo wörld", "emoji 😀", "tab\there", "quote\"back\\slash/", "\x01ctl\x1f", "line\nbreak", "中文", "\u2028"}

func genNode(rng *rand.Rand, depth int) *node {
	k := rng.IntN(5)
	if depth > 3 {
		k = 2 + rng.IntN(3)
	}
	switch k {
	case 0:
		n := &node{kind: 'o'}
		seen := map[string]bool{}
		for range rng.IntN(5) {
			key := sampleText[rng.IntN(len(sampleText))] + fmt.Sprint(rng.IntN(3))
			if seen[key] {
				continue
			}
			seen[key] = true
			n.keys = append(n.keys, key)
			n.elems = append(n.elems, genNode(rng, depth+1))
		}
		return n
	case 1:
		n := &node{kind: 'a'}
		for range rng.IntN(4) {
			n.elems = append(n.elems, genNode(rng, depth+1))
		}
		return n
	case 2:
		return &node{kind: 's', text: sampleText[rng.IntN(len(sampleText))]}
	case 3:
		return &node{kind: 'n', text: []string{"0", "-1", "1.0", "1e3", "2.5E-7", "12345678901234567890"}[rng.IntN(6)]}
	default:
		return &node{kind: 'l', text: []string{"true", "false", "null"}[rng.IntN(3)]}
	}
}

// render writes n with random whitespace, member order and string escaping.
func render(rng *rand.Rand, b *strings.Builder, n *node) {
	ws := func() { b.WriteString([]string{"", "", " ", "\n  ", "\t", "\r\n"}[rng.IntN(6)]) }
	switch n.kind {
	case 'o':
		b.WriteByte('{')
		for i, j := range rng.Perm(len(n.keys)) {
			if i > 0 {
				b.WriteByte(',')
			}
			ws()
			renderString(rng, b, n.keys[j])
			ws()
			b.WriteByte(':')
			ws()
			render(rng, b, n.elems[j])
			ws()
		}
		b.WriteByte('}')
	case 'a':
		b.WriteByte('[')
		for i, e := range n.elems {
			if i > 0 {
				b.WriteByte(',')
			}
			ws()
			render(rng, b, e)
			ws()
		}
		b.WriteByte(']')
	case 's':
		renderString(rng, b, n.text)
	default:
		b.WriteString(n.text)
	}
}

// renderString writes s as a JSON string, each character in one of the
// spellings JSON allows for it.
func renderString(rng *rand.Rand, b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		short := map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}[r]
		switch {
		case short != "" && (r < 0x20 || r == '"' || r == '\\' || rng.IntN(2) == 0):
			b.WriteString(short)
		case r < 0x20 || rng.IntN(4) == 0:
			if r > 0xffff {
				r1, r2 := utf16Pair(r)
				fmt.Fprintf(b, `\u%04X\u%04x`, r1, r2)
			} else if rng.IntN(2) == 0 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				fmt.Fprintf(b, `\u%04X`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + r>>10, 0xdc00 + r&0x3ff
}

// TestCanonicalAnyFormatting renders random values in many ways and checks
// they canonicalise, and key, identically.
func TestCanonicalAnyFormatting(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		n := genNode(rng, 0)
		var first []byte
		var firstKey string
		for v := range 4 {
			var b strings.Builder
			render(rng, &b, n)
			in := []byte(b.String())
			got, err := respcache.Canonical(in)
			if err != nil {
				t.Fatalf("Canonical(%q): %v", in, err)
			}
			if !utf8.Valid(got) {
				t.Fatalf("Canonical(%q) is not UTF-8", in)
			}
			key, err := respcache.Key("s", "m", in, false)
			if err != nil {
				t.Fatal(err)
			}
			if v == 0 {
				first, firstKey = got, key
				checkCanonicalProperties(t, in, got)
				continue
			}
			if !bytes.Equal(got, first) || key != firstKey {
				t.Fatalf("two spellings of one value canonicalise differently:\n%q -> %q\nfirst -> %q", in, got, first)
			}
		}
	}
}

package tokens

import (
	"bytes"
	"compress/gzip"
	"flag"
	"os"
	"slices"
	"testing"
)

// newRankTable builds a table from tokens, indexed by ID ("" for an ID
// with no token).
func newRankTable(tokens []string) *rankTable {
	var data []byte
	offs := []uint32{0}
	for _, s := range tokens {
		data = append(data, s...)
		offs = append(offs, uint32(len(data)))
	}
	return indexRanks(data, offs)
}

// len returns the number of tokens (for the tests).
func (t *rankTable) len() int {
	n := 0
	for _, v := range t.slots {
		if v != 0 {
			n++
		}
	}
	return n
}

func TestRankTableSmall(t *testing.T) {
	tab := newRankTable([]string{"a", "", "bc", "a", "abc"})
	for s, want := range map[string]uint32{"a": 0, "bc": 2, "abc": 4} {
		if got, ok := tab.rank(s); !ok || got != want {
			t.Errorf("rank(%q) = %d, %v; want %d, true", s, got, ok, want)
		}
	}
	for _, s := range []string{"", "b", "ab", "abcd", "c"} {
		if got, ok := tab.rank(s); ok {
			t.Errorf("rank(%q) = %d, true; want a miss", s, got)
		}
	}
	if n := tab.len(); n != 3 {
		t.Errorf("len = %d, want 3 (the repeated token is kept once)", n)
	}
}

var updateVocab = flag.Bool("update-vocab", false, "rewrite vocab/*.gz from github.com/tiktoken-go/tokenizer")

// codecTokens lists the tokens of e's codec by ID ("" where an ID has
// none), up to the last.
func codecTokens(t *testing.T, e *encoding) []string {
	c := codecOf(t, e)
	var toks []string
	for id, misses := uint(0), 0; misses < 1024; id++ { // IDs are dense; past the last, stop
		s, err := c.Decode([]uint{id})
		if err != nil {
			s = ""
		}
		if s == "" {
			misses++
		} else {
			misses = 0
		}
		toks = append(toks, s)
	}
	for len(toks) > 0 && toks[len(toks)-1] == "" {
		toks = toks[:len(toks)-1]
	}
	return toks
}

// TestVocabFiles checks the embedded vocabularies token by token against
// the codec's, and the rank table built from them: every token has its
// ID, strings next to tokens miss as they should. With -update-vocab it
// rewrites the files first.
func TestVocabFiles(t *testing.T) {
	for _, tc := range []struct {
		e    *encoding
		file string
		data *[]byte
	}{{o200k, "vocab/o200k_base.gz", &o200kVocab}, {cl100k, "vocab/cl100k_base.gz", &cl100kVocab}} {
		t.Run(tc.e.name, func(t *testing.T) {
			toks := codecTokens(t, tc.e)
			if len(toks) < 100_000 {
				t.Fatalf("only %d token IDs read from the codec", len(toks))
			}
			if *updateVocab {
				var b bytes.Buffer
				if err := writeVocab(&b, tc.e.name, toks); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(tc.file, b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				*tc.data = b.Bytes()
			}
			data, offs, err := readVocab(*tc.data, tc.e.name)
			if err != nil {
				t.Fatal(err)
			}
			if len(offs)-1 != len(toks) {
				t.Fatalf("%s holds %d token IDs, the codec %d (rerun with -update-vocab)", tc.file, len(offs)-1, len(toks))
			}
			want := map[string]uint32{}
			for id, s := range toks {
				if got := string(data[offs[id]:offs[id+1]]); got != s {
					t.Fatalf("%s: token %d is %q, the codec's %q (rerun with -update-vocab)", tc.file, id, got, s)
				}
				if _, dup := want[s]; s != "" && !dup {
					want[s] = uint32(id)
				}
			}
			tab := indexRanks(data, offs)
			if n := tab.len(); n != len(want) {
				t.Errorf("table holds %d tokens, the codec %d", n, len(want))
			}
			for s, id := range want {
				if got, ok := tab.rank(s); !ok || got != id {
					t.Fatalf("rank(%q) = %d, %v; want %d", s, got, ok, id)
				}
				for _, near := range []string{s + "\x00", "\x00" + s, s[:len(s)-1]} {
					got, ok := tab.rank(near)
					wantID, wantOK := want[near]
					if ok != wantOK || got != wantID {
						t.Fatalf("rank(%q) = %d, %v; want %d, %v", near, got, ok, wantID, wantOK)
					}
				}
			}
		})
	}
}

func TestReadVocabRejects(t *testing.T) {
	var good bytes.Buffer
	if err := writeVocab(&good, "x", []string{"a", "", "bc"}); err != nil {
		t.Fatal(err)
	}
	data, offs, err := readVocab(good.Bytes(), "x")
	if err != nil || string(data) != "abc" || !slices.Equal(offs, []uint32{0, 1, 1, 3}) {
		t.Fatalf("readVocab = %q, %v, %v", data, offs, err)
	}
	if _, _, err := readVocab(good.Bytes(), "y"); err == nil {
		t.Error("a file of another encoding was accepted")
	}
	raw := func(s string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write([]byte(s))
		zw.Close()
		return b.Bytes()
	}
	for name, file := range map[string][]byte{
		"not gzip":   []byte("llmgate-vocab-1 x\n"),
		"no header":  raw("\x01a"),
		"cut short":  raw(vocabMagic + "x\n\x05ab"),
		"no tokens":  raw(vocabMagic + "x\n"),
		"bad varint": raw(vocabMagic + "x\n\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"),
	} {
		if _, _, err := readVocab(file, "x"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzReadVocab(f *testing.F) {
	var good bytes.Buffer
	_ = writeVocab(&good, "x", []string{"a", "", "bc"})
	f.Add(good.Bytes())
	f.Add(o200kVocab[:64])
	f.Fuzz(func(t *testing.T, file []byte) {
		data, offs, err := readVocab(file, "x")
		if err != nil {
			return
		}
		if len(offs) < 2 || offs[0] != 0 || int(offs[len(offs)-1]) != len(data) {
			t.Fatalf("offsets %v do not span the %d bytes", offs, len(data))
		}
		for i := 1; i < len(offs); i++ {
			if offs[i] < offs[i-1] {
				t.Fatalf("offsets go back: %v", offs)
			}
		}
		tab := indexRanks(data, offs)
		for id := range len(offs) - 1 {
			tok := data[offs[id]:offs[id+1]]
			if len(tok) == 0 {
				continue
			}
			if got, ok := tab.rank(string(tok)); !ok || got > uint32(id) {
				t.Fatalf("token %d %q: rank %d, %v", id, tok, got, ok)
			}
		}
	})
}

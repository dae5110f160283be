// Package tokens estimates OpenAI token counts offline, with the real BPE vocabularies compiled in.
//
// Text counts a string in a model's encoding (o200k_base or cl100k_base,
// embedded in the binary: nothing is downloaded at run time). Chat
// estimates the prompt_tokens OpenAI bills for a chat completion request:
// its messages in the chat format, plus the function definitions rendered
// the way OpenAI renders them into the prompt. Input counts an embeddings
// input or a legacy completions prompt.
//
// The functions never fail and never panic: input they cannot read is
// counted as the tokens of its raw bytes, which is what a caller reserving
// rate-limit capacity wants. Encodings load once, on first use (Warm loads
// both ahead), and are shared by all goroutines. Text is cut into pieces by
// a hand-written pre-tokenizer (split.go) and merged over rank tables that
// hold no pointers (ranks.go); github.com/tiktoken-go/tokenizer, whose
// vocabularies ours are checked against, is the tests' reference.
package tokens

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"
	"unicode/utf8"
)

// encoding is one BPE vocabulary, loaded on first use.
type encoding struct {
	name    string // as tiktoken names it
	counter func() *counter
}

func newEncoding(name string, vocab []byte, split func(string, int) int) *encoding {
	return &encoding{name: name, counter: sync.OnceValue(func() *counter {
		data, offs, err := readVocab(vocab, name)
		if err != nil {
			// Cannot happen with the files TestVocabFiles checks; count
			// bytes rather than fail.
			return nil
		}
		return &counter{split: split, ranks: indexRanks(data, offs)}
	})}
}

var (
	o200k  = newEncoding("o200k_base", o200kVocab, splitO200k)
	cl100k = newEncoding("cl100k_base", cl100kVocab, splitCL100k)
)

// encodingFor picks the encoding OpenAI uses for model: cl100k_base for the
// GPT-4 (not 4o / 4.1 / 4.5), GPT-3.5 and older embedding models,
// o200k_base for everything else, including unknown and non-OpenAI models
// (the newest encoding is the best guess for a model nobody has told us
// about).
func encodingFor(model string) *encoding {
	if usesCL100k(baseModel(model)) {
		return cl100k
	}
	return o200k
}

// baseModel reduces a model name to OpenAI's base name: lower case, without
// a provider prefix ("openai/gpt-4o", "azure/gpt-4o") and without the
// fine-tune wrapper ("ft:gpt-4o-mini-2024-07-18:org::id").
func baseModel(model string) string {
	m := strings.ToLower(strings.TrimSpace(model))
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:]
	}
	if rest, ok := strings.CutPrefix(m, "ft:"); ok {
		m, _, _ = strings.Cut(rest, ":")
	}
	return m
}

func usesCL100k(m string) bool {
	switch {
	case strings.HasPrefix(m, "gpt-4o"), strings.HasPrefix(m, "gpt-4.1"), strings.HasPrefix(m, "gpt-4.5"):
		return false
	case m == "gpt-4", strings.HasPrefix(m, "gpt-4-"):
		return true
	case strings.HasPrefix(m, "gpt-3.5"), strings.HasPrefix(m, "gpt-35"):
		return true
	case strings.HasPrefix(m, "text-embedding-3"), strings.HasPrefix(m, "text-embedding-ada-002"):
		return true
	case m == "davinci-002", m == "babbage-002":
		return true
	}
	return false
}

// Warm loads both encodings now, so that the first request to count text
// does not wait for them.
func Warm() {
	o200k.counter()
	cl100k.counter()
}

// Text returns the number of tokens of s in model's encoding.
func Text(model, s string) int {
	return encodingFor(model).count(s)
}

// Guard against the cost of pathological text. The BPE merge of one
// pre-tokenizer piece is O(n log n) in the piece's length, so a 4 MiB
// "word" (a base64 blob, a run of one character) costs several times more
// per byte than prose. Runs longer than maxRun bytes of non-space, or of
// space, are therefore counted in chunks of chunkBytes: linear time, and a
// token or two of error per chunk (under 1% for base64, 0% for runs of one
// character, whose tokens divide the chunk size). Measured on 4 MiB
// (BenchmarkText4MB): one letter 0.36 s, random letters 0.68 s, prose
// 0.044 s.
const (
	maxRun     = 1024
	chunkBytes = 256
)

// Counts are memoised: a chat client resends the whole conversation, the
// system prompt and the tool definitions with every request, so most of a
// request's text was counted moments ago. The memo is a fixed array of
// slots indexed by a seeded 64-bit hash (an attacker cannot choose
// collisions; a chance collision is 2^-64 per lookup and costs an estimate
// its accuracy, nothing else). A slot holds the last string that hashed to
// it: no eviction policy, no lock, bounded memory.
const (
	memoSlots    = 1 << 13
	memoMinBytes = 16 // shorter strings cost little to count and would churn the memo
)

type memoKind uint8

const (
	memoText memoKind = iota
	memoTools
)

type memoEntry struct {
	enc  *encoding
	kind memoKind
	hash uint64
	size int
	n    int
}

var (
	memo     [memoSlots]atomic.Pointer[memoEntry]
	memoSeed = maphash.MakeSeed()
)

func memoGet(e *encoding, kind memoKind, h uint64, size int) (int, bool) {
	m := memo[h%memoSlots].Load()
	if m != nil && m.hash == h && m.size == size && m.enc == e && m.kind == kind {
		return m.n, true
	}
	return 0, false
}

func memoPut(e *encoding, kind memoKind, h uint64, size, n int) {
	memo[h%memoSlots].Store(&memoEntry{enc: e, kind: kind, hash: h, size: size, n: n})
}

// count returns the tokens of s, never failing.
func (e *encoding) count(s string) int {
	if len(s) < memoMinBytes {
		if n, ok := roleTokens[s]; ok {
			return n
		}
		return e.countUncached(s)
	}
	h := maphash.String(memoSeed, s)
	if n, ok := memoGet(e, memoText, h, len(s)); ok {
		return n
	}
	n := e.countUncached(s)
	memoPut(e, memoText, h, len(s), n)
	return n
}

// countBytes is count for text held as bytes: a memoised count costs no
// copy of it.
func (e *encoding) countBytes(b []byte) int {
	if len(b) < memoMinBytes {
		return e.count(string(b))
	}
	h := maphash.Bytes(memoSeed, b) // equal to maphash.String of the same text
	if n, ok := memoGet(e, memoText, h, len(b)); ok {
		return n
	}
	n := e.countUncached(string(b))
	memoPut(e, memoText, h, len(b), n)
	return n
}

// roleTokens holds strings that are one token in both encodings and occur
// in every message.
var roleTokens = map[string]int{"": 0, "system": 1, "developer": 1, "user": 1, "assistant": 1, "tool": 1, "function": 1}

// countUncached counts s with the BPE, falling back to one token per 4
// bytes if the encoding is missing.
func (e *encoding) countUncached(s string) int {
	if s == "" {
		return 0
	}
	c := e.counter()
	if c == nil {
		return (len(s) + 3) / 4
	}
	if len(s) <= maxRun {
		return countText(c, s)
	}
	n := 0
	pending := 0 // start of the text not yet counted
	runStart, runSpace := 0, isSpaceAt(s, 0)
	for i := 0; i <= len(s); {
		var sp bool
		size := 1
		if i < len(s) {
			sp, size = classify(s[i:])
		}
		if i == len(s) || sp != runSpace {
			if i-runStart > maxRun {
				n += countText(c, s[pending:runStart])
				n += countChunked(c, s[runStart:i])
				pending = i
			}
			runStart, runSpace = i, sp
		}
		i += size
	}
	return n + countText(c, s[pending:])
}

// countChunked counts a long run in chunks of about chunkBytes, cut on
// rune boundaries.
func countChunked(c *counter, run string) int {
	n := 0
	for len(run) > 0 {
		end := min(chunkBytes, len(run))
		for end < len(run) && !utf8.RuneStart(run[end]) {
			end++
		}
		n += countText(c, run[:end])
		run = run[end:]
	}
	return n
}

// countText counts s with c. The text is untrusted request content: should
// the counter ever panic on some input, the request is still counted, at
// one token per 4 bytes, rather than lost.
func countText(c *counter, s string) (n int) {
	defer func() {
		if recover() != nil {
			n = (len(s) + 3) / 4
		}
	}()
	return c.count(s)
}

func isSpaceAt(s string, i int) bool {
	if i >= len(s) {
		return false
	}
	sp, _ := classify(s[i:])
	return sp
}

// classify reports whether s starts with white space, and the length of
// its first rune (1 for an invalid byte).
func classify(s string) (space bool, size int) {
	b := s[0]
	if b < utf8.RuneSelf {
		return b == ' ' || b == '\n' || b == '\t' || b == '\r' || b == '\v' || b == '\f', 1
	}
	r, size := utf8.DecodeRuneInString(s)
	return unicode.IsSpace(r), size
}

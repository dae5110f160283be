package tokens

import (
	"slices"
	"strings"
	"testing"

	"github.com/dlclark/regexp2/v2"
	"github.com/tiktoken-go/tokenizer"
)

// The expressions OpenAI defines the pre-tokenizers by. The dependency
// registers generated matchers for them with regexp2, which Compile uses
// for these exact strings; wrapped in (?:...), they run on regexp2's
// interpreter instead. The interpreter is the reference: the generated
// matcher cuts some runs of white space elsewhere than a backtracking
// engine (and OpenAI's tokenizer) does ("x\n \n": "\n", " \n" instead of
// "\n \n"), and skips some characters, uncounted (" \x7f": " "); see
// TestGeneratedMatcherDiffers.
const (
	o200kExpr  = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	cl100kExpr = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

var (
	o200kPattern    = regexp2.MustCompile(`(?:`+o200kExpr+`)`, regexp2.None)
	cl100kPattern   = regexp2.MustCompile(`(?:`+cl100kExpr+`)`, regexp2.None)
	o200kGenerated  = regexp2.MustCompile(o200kExpr, regexp2.None)
	cl100kGenerated = regexp2.MustCompile(cl100kExpr, regexp2.None)
)

func referencePieces(t testing.TB, re *regexp2.Regexp, s string) []string {
	var pieces []string
	m, err := re.FindStringMatch(s)
	for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
		pieces = append(pieces, m.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	return pieces
}

func splitPieces(split func(string, int) int, s string) []string {
	s = validText(s)
	var pieces []string
	for p := 0; p < len(s); {
		end := split(s, p)
		pieces = append(pieces, s[p:end])
		p = end
	}
	return pieces
}

// splitSeeds are texts that exercise each alternative of the expressions.
var splitSeeds = []string{
	"Hello, world! It's 2026 and we're here.\n\nNew paragraph:\ttabs  and   spaces ",
	"I'M SHOUTING, THEY'RE LOUD; don'T 'Sup 'LL 'd 'x",
	"camelCaseWords and HTTPServer, XMLHttpRequest; ALLCAPS",
	"1234567 12.5 ٣٤٥ Ⅻ ½ 3rd",
	"path/to/file.go\r\n/* comment */\n\n\n  indented\n \n",
	"   leading spaces\n\t\n  trailing   ",
	"é (e\u0301) ñ \u0301alone ǅungla ǈ Σίσυφος ƻ ʰ",
	"日本語のテキスト、中文文本。한국어 텍스트",
	"emoji 😀👍🏽 flags 🇫🇷 zwj 👨‍👩‍👧",
	"\u00a0nbsp\u00a0 \u2028line\u2029para \u0085nel \u000bvt \u000cff",
	"!!! ??? ... --- *** ((( ))) !\n/ !/\n",
	"'s 'S 'sx ' 'r 're 'RE 'll 'Ll",
	"invalid \xff\xfe bytes \xc3 cut",
	"ſ K İ ﬁ",
	"a",
	" ",
	"\n",
	"",
}

func TestSplitMatchesExpressions(t *testing.T) {
	for _, s := range splitSeeds {
		checkSplit(t, s)
	}
}

func checkSplit(t *testing.T, s string) {
	t.Helper()
	for _, c := range splitCases() {
		want := referencePieces(t, c.re, validText(s))
		got := splitPieces(c.split, s)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: %q\nsplit into %q\nexpression %q", c.enc.name, s, got, want)
		}
	}
}

type splitCase struct {
	enc       *encoding
	re, codec *regexp2.Regexp // the interpreter; the matcher the codec uses
	split     func(string, int) int
}

func splitCases() []splitCase {
	return []splitCase{{o200k, o200kPattern, o200kGenerated, splitO200k}, {cl100k, cl100kPattern, cl100kGenerated, splitCL100k}}
}

// checkCount compares the count of s with the codec's, piece by piece: a
// piece the codec's own matcher also takes whole is merged by the codec
// exactly as by the counter.
func checkCount(t *testing.T, s string) {
	t.Helper()
	for _, c := range splitCases() {
		k := c.enc.counter()
		for _, piece := range splitPieces(c.split, s) {
			if ps := referencePieces(t, c.codec, piece); len(ps) != 1 || ps[0] != piece {
				continue // the codec's matcher cuts it differently (it even drops "\x7f")
			}
			if got, want := k.pieceTokens(piece), countPiece(codecOf(t, c.enc), piece); got != want {
				t.Fatalf("%s: piece %q of %q: %d tokens, the codec %d", c.enc.name, piece, s, got, want)
			}
		}
	}
}

// FuzzSplit checks the hand-written pre-tokenizers against the expressions,
// and the merge against the codec's.
func FuzzSplit(f *testing.F) {
	for _, s := range splitSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 4096 {
			t.Skip()
		}
		checkSplit(t, s)
		checkCount(t, s)
	})
}

// TestCountMatchesCodec compares counts on the recorded requests' texts,
// prose and long pieces (which go to the codec), and whole counts where
// the codec's matcher agrees with the expression.
func TestCountMatchesCodec(t *testing.T) {
	texts := slices.Clone(splitSeeds)
	for _, c := range loadRecorded(t) {
		texts = append(texts, string(c.Messages), string(c.Tools))
	}
	texts = append(texts, prose4KB, strings.Repeat("a", 300), strings.Repeat("ab!", 100), strings.Repeat(" ", 200)+"x")
	for _, s := range texts {
		checkSplit(t, s)
		checkCount(t, s)
		for _, c := range splitCases() {
			if !slices.Equal(referencePieces(t, c.codec, validText(s)), referencePieces(t, c.re, validText(s))) {
				continue
			}
			k := c.enc.counter()
			if got, want := k.count(s), countPiece(codecOf(t, c.enc), s); got != want {
				t.Errorf("%s: %.60q: %d tokens, the codec %d", c.enc.name, s, got, want)
			}
		}
	}
}

// TestGeneratedMatcherDiffers records where the dependency's generated
// matcher and the expression part ways (the reason split.go follows the
// interpreter); it fails only if split.go stops following the interpreter.
func TestGeneratedMatcherDiffers(t *testing.T) {
	for _, s := range []string{"x\n \n", " \x7f"} {
		for _, c := range splitCases() {
			gen, ref := referencePieces(t, c.codec, s), referencePieces(t, c.re, s)
			t.Logf("%s: %q: generated matcher %q, expression %q", c.enc.name, s, gen, ref)
			if got := splitPieces(c.split, s); !slices.Equal(got, ref) {
				t.Errorf("%s: split %q, expression %q", c.enc.name, got, ref)
			}
		}
	}
}

// codecOf returns the dependency's codec for e.
func codecOf(t testing.TB, e *encoding) tokenizer.Codec {
	c, err := tokenizer.Get(tokenizer.Encoding(e.name))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// countPiece counts s with the dependency's codec, the counter's reference
// (its generated matcher, then its merge), at one token per 4 bytes should
// the codec fail or panic.
func countPiece(c tokenizer.Codec, s string) (n int) {
	if s == "" {
		return 0
	}
	defer func() {
		if recover() != nil {
			n = (len(s) + 3) / 4
		}
	}()
	n, err := c.Count(s)
	if err != nil { // the regexp engine reports only timeouts, and none is set
		return (len(s) + 3) / 4
	}
	return n
}

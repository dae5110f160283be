package tokens

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
)

func TestEncodingFor(t *testing.T) {
	for _, tc := range []struct {
		model string
		want  *encoding
	}{
		{"gpt-4o", o200k},
		{"gpt-4o-mini-2024-07-18", o200k},
		{"chatgpt-4o-latest", o200k},
		{"gpt-4.1", o200k},
		{"gpt-4.1-nano", o200k},
		{"gpt-4.5-preview", o200k},
		{"gpt-5-mini", o200k},
		{"o1", o200k},
		{"o3-mini", o200k},
		{"o4-mini", o200k},
		{"gpt-4", cl100k},
		{"gpt-4-0613", cl100k},
		{"gpt-4-turbo", cl100k},
		{"gpt-4-32k", cl100k},
		{"gpt-3.5-turbo-0125", cl100k},
		{"gpt-35-turbo", cl100k}, // Azure's spelling
		{"text-embedding-3-small", cl100k},
		{"text-embedding-ada-002", cl100k},
		{"openai/gpt-4", cl100k},
		{"azure/openai/gpt-4o", o200k},
		{"GPT-4", cl100k},
		{"ft:gpt-3.5-turbo-0125:acme::8abc", cl100k},
		{"ft:gpt-4o-mini-2024-07-18:acme:custom:9xyz", o200k},
		{"claude-sonnet-4", o200k}, // unknown: the newest encoding
		{"", o200k},
	} {
		if got := encodingFor(tc.model); got != tc.want {
			t.Errorf("encodingFor(%q) = %s, want %s", tc.model, got.name, tc.want.name)
		}
	}
}

// The token counts the OpenAI cookbook ("How to count tokens with tiktoken")
// prints for cl100k_base.
func TestTextCookbook(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want int
	}{
		{"tiktoken is great!", 6},
		{"antidisestablishmentarianism", 6},
		{"2 + 2 = 4", 7},
		{"お誕生日おめでとう", 9},
		{"", 0},
	} {
		if got := Text("gpt-4", tc.s); got != tc.want {
			t.Errorf("Text(gpt-4, %q) = %d, want %d", tc.s, got, tc.want)
		}
	}
}

func TestTextEncodingsDiffer(t *testing.T) {
	// o200k_base has whole tokens for text cl100k_base splits.
	s := "お誕生日おめでとう"
	if o, c := Text("gpt-4o", s), Text("gpt-4", s); o >= c {
		t.Errorf("o200k %d tokens, cl100k %d: want fewer with o200k", o, c)
	}
}

func TestRolesAreOneToken(t *testing.T) {
	for role, n := range roleTokens {
		for _, enc := range []*encoding{o200k, cl100k} {
			if got := enc.countUncached(role); got != n {
				t.Errorf("%s: %q is %d tokens, roleTokens says %d", enc.name, role, got, n)
			}
		}
	}
}

func TestMemoIsConsistent(t *testing.T) {
	s := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20)
	for _, enc := range []*encoding{o200k, cl100k, o200k} {
		want := enc.countUncached(s)
		for range 3 {
			if got := enc.count(s); got != want {
				t.Fatalf("%s: count = %d, uncached %d", enc.name, got, want)
			}
		}
	}
	// The same bytes as tools and as text are different memo entries.
	tools := json.RawMessage(`[{"type":"function","function":{"name":"get_weather","description":"Get the weather","parameters":{"type":"object","properties":{}}}}]`)
	a := toolsTokens(o200k, tools, false)
	if b := o200k.count(string(tools)); a == b {
		t.Fatalf("tools rendered and raw JSON both count %d: the memo mixed them up", a)
	}
	if b := toolsTokens(o200k, tools, false); a != b {
		t.Fatalf("tools counted %d then %d", a, b)
	}
}

func TestConcurrentUse(t *testing.T) {
	texts := []string{"short", strings.Repeat("concurrency ", 50), "お誕生日おめでとう and more text to pass the memo threshold"}
	want := make([]int, len(texts))
	for i, s := range texts {
		want[i] = Text("gpt-4o", s)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8*len(texts))
	for range 8 {
		wg.Go(func() {
			for i, s := range texts {
				if got := Text("gpt-4o", s); got != want[i] {
					errs <- s
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for s := range errs {
		t.Errorf("concurrent Text(%.20q) differs", s)
	}
}

// TestLongRuns checks the guard against pathological text: long runs are
// counted in chunks, and the result stays close to the exact count.
func TestLongRuns(t *testing.T) {
	c := o200k.counter()
	for _, tc := range []struct {
		name string
		s    string
		tol  float64 // allowed relative difference from the exact count
	}{
		{"one letter", strings.Repeat("a", 64<<10), 0},
		{"spaces", strings.Repeat(" ", 64<<10), 0.01},
		{"newlines", strings.Repeat("\n", 64<<10), 0.01},
		{"base64-like", strings.Repeat("QmFzZTY0IGlzIG5vdCBwcm9zZQ+/", 2<<10), 0.02},
		{"letters then prose", strings.Repeat("x", 5000) + strings.Repeat(" ordinary words", 500), 0.01},
		{"multibyte run", strings.Repeat("é", 8<<10), 0.02},
		{"prose", strings.Repeat("Tokens are estimated before the call. ", 2000), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exact := c.count(tc.s)
			got := o200k.countUncached(tc.s)
			if d := float64(got-exact) / float64(exact); d > tc.tol || d < -tc.tol {
				t.Errorf("guarded count %d, exact %d (%+.2f%%), allowed ±%.0f%%", got, exact, 100*d, 100*tc.tol)
			}
		})
	}
}

func TestInvalidUTF8(t *testing.T) {
	s := "valid \xff\xfe then valid again, long enough to be memoised"
	if n := Text("gpt-4o", s); n <= 0 {
		t.Fatalf("Text = %d for text with invalid UTF-8", n)
	}
	long := strings.Repeat("\xff", 3000)
	if n := Text("gpt-4o", long); n <= 0 {
		t.Fatalf("Text = %d for a long invalid run", n)
	}
}

// TestCountBytes: counting text held as bytes gives count's answer, from
// the memo or not, for short and long texts.
func TestCountBytes(t *testing.T) {
	for _, s := range []string{"", "hi", "user", "A sentence long enough for the memo.", "Ünïcödé text, long enough too: 12345"} {
		for _, enc := range []*encoding{o200k, cl100k} {
			want := enc.countUncached(s)
			for range 2 { // the second time from the memo
				if got := enc.countBytes([]byte(s)); got != want {
					t.Fatalf("countBytes(%q) = %d; want %d", s, got, want)
				}
				if got := enc.count(s); got != want {
					t.Fatalf("count(%q) = %d after countBytes; want %d", s, got, want)
				}
			}
		}
	}
}

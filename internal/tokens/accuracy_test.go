package tokens

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"testing"
)

// recorded is one line of testdata/chat_prompt_tokens.jsonl: a request
// body's messages and tools as sent to OpenAI, and the prompt_tokens its
// response reported. Every case names the public file it was copied from.
type recorded struct {
	Source         string          `json:"source"`
	Model          string          `json:"model"`
	Messages       json.RawMessage `json:"messages"`
	Tools          json.RawMessage `json:"tools"`
	Functions      json.RawMessage `json:"functions"`
	ResponseFormat json.RawMessage `json:"response_format"`
	PromptTokens   int             `json:"prompt_tokens"`
	KnownOff       bool            `json:"known_off"`
	Reason         string          `json:"reason"`
}

func loadRecorded(t testing.TB) []recorded {
	t.Helper()
	data, err := os.ReadFile("testdata/chat_prompt_tokens.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	var cases []recorded
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<24)
	for line := 1; sc.Scan(); line++ {
		var c recorded
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("line %d: %v", line, err)
		}
		if c.Source == "" || c.Model == "" || len(c.Messages) == 0 || c.PromptTokens <= 0 {
			t.Fatalf("line %d: source, model, messages and prompt_tokens are required", line)
		}
		if c.KnownOff && c.Reason == "" {
			t.Fatalf("line %d: a known_off case must give its reason", line)
		}
		cases = append(cases, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return cases
}

// TestRecordedPromptTokens checks Chat against prompt_tokens that OpenAI
// reported for real requests: every case within ±5%, except those marked
// known_off (whose cost depends on something Chat is not given).
func TestRecordedPromptTokens(t *testing.T) {
	const tolerance = 0.05
	cases := loadRecorded(t)
	if len(cases) < 30 {
		t.Fatalf("%d recorded cases, want at least 30", len(cases))
	}
	var sumAbs, sumRel float64
	var scored, exact int
	for _, c := range cases {
		tools := c.Tools
		if tools == nil {
			tools = c.Functions
		}
		got := Chat(c.Model, c.Messages, tools)
		rel := float64(got-c.PromptTokens) / float64(c.PromptTokens)
		if c.KnownOff {
			t.Logf("known off: %s %s: estimate %d, billed %d (%+.1f%%): %s", c.Model, c.Source, got, c.PromptTokens, 100*rel, c.Reason)
			continue
		}
		scored++
		sumAbs += math.Abs(float64(got - c.PromptTokens))
		sumRel += math.Abs(rel)
		if got == c.PromptTokens {
			exact++
		}
		if math.Abs(rel) > tolerance {
			t.Errorf("%s %s: estimate %d, billed %d (%+.1f%%)", c.Model, c.Source, got, c.PromptTokens, 100*rel)
		}
	}
	t.Logf("%d cases scored (%d exact), mean absolute error %.2f tokens, %.2f%%", scored, exact, sumAbs/float64(scored), 100*sumRel/float64(scored))
}

package tokens

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzChat feeds arbitrary messages and tools to Chat: it must never panic,
// never return less than the reply priming, and give the same answer twice.
func FuzzChat(f *testing.F) {
	for _, c := range loadRecorded(f) {
		tools := c.Tools
		if tools == nil {
			tools = c.Functions
		}
		f.Add(c.Model, []byte(c.Messages), []byte(tools))
	}
	f.Add("gpt-4", []byte(`[{"role":"tool","tool_call_id":"x","content":[{"type":"text","text":"a"}]}]`), []byte(`[{"name":"f","parameters":{"type":"object","properties":{"a":{"anyOf":[{"type":"integer"},{"const":null}]}}}}]`))
	f.Add("o3", []byte(`[{"role":"user","content":[{"type":"image_url","image_url":"not an object"}]}]`), []byte(`[]`))
	f.Add("", []byte(`not json`), []byte(`{`))
	f.Fuzz(func(t *testing.T, model string, messages, tools []byte) {
		a := Chat(model, json.RawMessage(messages), json.RawMessage(tools))
		if a < tokensReplyReasoning {
			t.Fatalf("Chat = %d", a)
		}
		if b := Chat(model, json.RawMessage(messages), json.RawMessage(tools)); a != b {
			t.Fatalf("Chat gave %d then %d", a, b)
		}
	})
}

// FuzzInput feeds arbitrary values to Input.
func FuzzInput(f *testing.F) {
	for _, s := range []string{`"hello"`, `["a","b"]`, `[1,2,3]`, `[[1],[2,3]]`, `[]`, `null`, `[1,`, `[-1e5, 2.5]`, `[[1,"x"]]`, `{"a":1}`} {
		f.Add("text-embedding-3-small", []byte(s))
	}
	f.Fuzz(func(t *testing.T, model string, input []byte) {
		n := Input(model, json.RawMessage(input))
		if n < 0 {
			t.Fatalf("Input = %d", n)
		}
		if json.Valid(input) && !bytes.ContainsRune(input, '"') {
			var ids []json.Number
			if json.Unmarshal(input, &ids) == nil && n != len(ids) {
				t.Fatalf("Input(%s) = %d, want %d token ids", input, n, len(ids))
			}
		}
	})
}

// FuzzText checks the long-run guard against the exact count: for text
// made of long runs, the two differ by at most a token per chunk.
func FuzzText(f *testing.F) {
	f.Add("a", 3000, " hello", 2)
	f.Add(" ", 5000, "x", 1)
	f.Add("é", 1500, "\n", 700)
	f.Add("QmFz", 400, "==", 3)
	f.Fuzz(func(t *testing.T, unit string, repeat int, tail string, tailRepeat int) {
		if unit == "" || repeat < 0 || tailRepeat < 0 || len(unit)*repeat > 1<<16 || len(tail)*tailRepeat > 1<<12 {
			t.Skip()
		}
		s := repeatString(unit, repeat) + repeatString(tail, tailRepeat)
		got := o200k.countUncached(s)
		exact := o200k.counter().count(s)
		// A cut costs at most two tokens: it can split a merge and a
		// group of three digits.
		bound := 2 * (len(s)/chunkBytes + 2)
		if d := got - exact; d > bound || d < -bound {
			t.Fatalf("%d bytes: guarded %d, exact %d: off by more than %d tokens", len(s), got, exact, bound)
		}
	})
}

func repeatString(s string, n int) string {
	b := make([]byte, 0, len(s)*n)
	for range n {
		b = append(b, s...)
	}
	return string(b)
}

// FuzzScanMessages checks the reflection-free decoder against
// encoding/json: whenever it accepts an input, encoding/json must decode
// the same messages from it.
func FuzzScanMessages(f *testing.F) {
	for _, c := range loadRecorded(f) {
		f.Add([]byte(c.Messages))
	}
	for _, s := range []string{
		`[{"role":"user","content":"hi"}]`,
		`[{"role":"user","content":"a\nb \u00e9 \ud83d\ude00","name":"x"}]`,
		`[{"role":"user","Role":"system","content":"x"}]`,
		`[{"role":"user","content":null,"tool_calls":null,"function_call":null}]`,
		`[{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"t"}]}]`,
		`[{"role":null,"content":"x"},{"role":5}]`,
		`[{"rolE":"user"},{"ſole":"x"},{"role":"a","role":"b"}]`,
		`[{"role":"user","content":"\xff\xfe"}]`,
		`["junk",{"role":"user"}]`,
		`[]`, `[null]`, ` [{}] `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, messages []byte) {
		got, ok := scanMessages(messages)
		if !ok {
			return
		}
		var want []message
		if err := json.Unmarshal(messages, &want); err != nil {
			t.Fatalf("scanMessages accepted %q, encoding/json: %v", messages, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d messages, encoding/json %d", messages, len(got), len(want))
		}
		for i := range got {
			g, w := got[i], want[i]
			if g.Role != w.Role || g.Name != w.Name || g.ToolCallID != w.ToolCallID ||
				!bytes.Equal(g.Content, w.Content) || len(w.ToolCalls) != 0 || w.FunctionCall != nil {
				t.Fatalf("%q: message %d is %+v, encoding/json %+v", messages, i, g, w)
			}
		}
	})
}

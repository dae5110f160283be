package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/clock"
)

// TestChatBillsLikeOpenAI sends requests whose prompt_tokens OpenAI
// reported (OpenAI cookbook, "How to count tokens with tiktoken"): the
// simulator must bill the same.
func TestChatBillsLikeOpenAI(t *testing.T) {
	_, ts := start(t, Config{Models: []string{"gpt-4o", "gpt-4"}})
	jargon := `[{"role":"system","content":"You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
		{"role":"system","name":"example_user","content":"New synergies will help drive top-line growth."},
		{"role":"system","name":"example_assistant","content":"Things working well together will increase revenue."},
		{"role":"system","name":"example_user","content":"Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
		{"role":"system","name":"example_assistant","content":"Let's talk later when we're less busy about how to do better."},
		{"role":"user","content":"This late pivot means we don't have time to boil the ocean for the client deliverable."}]`
	weather := `[{"role":"system","content":"You are a helpful assistant that can answer to questions about the weather."},
		{"role":"user","content":"What's the weather like in San Francisco?"}]`
	tools := `[{"type":"function","function":{"name":"get_current_weather","description":"Get the current weather in a given location",
		"parameters":{"type":"object","properties":{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},
		"unit":{"type":"string","description":"The unit of temperature to return","enum":["celsius","fahrenheit"]}},"required":["location"]}}}]`
	for _, tc := range []struct {
		model, messages, extra string
		want                   int64
	}{
		{"gpt-4o", jargon, "", 124},
		{"gpt-4", jargon, "", 129},
		{"gpt-4o", weather, `,"tools":` + tools, 101},
		{"gpt-4", weather, `,"tools":` + tools, 105},
	} {
		r := do(t, ts, "POST", "/v1/chat/completions", "", `{"model":"`+tc.model+`","messages":`+tc.messages+tc.extra+`}`)
		var c chatCompletion
		if err := json.Unmarshal(r.body, &c); err != nil || r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		if c.Usage.PromptTokens != tc.want {
			t.Errorf("%s: prompt_tokens %d, OpenAI billed %d", tc.model, c.Usage.PromptTokens, tc.want)
		}
	}
}

func completionBody(prompt, extra string) string {
	return `{"model":"gpt-4.1","prompt":` + prompt + extra + `}`
}

func TestCompletionJSON(t *testing.T) {
	_, ts := start(t, Config{})
	get := func(body string) textCompletion {
		t.Helper()
		r := do(t, ts, "POST", "/v1/completions", "", body)
		if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
			t.Fatalf("%d %s", r.status, r.body)
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(r.body, &raw); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"id", "object", "created", "model", "choices", "usage"} {
			if _, ok := raw[k]; !ok {
				t.Fatalf("no %q in %s", k, r.body)
			}
		}
		var c textCompletion
		if err := json.Unmarshal(r.body, &c); err != nil || c.Object != "text_completion" || !strings.HasPrefix(c.ID, "cmpl-") || c.Model != "gpt-4.1" {
			t.Fatalf("%s (%v)", r.body, err)
		}
		for i, ch := range c.Choices {
			if ch.Index != i || string(ch.Logprobs) != "null" || ch.FinishReason == nil {
				t.Fatalf("choice %d: %s", i, r.body)
			}
		}
		return c
	}
	usageOf := func(c textCompletion) usage {
		var u usage
		if err := json.Unmarshal(c.Usage, &u); err != nil {
			t.Fatal(err)
		}
		return u
	}

	// max_tokens defaults to 16, as OpenAI's does.
	a := get(completionBody(`"Once upon a time"`, ""))
	b := get(completionBody(`"Once upon a time"`, ""))
	if len(a.Choices) != 1 || a.Choices[0].Text != b.Choices[0].Text || !strings.HasPrefix(a.Choices[0].Text, " ") {
		t.Fatalf("answers %q and %q: want one, the same, continuing the prompt", a.Choices[0].Text, b.Choices[0].Text)
	}
	words := len(strings.Fields(a.Choices[0].Text))
	u := usageOf(a)
	if words > defaultCompletionMaxTokens || u.CompletionTokens != int64(words) || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Fatalf("%d words, usage %+v", words, u)
	}
	// "Once upon a time" is 4 tokens in o200k_base; no per-prompt overhead.
	if u.PromptTokens != 4 {
		t.Fatalf("prompt_tokens %d, want 4", u.PromptTokens)
	}
	if (words == defaultCompletionMaxTokens) != (*a.Choices[0].FinishReason == "length") {
		t.Fatalf("%d words, finish %q", words, *a.Choices[0].FinishReason)
	}

	// One choice per prompt; token prompts cost one token per id.
	m := get(completionBody(`["Once upon a time", "In a galaxy far away"]`, `,"max_tokens":2`))
	if len(m.Choices) != 2 || *m.Choices[0].FinishReason != "length" || len(strings.Fields(m.Choices[1].Text)) != 2 {
		t.Fatalf("two prompts: %+v", m.Choices)
	}
	if !strings.HasPrefix(a.Choices[0].Text, m.Choices[0].Text) {
		t.Fatalf("capped answer %q is not a prefix of %q", m.Choices[0].Text, a.Choices[0].Text)
	}
	// "In a galaxy far away" is 5 tokens.
	if mu := usageOf(m); mu.PromptTokens != 4+5 || mu.CompletionTokens != 4 {
		t.Fatalf("two prompts: usage %+v", mu)
	}
	tok := get(completionBody(`[[1,2,3],[4,5]]`, `,"max_tokens":1`))
	if tu := usageOf(tok); len(tok.Choices) != 2 || tu.PromptTokens != 5 || tu.CompletionTokens != 2 {
		t.Fatalf("token prompts: %+v", tok)
	}
	if one := usageOf(get(completionBody(`[1,2,3]`, ""))); one.PromptTokens != 3 {
		t.Fatalf("one token prompt: %+v", one)
	}
}

func TestCompletionStream(t *testing.T) {
	_, ts := start(t, Config{})
	for _, prompt := range []string{`"stream me"`, `["first", "second"]`} {
		whole := do(t, ts, "POST", "/v1/completions", "", completionBody(prompt, `,"max_tokens":5`))
		var c textCompletion
		if err := json.Unmarshal(whole.body, &c); err != nil {
			t.Fatal(err)
		}
		var wantUsage usage
		_ = json.Unmarshal(c.Usage, &wantUsage)
		for _, includeUsage := range []bool{false, true} {
			t.Run(prompt+" include_usage="+strconv.FormatBool(includeUsage), func(t *testing.T) {
				extra := `,"max_tokens":5,"stream":true`
				if includeUsage {
					extra += `,"stream_options":{"include_usage":true}`
				}
				r := do(t, ts, "POST", "/v1/completions", "", completionBody(prompt, extra))
				if r.status != 200 || r.header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
					t.Fatalf("%d %q", r.status, r.header.Get("Content-Type"))
				}
				evs := events(t, r.body)
				if evs[len(evs)-1] != "[DONE]" {
					t.Fatalf("last event %q", evs[len(evs)-1])
				}
				evs = evs[:len(evs)-1]
				texts := make([]string, len(c.Choices))
				finishes := make([]string, len(c.Choices))
				for i, ev := range evs {
					var raw map[string]json.RawMessage
					if err := json.Unmarshal([]byte(ev), &raw); err != nil {
						t.Fatal(err)
					}
					var ch textCompletion
					if err := json.Unmarshal([]byte(ev), &ch); err != nil || ch.Object != "text_completion" || ch.ID != evs0ID(t, evs) {
						t.Fatalf("event %d: %s", i, ev)
					}
					u, hasUsage := raw["usage"]
					if hasUsage != includeUsage {
						t.Fatalf("event %d: usage present %v: %s", i, hasUsage, ev)
					}
					if includeUsage && i == len(evs)-1 {
						var got usage
						if string(raw["choices"]) != "[]" || json.Unmarshal(u, &got) != nil || got != wantUsage {
							t.Fatalf("usage chunk %s, want %+v", ev, wantUsage)
						}
						continue
					}
					if hasUsage && string(u) != "null" {
						t.Fatalf("event %d: usage before the end: %s", i, ev)
					}
					if len(ch.Choices) != 1 || string(ch.Choices[0].Logprobs) != "null" {
						t.Fatalf("event %d: %s", i, ev)
					}
					x := ch.Choices[0]
					if finishes[x.Index] != "" {
						t.Fatalf("event %d: choice %d continues after its finish_reason", i, x.Index)
					}
					texts[x.Index] += x.Text
					if x.FinishReason != nil {
						finishes[x.Index] = *x.FinishReason
					}
				}
				for i := range c.Choices {
					if texts[i] != c.Choices[i].Text || finishes[i] != *c.Choices[i].FinishReason {
						t.Fatalf("choice %d streamed %q (%s), JSON %q (%s)", i, texts[i], finishes[i], c.Choices[i].Text, *c.Choices[i].FinishReason)
					}
				}
			})
		}
	}
}

func evs0ID(t *testing.T, evs []string) string {
	t.Helper()
	var c textCompletion
	_ = json.Unmarshal([]byte(evs[0]), &c)
	return c.ID
}

func TestCompletionLimitsAndFaults(t *testing.T) {
	t.Run("TPM counts max_tokens per prompt", func(t *testing.T) {
		_, ts := start(t, Config{TPM: 100, Clock: clock.NewFake(fakeStart)})
		// Two prompts of 1 token ("first", "second") + 2 × max_tokens 20.
		r := do(t, ts, "POST", "/v1/completions", "", completionBody(`["first","second"]`, `,"max_tokens":20`))
		if r.status != 200 || r.header.Get("x-ratelimit-remaining-tokens") != "58" {
			t.Fatalf("%d %v %s", r.status, r.header, r.body)
		}
		// The default max_tokens (16) is charged too.
		r = do(t, ts, "POST", "/v1/completions", "", completionBody(`"first"`, ""))
		if r.status != 200 || r.header.Get("x-ratelimit-remaining-tokens") != "41" {
			t.Fatalf("%d %v %s", r.status, r.header, r.body)
		}
		r = do(t, ts, "POST", "/v1/completions", "", completionBody(`"first"`, `,"max_tokens":50`))
		if e := openAIError(t, r.body); r.status != 429 || e.Type != "tokens" || deref(e.Code) != "rate_limit_exceeded" {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	t.Run("RPM is shared with chat per model", func(t *testing.T) {
		_, ts := start(t, Config{RPM: 1, Clock: clock.NewFake(fakeStart)})
		if r := do(t, ts, "POST", "/v1/chat/completions", "", chatBody("x", "")); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		r := do(t, ts, "POST", "/v1/completions", "", completionBody(`"x"`, ""))
		if e := openAIError(t, r.body); r.status != 429 || e.Type != "requests" || r.header.Get("retry-after") == "" {
			t.Fatalf("%d %v %s", r.status, r.header, r.body)
		}
	})
	t.Run("errors injected", func(t *testing.T) {
		s, ts := start(t, Config{ErrorRate: 1, Seed: 3})
		r := do(t, ts, "POST", "/v1/completions", "", completionBody(`"x"`, ""))
		if e := openAIError(t, r.body); (r.status != 500 && r.status != 503) || e.Type != "server_error" {
			t.Fatalf("%d %s", r.status, r.body)
		}
		if st := s.Stats().Total; st.ErrorsInjected != 1 || st.Calls != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("stream dropped", func(t *testing.T) {
		s, ts := start(t, Config{DropRate: 1})
		req, _ := http.NewRequestWithContext(t.Context(), "POST", ts.URL+"/v1/completions", strings.NewReader(completionBody(`"drop me"`, `,"stream":true,"max_tokens":8`)))
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if !errors.Is(err, io.ErrUnexpectedEOF) || resp.StatusCode != 200 || !bytes.HasPrefix(b, []byte("data: {")) || bytes.Contains(b, []byte("[DONE]")) {
			t.Fatalf("%d %v %q", resp.StatusCode, err, b)
		}
		if st := s.Stats().Total; st.StreamsDropped != 1 || st.CompletionTokens != 4 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("stats", func(t *testing.T) {
		s, ts := start(t, Config{})
		do(t, ts, "POST", "/v1/completions", "sk-c", completionBody(`[[1,2,3]]`, `,"max_tokens":2`))
		if k := s.Stats().Keys["key-"+keyHash("sk-c")]; k != (KeyStats{Calls: 1, PromptTokens: 3, CompletionTokens: 2}) {
			t.Fatalf("stats %+v", k)
		}
	})
}

func TestCompletionBadRequests(t *testing.T) {
	_, ts := start(t, Config{})
	for _, tc := range []struct {
		name, body  string
		status      int
		code, param string
	}{
		{"malformed json", `{"model":`, 400, "<null>", "<null>"},
		{"no model", `{"prompt":"x"}`, 400, "<null>", "model"},
		{"no prompt", `{"model":"gpt-4.1"}`, 400, "<null>", "prompt"},
		{"null prompt", completionBody(`null`, ""), 400, "<null>", "prompt"},
		{"empty prompt array", completionBody(`[]`, ""), 400, "<null>", "prompt"},
		{"prompt an object", completionBody(`{"a":1}`, ""), 400, "<null>", "prompt"},
		{"mixed prompt array", completionBody(`["a",[1]]`, ""), 400, "<null>", "prompt"},
		{"too many prompts", completionBody(`[`+strings.Repeat(`"a",`, maxPrompts)+`"a"]`, ""), 400, "<null>", "prompt"},
		{"max_tokens 0", completionBody(`"x"`, `,"max_tokens":0`), 400, "<null>", "max_tokens"},
		{"n 2", completionBody(`"x"`, `,"n":2`), 400, "<null>", "n"},
		{"stream_options without stream", completionBody(`"x"`, `,"stream_options":{"include_usage":true}`), 400, "<null>", "stream_options"},
		{"unknown model", `{"model":"gpt-9","prompt":"x"}`, 404, "model_not_found", "<null>"},
		{"embedding model", `{"model":"text-embedding-3-small","prompt":"x"}`, 404, "model_not_found", "<null>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, ts, "POST", "/v1/completions", "", tc.body)
			e := openAIError(t, r.body)
			if r.status != tc.status || e.Type != "invalid_request_error" || deref(e.Code) != tc.code || deref(e.Param) != tc.param {
				t.Fatalf("got %d %s", r.status, r.body)
			}
		})
	}
	if r := do(t, ts, "GET", "/v1/completions", "", ""); r.status != 404 {
		t.Fatalf("GET: %d %s", r.status, r.body)
	}
}

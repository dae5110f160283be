package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
)

func TestChatJSONIsDeterministic(t *testing.T) {
	_, ts := start(t, Config{})
	var first chatCompletion
	for i := range 2 {
		r := do(t, ts, "POST", "/v1/chat/completions", "sk-a", chatBody("Say something about quotas.", ""))
		if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		var c chatCompletion
		if err := json.Unmarshal(r.body, &c); err != nil {
			t.Fatal(err)
		}
		if c.Object != "chat.completion" || c.Model != "gpt-4.1" || len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" || c.Choices[0].FinishReason != "stop" {
			t.Fatalf("unexpected completion: %s", r.body)
		}
		u := c.Usage
		words := int64(len(strings.Fields(c.Choices[0].Message.Content)))
		if u.CompletionTokens != words || u.CompletionTokens < 8 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Fatalf("usage %+v for %d words", u, words)
		}
		// OpenAI's chat format in o200k_base: 3 per message + "user" (1) +
		// "Say something about quotas." (5) + 3 for the reply's priming.
		if u.PromptTokens != 12 {
			t.Fatalf("prompt_tokens = %d, want 12", u.PromptTokens)
		}
		if i == 0 {
			first = c
		} else if c.Choices[0].Message.Content != first.Choices[0].Message.Content {
			t.Fatalf("same prompt, different answers: %q and %q", first.Choices[0].Message.Content, c.Choices[0].Message.Content)
		}
	}
	other := do(t, ts, "POST", "/v1/chat/completions", "sk-a", chatBody("Something else entirely.", ""))
	if bytes.Contains(other.body, []byte(first.Choices[0].Message.Content)) {
		t.Fatalf("different prompts gave the same answer %q", first.Choices[0].Message.Content)
	}
}

func TestChatMaxTokensCapsTheAnswer(t *testing.T) {
	_, ts := start(t, Config{})
	for _, extra := range []string{`,"max_tokens":3`, `,"max_completion_tokens":3`, `,"max_tokens":100,"max_completion_tokens":3`} {
		r := do(t, ts, "POST", "/v1/chat/completions", "", chatBody("hello", extra))
		var c chatCompletion
		if err := json.Unmarshal(r.body, &c); err != nil || r.status != 200 {
			t.Fatalf("%s: %d %s", extra, r.status, r.body)
		}
		if c.Usage.CompletionTokens != 3 || c.Choices[0].FinishReason != "length" || len(strings.Fields(c.Choices[0].Message.Content)) != 3 {
			t.Fatalf("%s: %s", extra, r.body)
		}
	}
}

// events splits an SSE body into its events, checking the framing: every
// event is one "data: " line followed by a blank line.
func events(t *testing.T, body []byte) []string {
	t.Helper()
	if !bytes.HasSuffix(body, []byte("\n\n")) {
		t.Fatalf("stream does not end with a blank line: %q", body)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("malformed event %q", ev)
		}
		out = append(out, data)
	}
	return out
}

func TestChatStreamFraming(t *testing.T) {
	_, ts := start(t, Config{})
	whole := do(t, ts, "POST", "/v1/chat/completions", "", chatBody("stream me", ""))
	var c chatCompletion
	if err := json.Unmarshal(whole.body, &c); err != nil {
		t.Fatal(err)
	}
	for _, includeUsage := range []bool{false, true} {
		t.Run("include_usage="+strconv.FormatBool(includeUsage), func(t *testing.T) {
			extra := `,"stream":true`
			if includeUsage {
				extra += `,"stream_options":{"include_usage":true}`
			}
			r := do(t, ts, "POST", "/v1/chat/completions", "", chatBody("stream me", extra))
			if r.status != 200 || r.header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
				t.Fatalf("status %d, content type %q", r.status, r.header.Get("Content-Type"))
			}
			evs := events(t, r.body)
			if evs[len(evs)-1] != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", evs[len(evs)-1])
			}
			evs = evs[:len(evs)-1]
			var text strings.Builder
			var finish string
			var gotUsage *usage
			for i, ev := range evs {
				var raw map[string]json.RawMessage
				if err := json.Unmarshal([]byte(ev), &raw); err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				u, hasUsage := raw["usage"]
				if hasUsage != includeUsage {
					t.Fatalf("event %d: usage key present %v, include_usage %v: %s", i, hasUsage, includeUsage, ev)
				}
				var ch struct {
					Object  string `json:"object"`
					ID      string `json:"id"`
					Choices []struct {
						Delta struct {
							Role    string  `json:"role"`
							Content *string `json:"content"`
						} `json:"delta"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(ev), &ch); err != nil || ch.Object != "chat.completion.chunk" || ch.ID == "" {
					t.Fatalf("event %d is not a chunk: %s", i, ev)
				}
				if includeUsage && i == len(evs)-1 {
					if len(ch.Choices) != 0 || string(raw["choices"]) != "[]" {
						t.Fatalf("usage chunk has choices: %s", ev)
					}
					gotUsage = new(usage)
					if err := json.Unmarshal(u, gotUsage); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if hasUsage && string(u) != "null" {
					t.Fatalf("event %d: usage %s before the last chunk", i, u)
				}
				if len(ch.Choices) != 1 {
					t.Fatalf("event %d: %d choices", i, len(ch.Choices))
				}
				d := ch.Choices[0]
				if i == 0 && d.Delta.Role != "assistant" {
					t.Fatalf("first chunk without the assistant role: %s", ev)
				}
				if d.Delta.Content != nil {
					text.WriteString(*d.Delta.Content)
				}
				if d.FinishReason != nil {
					finish = *d.FinishReason
				}
			}
			if text.String() != c.Choices[0].Message.Content || finish != "stop" {
				t.Fatalf("streamed %q (finish %q), JSON answer %q", text.String(), finish, c.Choices[0].Message.Content)
			}
			if includeUsage && (gotUsage == nil || *gotUsage != c.Usage) {
				t.Fatalf("stream usage %+v, JSON usage %+v", gotUsage, c.Usage)
			}
		})
	}
}

// TestStreamFlushesEachEvent reads the first two events while the server is
// still waiting an hour before the second token: they can only arrive if
// each event is flushed as it is written.
func TestStreamFlushesEachEvent(t *testing.T) {
	s, ts := start(t, Config{TTFT: time.Millisecond, TokenDelay: time.Hour})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/chat/completions", strings.NewReader(chatBody("slow", `,"stream":true`)))
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var got []string
	for len(got) < 2 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		blank, err := br.ReadString('\n')
		if err != nil || blank != "\n" || !strings.HasPrefix(line, "data: {") {
			t.Fatalf("event framing: %q then %q (%v)", line, blank, err)
		}
		got = append(got, line)
	}
	if !strings.Contains(got[0], `"role":"assistant"`) || !strings.Contains(got[1], `"content":"`) {
		t.Fatalf("first events %q", got)
	}
	if st := s.Stats(); st.Total.Calls != 1 || st.Total.CompletionTokens != 1 {
		t.Fatalf("stats while streaming %+v", st.Total)
	}
	cancel() // the handler must notice and return; ts.Close waits for it
}

func TestRPMLimit(t *testing.T) {
	fc := clock.NewFake(fakeStart)
	_, ts := start(t, Config{RPM: 3, Clock: fc})
	for i := range 3 {
		r := do(t, ts, "POST", "/v1/chat/completions", "sk-a", chatBody("hi", ""))
		if r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		if got, want := r.header.Get("x-ratelimit-remaining-requests"), strconv.Itoa(2-i); got != want {
			t.Fatalf("request %d: remaining %q, want %q", i, got, want)
		}
		if r.header.Get("x-ratelimit-limit-requests") != "3" || r.header.Get("x-ratelimit-reset-requests") != []string{"20s", "40s", "1m0s"}[i] {
			t.Fatalf("request %d headers %v", i, r.header)
		}
		if r.header.Get("x-ratelimit-limit-tokens") != "" {
			t.Fatalf("token headers without a TPM limit: %v", r.header)
		}
	}
	r := do(t, ts, "POST", "/v1/chat/completions", "sk-a", chatBody("hi", ""))
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("4th request: %d %s", r.status, r.body)
	}
	e := openAIError(t, r.body)
	want := "Rate limit reached for gpt-4.1 in organization org-sim on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s."
	if !strings.HasPrefix(e.Message, want) || e.Type != "requests" || deref(e.Code) != "rate_limit_exceeded" || e.Param != nil {
		t.Fatalf("429 body %s", r.body)
	}
	if r.header.Get("retry-after") != "20" || r.header.Get("retry-after-ms") != "20000" || r.header.Get("x-ratelimit-remaining-requests") != "0" {
		t.Fatalf("429 headers %v", r.header)
	}
	// Other keys and other models have their own buckets.
	if r := do(t, ts, "POST", "/v1/chat/completions", "sk-b", chatBody("hi", "")); r.status != 200 {
		t.Fatalf("other key: %d", r.status)
	}
	if r := do(t, ts, "POST", "/v1/chat/completions", "sk-a", strings.Replace(chatBody("hi", ""), "gpt-4.1", "gpt-4.1-mini", 1)); r.status != 200 {
		t.Fatalf("other model: %d", r.status)
	}
	fc.Advance(19*time.Second + 500*time.Millisecond)
	r = do(t, ts, "POST", "/v1/chat/completions", "sk-a", chatBody("hi", ""))
	if r.status != 429 || r.header.Get("retry-after") != "1" || r.header.Get("retry-after-ms") != "500" || !strings.Contains(string(r.body), "try again in 500ms.") {
		t.Fatalf("after 19.5s: %d %v %s", r.status, r.header, r.body)
	}
	fc.Advance(500 * time.Millisecond)
	if r := do(t, ts, "POST", "/v1/chat/completions", "sk-a", chatBody("hi", "")); r.status != 200 {
		t.Fatalf("after the refill: %d %s", r.status, r.body)
	}
}

func TestRPMOnRealTime(t *testing.T) {
	_, ts := start(t, Config{RPM: 2})
	for range 2 {
		if r := do(t, ts, "POST", "/v1/embeddings", "", `{"model":"text-embedding-3-small","input":"x"}`); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	r := do(t, ts, "POST", "/v1/embeddings", "", `{"model":"text-embedding-3-small","input":"x"}`)
	ra, err := strconv.Atoi(r.header.Get("retry-after"))
	if r.status != 429 || err != nil || ra < 1 || ra > 30 {
		t.Fatalf("%d retry-after %q: %s", r.status, r.header.Get("retry-after"), r.body)
	}
	openAIError(t, r.body)
}

func TestTPMCountsMaxTokens(t *testing.T) {
	fc := clock.NewFake(fakeStart)
	_, ts := start(t, Config{TPM: 100, Clock: fc})
	// "hi" costs 3 + 1 + 1 + 3 = 8 prompt tokens, plus max_tokens 40.
	body := chatBody("hi", `,"max_tokens":40`)
	for i, rem := range []string{"52", "4"} {
		r := do(t, ts, "POST", "/v1/chat/completions", "", body)
		if r.status != 200 || r.header.Get("x-ratelimit-remaining-tokens") != rem || r.header.Get("x-ratelimit-limit-tokens") != "100" {
			t.Fatalf("request %d: %d %v %s", i, r.status, r.header, r.body)
		}
		if r.header.Get("x-ratelimit-limit-requests") != "" {
			t.Fatalf("request headers without an RPM limit: %v", r.header)
		}
	}
	r := do(t, ts, "POST", "/v1/chat/completions", "", body)
	e := openAIError(t, r.body)
	// 44 tokens missing at 100 per minute: 26.4s.
	want := "Rate limit reached for gpt-4.1 in organization org-sim on tokens per min (TPM): Limit 100, Used 96, Requested 48. Please try again in 26.4s."
	if r.status != 429 || e.Type != "tokens" || deref(e.Code) != "rate_limit_exceeded" || !strings.HasPrefix(e.Message, want) {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if r.header.Get("retry-after") != "27" || r.header.Get("retry-after-ms") != "26400" || r.header.Get("x-ratelimit-reset-tokens") != "57.6s" {
		t.Fatalf("headers %v", r.header)
	}
	// A request that can never fit is refused without a retry-after.
	r = do(t, ts, "POST", "/v1/chat/completions", "", chatBody("hi", `,"max_tokens":200`))
	e = openAIError(t, r.body)
	if r.status != 429 || e.Type != "tokens" || !strings.HasPrefix(e.Message, "Request too large for gpt-4.1") || r.header.Get("retry-after") != "" {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
}

func TestConcurrencyLimit(t *testing.T) {
	_, ts := start(t, Config{Concurrency: 1, TokenDelay: time.Hour})
	// Sequential requests never exceed the limit: permits are released.
	for i := range 3 {
		if r := do(t, ts, "POST", "/v1/chat/completions", "", chatBody("x", `,"max_tokens":1`)); r.status != 200 {
			t.Fatalf("sequential %d: %d %s", i, r.status, r.body)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/chat/completions", strings.NewReader(chatBody("x", `,"stream":true`)))
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil { // the stream is in flight
		t.Fatal(err)
	}
	r := do(t, ts, "POST", "/v1/chat/completions", "", chatBody("x", ""))
	e := openAIError(t, r.body)
	if r.status != 429 || e.Type != "requests" || deref(e.Code) != "rate_limit_exceeded" || r.header.Get("retry-after") != "1" || !strings.Contains(e.Message, "concurrent requests: Limit 1, In flight 1") {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	// Another key has its own permits.
	if r := do(t, ts, "POST", "/v1/chat/completions", "sk-other", chatBody("x", `,"max_tokens":1`)); r.status != 200 {
		t.Fatalf("other key: %d", r.status)
	}
}

func TestErrorRateOneFailsEverything(t *testing.T) {
	s, ts := start(t, Config{ErrorRate: 1, Seed: 7})
	seen := map[int]int{}
	for i := range 30 {
		path, body := "/v1/chat/completions", chatBody("x", "")
		if i%3 == 0 {
			path, body = "/v1/embeddings", `{"model":"text-embedding-3-small","input":"x"}`
		}
		r := do(t, ts, "POST", path, "", body)
		e := openAIError(t, r.body)
		if (r.status != 500 && r.status != 503) || e.Type != "server_error" {
			t.Fatalf("%d %s", r.status, r.body)
		}
		seen[r.status]++
	}
	if seen[500] == 0 || seen[503] == 0 {
		t.Fatalf("statuses %v; want both 500 and 503", seen)
	}
	if st := s.Stats().Total; st.ErrorsInjected != 30 || st.Calls != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestErrorRateIsApproximatelyHonoured(t *testing.T) {
	s, ts := start(t, Config{ErrorRate: 0.3, Seed: 42})
	const n = 400
	for range n {
		do(t, ts, "POST", "/v1/embeddings", "", `{"model":"text-embedding-3-small","input":"x","dimensions":2}`)
	}
	st := s.Stats().Total
	if st.ErrorsInjected+st.Calls != n || st.ErrorsInjected < 80 || st.ErrorsInjected > 160 {
		t.Fatalf("%d errors in %d requests at rate 0.3 (stats %+v)", st.ErrorsInjected, n, st)
	}
}

func TestDropRateCutsTheStream(t *testing.T) {
	s, ts := start(t, Config{DropRate: 1})
	req, _ := http.NewRequestWithContext(t.Context(), "POST", ts.URL+"/v1/chat/completions", strings.NewReader(chatBody("drop me", `,"stream":true`)))
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read error %v, want an unexpected EOF", err)
	}
	if resp.StatusCode != 200 || !bytes.HasPrefix(b, []byte("data: {")) || bytes.Contains(b, []byte("[DONE]")) {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	if st := s.Stats().Total; st.StreamsDropped != 1 || st.CompletionTokens < 4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBadRequests(t *testing.T) {
	_, ts := start(t, Config{APIKeys: []string{"sk-good"}})
	big := chatBody(strings.Repeat("a", DefaultMaxBodyBytes), "")
	for _, tc := range []struct {
		name, method, path, key, body string
		status                        int
		typ, code, param              string
	}{
		{"malformed json", "POST", "/v1/chat/completions", "sk-good", `{"model":`, 400, "invalid_request_error", "<null>", "<null>"},
		{"empty body", "POST", "/v1/chat/completions", "sk-good", ``, 400, "invalid_request_error", "<null>", "<null>"},
		{"not an object", "POST", "/v1/chat/completions", "sk-good", `[1,2]`, 400, "invalid_request_error", "<null>", "<null>"},
		{"model of the wrong type", "POST", "/v1/chat/completions", "sk-good", `{"model":5,"messages":[]}`, 400, "invalid_request_error", "<null>", "model"},
		{"no model", "POST", "/v1/chat/completions", "sk-good", `{"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error", "<null>", "model"},
		{"no messages", "POST", "/v1/chat/completions", "sk-good", `{"model":"gpt-4.1","messages":[]}`, 400, "invalid_request_error", "<null>", "messages"},
		{"bad role", "POST", "/v1/chat/completions", "sk-good", `{"model":"gpt-4.1","messages":[{"role":"robot","content":"x"}]}`, 400, "invalid_request_error", "<null>", "messages.[0].role"},
		{"bad content", "POST", "/v1/chat/completions", "sk-good", `{"model":"gpt-4.1","messages":[{"role":"user","content":7}]}`, 400, "invalid_request_error", "<null>", "messages.[0].content"},
		{"max_tokens 0", "POST", "/v1/chat/completions", "sk-good", chatBody("x", `,"max_tokens":0`), 400, "invalid_request_error", "<null>", "max_tokens"},
		{"n 2", "POST", "/v1/chat/completions", "sk-good", chatBody("x", `,"n":2`), 400, "invalid_request_error", "<null>", "n"},
		{"stream_options without stream", "POST", "/v1/chat/completions", "sk-good", chatBody("x", `,"stream_options":{"include_usage":true}`), 400, "invalid_request_error", "<null>", "stream_options"},
		{"unknown model", "POST", "/v1/chat/completions", "sk-good", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "invalid_request_error", "model_not_found", "<null>"},
		{"embedding model on chat", "POST", "/v1/chat/completions", "sk-good", `{"model":"text-embedding-3-small","messages":[{"role":"user","content":"x"}]}`, 404, "invalid_request_error", "model_not_found", "<null>"},
		{"unknown embedding model", "POST", "/v1/embeddings", "sk-good", `{"model":"gpt-4.1","input":"x"}`, 404, "invalid_request_error", "model_not_found", "<null>"},
		{"empty embedding input", "POST", "/v1/embeddings", "sk-good", `{"model":"text-embedding-3-small","input":[]}`, 400, "invalid_request_error", "<null>", "input"},
		{"bad dimensions", "POST", "/v1/embeddings", "sk-good", `{"model":"text-embedding-3-small","input":"x","dimensions":0}`, 400, "invalid_request_error", "<null>", "dimensions"},
		{"unknown model id", "GET", "/v1/models/gpt-9", "sk-good", ``, 404, "invalid_request_error", "model_not_found", "<null>"},
		{"missing key", "POST", "/v1/chat/completions", "", chatBody("x", ""), 401, "invalid_request_error", "invalid_api_key", "<null>"},
		{"wrong key", "POST", "/v1/chat/completions", "sk-bad", chatBody("x", ""), 401, "invalid_request_error", "invalid_api_key", "<null>"},
		{"wrong key on models", "GET", "/v1/models", "sk-bad", ``, 401, "invalid_request_error", "invalid_api_key", "<null>"},
		{"body over 1 MiB", "POST", "/v1/chat/completions", "sk-good", big, 413, "invalid_request_error", "request_too_large", "<null>"},
		{"unknown route", "GET", "/v1/nope", "sk-good", ``, 404, "invalid_request_error", "unknown_url", "<null>"},
		{"wrong method", "GET", "/v1/chat/completions", "sk-good", ``, 404, "invalid_request_error", "unknown_url", "<null>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, ts, tc.method, tc.path, tc.key, tc.body)
			e := openAIError(t, r.body)
			if r.status != tc.status || e.Type != tc.typ || deref(e.Code) != tc.code || deref(e.Param) != tc.param {
				t.Fatalf("got %d %s", r.status, r.body)
			}
			if strings.Contains(string(r.body), "sk-bad") || r.header.Get("x-request-id") == "" {
				t.Fatalf("key echoed or no request id: %v %s", r.header, r.body)
			}
		})
	}
	if r := do(t, ts, "POST", "/v1/chat/completions", "sk-good", chatBody("x", "")); r.status != 200 {
		t.Fatalf("good key: %d %s", r.status, r.body)
	}
}

func TestEmbeddings(t *testing.T) {
	_, ts := start(t, Config{EmbeddingDimensions: 8})
	type resp struct {
		Object string `json:"object"`
		Model  string `json:"model"`
		Data   []struct {
			Object    string          `json:"object"`
			Index     int             `json:"index"`
			Embedding json.RawMessage `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int64 `json:"prompt_tokens"`
			TotalTokens  int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	get := func(body string) resp {
		r := do(t, ts, "POST", "/v1/embeddings", "", body)
		var out resp
		if err := json.Unmarshal(r.body, &out); r.status != 200 || err != nil {
			t.Fatalf("%d %s", r.status, r.body)
		}
		return out
	}
	a := get(`{"model":"text-embedding-3-small","input":["hello world","second input!"]}`)
	// cl100k_base: "hello world" is 2 tokens, "second input!" 3.
	if a.Object != "list" || len(a.Data) != 2 || a.Data[1].Index != 1 || a.Usage.PromptTokens != 2+3 || a.Usage.TotalTokens != 5 {
		t.Fatalf("%+v", a)
	}
	var v0, v1 []float32
	_ = json.Unmarshal(a.Data[0].Embedding, &v0)
	_ = json.Unmarshal(a.Data[1].Embedding, &v1)
	var norm float64
	for _, x := range v0 {
		norm += float64(x) * float64(x)
	}
	if len(v0) != 8 || math.Abs(norm-1) > 1e-5 || slicesEqual(v0, v1) {
		t.Fatalf("vectors %v %v (norm² %v)", v0, v1, norm)
	}
	b := get(`{"model":"text-embedding-3-small","input":"hello world","encoding_format":"base64"}`)
	var s string
	_ = json.Unmarshal(b.Data[0].Embedding, &s)
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != 32 {
		t.Fatalf("base64 %q: %v", s, err)
	}
	for i := range v0 {
		if math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])) != v0[i] {
			t.Fatalf("base64 vector differs at %d", i)
		}
	}
	c := get(`{"model":"text-embedding-3-small","input":[[1,2,3],[4]],"dimensions":3}`)
	var v []float32
	_ = json.Unmarshal(c.Data[0].Embedding, &v)
	if len(v) != 3 || c.Usage.PromptTokens != 4 {
		t.Fatalf("token inputs: %+v", c)
	}
}

func slicesEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestModels(t *testing.T) {
	_, ts := start(t, Config{Models: []string{"m1", "m2"}, EmbeddingModels: []string{"e1"}})
	r := do(t, ts, "GET", "/v1/models", "", "")
	var list struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil || r.status != 200 || list.Object != "list" || len(list.Data) != 3 || list.Data[2].ID != "e1" || list.Data[0].Object != "model" {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if r := do(t, ts, "GET", "/v1/models/m2", "", ""); r.status != 200 || !strings.Contains(string(r.body), `"id":"m2"`) {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

func TestStats(t *testing.T) {
	_, ts := start(t, Config{RPM: 2})
	for range 3 {
		do(t, ts, "POST", "/v1/chat/completions", "sk-secret-a", chatBody("hi", `,"max_tokens":5`))
	}
	do(t, ts, "POST", "/v1/embeddings", "", `{"model":"text-embedding-3-small","input":"abcdefgh","dimensions":2}`)
	r := do(t, ts, "GET", "/stats", "", "")
	if r.status != 200 || strings.Contains(string(r.body), "sk-secret") {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var st Stats
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatal(err)
	}
	a := st.Keys["key-"+keyHash("sk-secret-a")]
	if a != (KeyStats{Calls: 2, RateLimited: 1, PromptTokens: 2 * 8, CompletionTokens: 2 * 5}) {
		t.Fatalf("key stats %+v in %s", a, r.body)
	}
	if anon := st.Keys["anonymous"]; anon != (KeyStats{Calls: 1, PromptTokens: 1}) { // "abcdefgh" is one cl100k_base token
		t.Fatalf("anonymous stats %+v", anon)
	}
	if st.Total != (KeyStats{Calls: 3, RateLimited: 1, PromptTokens: 17, CompletionTokens: 10}) {
		t.Fatalf("total %+v", st.Total)
	}
}

func TestConcurrentRequestsAreSafe(t *testing.T) {
	s, ts := start(t, Config{RPM: 50, TPM: 100000, Concurrency: 8})
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			r := do(t, ts, "POST", "/v1/chat/completions", "k"+strconv.Itoa(i%2), chatBody("p", `,"stream":true,"max_tokens":4`))
			if r.status != 200 && r.status != 429 {
				t.Errorf("status %d", r.status)
			}
		})
	}
	wg.Wait()
	st := s.Stats().Total
	if st.Calls+st.RateLimited != 100 || st.Calls > 100 || st.Calls < 16 {
		t.Fatalf("stats %+v", st)
	}
}

func TestOpenAIDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 300 * time.Microsecond: "1ms", 20 * time.Millisecond: "20ms", 19999 * time.Microsecond: "20ms",
		1200 * time.Millisecond: "1.2s", 8642 * time.Millisecond: "8.64s", 6 * time.Minute: "6m0s", 61500 * time.Millisecond: "1m2s",
	} {
		if got := openaiDuration(d); got != want {
			t.Errorf("openaiDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{RPM: -1}, "RPM is -1"},
		{Config{TPM: -1}, "TPM is -1"},
		{Config{Concurrency: -2}, "Concurrency is -2"},
		{Config{TTFT: -time.Second}, "TTFT is -1s"},
		{Config{TokenDelay: -time.Second}, "TokenDelay is -1s"},
		{Config{ErrorRate: 1.5}, "ErrorRate is 1.5; it is a fraction between 0 and 1"},
		{Config{DropRate: math.NaN()}, "DropRate is NaN"},
		{Config{Jitter: -0.1}, "Jitter is -0.1"},
		{Config{EmbeddingDimensions: 5000}, "EmbeddingDimensions is 5000"},
		{Config{Models: []string{"a", "a"}}, `model "a" is listed twice`},
		{Config{Models: []string{"a"}, EmbeddingModels: []string{"a"}}, `model "a" is listed twice (in Models and EmbeddingModels)`},
		{Config{Models: []string{" a"}}, "ids are non-empty"},
		{Config{APIKeys: []string{""}}, "APIKeys[0] is empty"},
		{Config{MaxBodyBytes: -1}, "MaxBodyBytes is -1"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want it to contain %q", tc.cfg, err, tc.want)
		}
		if _, err := New(tc.cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", tc.cfg, err)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
}

func TestJitterStaysInItsBounds(t *testing.T) {
	s, err := New(Config{Jitter: 0.5, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		d := s.jittered(100 * time.Millisecond)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 50*time.Millisecond || hi > 150*time.Millisecond || lo > 60*time.Millisecond || hi < 140*time.Millisecond {
		t.Fatalf("jittered 100ms ranged over [%v, %v], want about [50ms, 150ms]", lo, hi)
	}
	if d := (&Server{}).jittered(time.Second); d != time.Second {
		t.Fatalf("no jitter changed 1s to %v", d)
	}
}

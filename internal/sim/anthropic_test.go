package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func doAnthropic(t *testing.T, url, path, key, body string) reply {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, strings.NewReader(body))
	req.Header.Set("x-api-key", key)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return reply{resp.StatusCode, resp.Header, []byte(b.String())}
}

func TestMessages(t *testing.T) {
	_, ts := start(t, Config{Models: []string{"claude-sonnet-4-5"}, APIKeys: []string{"k"}, ITPM: 10000, OTPM: 1000, RPM: 100})
	body := `{"model":"claude-sonnet-4-5","max_tokens":5,"system":"Be brief.","messages":[{"role":"user","content":"hello"}]}`
	r := doAnthropic(t, ts.URL, "/v1/messages", "k", body)
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var m messageObject
	if err := json.Unmarshal(r.body, &m); err != nil || m.Type != "message" || m.Usage.InputTokens == 0 || m.Usage.OutputTokens != 5 || *m.StopReason != "max_tokens" {
		t.Fatalf("%v %s", err, r.body)
	}
	for _, h := range []string{"requests", "input-tokens", "output-tokens", "tokens"} {
		if r.header.Get("anthropic-ratelimit-"+h+"-limit") == "" || r.header.Get("anthropic-ratelimit-"+h+"-reset") == "" {
			t.Fatalf("no anthropic-ratelimit-%s-*: %v", h, r.header)
		}
	}
	ct := doAnthropic(t, ts.URL, "/v1/messages/count_tokens", "k", body)
	if ct.status != http.StatusOK || !strings.Contains(string(ct.body), `"input_tokens":`+itoa(m.Usage.InputTokens)) {
		t.Fatalf("count_tokens %d %s, want %d", ct.status, ct.body, m.Usage.InputTokens)
	}
	s := doAnthropic(t, ts.URL, "/v1/messages", "k", strings.Replace(body, `"max_tokens":5`, `"max_tokens":50,"stream":true`, 1))
	out := string(s.body)
	for _, ev := range []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"} {
		if !strings.Contains(out, "event: "+ev+"\ndata: {") {
			t.Fatalf("no %s in %s", ev, out)
		}
	}
	// Errors in Anthropic's shape.
	for _, tc := range []struct {
		key, body string
		status    int
		typ       string
	}{
		{"bad", body, 401, "authentication_error"},
		{"k", `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{"k", `{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error"},
		{"k", strings.Replace(body, `"max_tokens":5`, `"max_tokens":2000`, 1), 429, "rate_limit_error"},
	} {
		r := doAnthropic(t, ts.URL, "/v1/messages", tc.key, tc.body)
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		if r.status != tc.status || json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != tc.typ {
			t.Errorf("%s: %d %s, want %d %s", tc.body, r.status, r.body, tc.status, tc.typ)
		}
	}
}

func TestMessagesOutputLimitCorrected(t *testing.T) {
	// max_tokens 600 of an OTPM of 1000 is held up front, and what was not
	// generated comes back: two short answers in a row fit.
	_, ts := start(t, Config{Models: []string{"claude-sonnet-4-5"}, OTPM: 1000})
	body := `{"model":"claude-sonnet-4-5","max_tokens":600,"messages":[{"role":"user","content":"hello"}]}`
	for i := range 3 {
		if r := doAnthropic(t, ts.URL, "/v1/messages", "k", body); r.status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
}

func TestAzure(t *testing.T) {
	_, ts := start(t, Config{APIKeys: []string{"k"}, AzureDeployments: map[string]string{"prod-41": "gpt-4.1"}})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.URL+"/openai/deployments/prod-41/chat/completions?api-version=2024-10-21",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("api-key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var c chatCompletion
	err = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || c.Model != "gpt-4.1" {
		t.Fatalf("%d %v %+v", resp.StatusCode, err, c)
	}
	for _, path := range []string{"/openai/deployments/prod-41/chat/completions", "/openai/deployments/none/chat/completions?api-version=1"} {
		r := do(t, ts, http.MethodPost, path, "k", `{"messages":[{"role":"user","content":"hi"}]}`)
		if r.status != http.StatusNotFound {
			t.Errorf("%s: %d %s", path, r.status, r.body)
		}
	}
}

func itoa(n int64) string { return jsonInt(n) }

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/budget"
)

// accessLines returns the access log lines in logs.
func accessLines(logs string) []string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "msg=access ") {
			out = append(out, l)
		}
	}
	return out
}

// TestAccessLogAndUsageHeaders: a non-streamed answer carries its tokens
// and cost in headers, sent before the body; every request gets one
// access line at info with what it used and cost, and no key.
func TestAccessLogAndUsageHeaders(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, _ *harness) { o.AccessLog = true }})
	resp := h.post("/v1/chat/completions", tenantKey, `{"model":"gpt-4.1","max_tokens":8,"messages":[{"role":"user","content":"hello there"}]}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var ans struct {
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &ans); err != nil || ans.Usage.Prompt == 0 {
		t.Fatalf("answer without usage: %s", body)
	}
	if got := resp.Header.Get("X-Llmgate-Prompt-Tokens"); got != strconv.FormatInt(ans.Usage.Prompt, 10) {
		t.Errorf("x-llmgate-prompt-tokens %q, the body says %d", got, ans.Usage.Prompt)
	}
	if got := resp.Header.Get("X-Llmgate-Completion-Tokens"); got != strconv.FormatInt(ans.Usage.Completion, 10) {
		t.Errorf("x-llmgate-completion-tokens %q, the body says %d", got, ans.Usage.Completion)
	}
	micro, ok := h.budgets.Prices().Cost("gpt-4.1", budget.Usage{PromptTokens: ans.Usage.Prompt, CompletionTokens: ans.Usage.Completion})
	if !ok || micro == 0 {
		t.Fatal("gpt-4.1 has no default price; the test needs one")
	}
	cost := resp.Header.Get("X-Llmgate-Cost-Usd")
	if cost != usdText(micro) {
		t.Errorf("x-llmgate-cost-usd %q, want %s", cost, usdText(micro))
	}

	resp = h.post("/v1/chat/completions", "sk-not-a-key", `{"model":"gpt-4.1","messages":[{"role":"user","content":"x"}]}`)
	resp.Body.Close()

	waitIdle(t, h.gw) // the line is written once the handler ends, after the answer
	lines := accessLines(h.logs.String())
	if len(lines) != 2 {
		t.Fatalf("%d access lines, want 2:\n%s", len(lines), h.logs.String())
	}
	for _, want := range []string{"level=INFO", "tenant=team-a", "model=gpt-4.1", "deployment=sim/gpt-4.1", "status=200", "outcome=ok",
		"prompt_tokens=" + strconv.FormatInt(ans.Usage.Prompt, 10), "completion_tokens=" + strconv.FormatInt(ans.Usage.Completion, 10),
		"cost_usd=" + cost, "admission_wait_ms=", "budget_wait_ms="} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("access line lacks %s: %s", want, lines[0])
		}
	}
	if !regexp.MustCompile(`status=401 outcome=unauthorized`).MatchString(lines[1]) || strings.Contains(lines[1], "sk-not-a-key") {
		t.Errorf("the refused request's line: %s", lines[1])
	}
}

func TestAccessLogOff(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	resp := h.post("/v1/chat/completions", tenantKey, `{"model":"gpt-4.1","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Llmgate-Prompt-Tokens") == "" {
		t.Fatalf("%d, headers %v", resp.StatusCode, resp.Header)
	}
	waitIdle(t, h.gw)
	if n := len(accessLines(h.logs.String())); n != 0 {
		t.Fatalf("%d access lines with AccessLog off", n)
	}
}

// TestSetTenants: the tenants in force change whole, for the next request.
func TestSetTenants(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	chat := func(key string) int {
		resp := h.post("/v1/chat/completions", key, `{"model":"gpt-4.1","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := chat("sk-new"); st != http.StatusUnauthorized {
		t.Fatalf("unknown key: %d", st)
	}
	h.gw.SetTenants(map[string]*Tenant{sha("sk-new"): {Name: "new"}})
	if st := chat("sk-new"); st != http.StatusOK {
		t.Fatalf("new key: %d", st)
	}
	if st := chat(tenantKey); st != http.StatusUnauthorized {
		t.Fatalf("a key no longer in force: %d", st)
	}
}

func TestUSDText(t *testing.T) {
	for micro, want := range map[int64]string{0: "0.000000", 150: "0.000150", 1_234_567: "1.234567", -5: "0.000000"} {
		if got := usdText(micro); got != want {
			t.Errorf("usdText(%d) = %q, want %q", micro, got, want)
		}
	}
}

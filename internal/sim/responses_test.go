package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestResponsesJSONAndRetrieve(t *testing.T) {
	_, ts := start(t, Config{APIKeys: []string{"k1", "k2"}})
	r := do(t, ts, http.MethodPost, "/v1/responses", "k1", `{"model":"gpt-4.1","input":"hello","instructions":"Be brief."}`)
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var resp responseObject
	if err := json.Unmarshal(r.body, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Status != "completed" || resp.Usage == nil || resp.Usage.InputTokens == 0 || resp.Usage.OutputTokens != int64(len(strings.Fields(resp.Output[0].Content[0].Text))) {
		t.Fatalf("%s", r.body)
	}
	if g := do(t, ts, http.MethodGet, "/v1/responses/"+resp.ID, "k1", ""); g.status != http.StatusOK || !strings.Contains(string(g.body), resp.ID) {
		t.Fatalf("get: %d %s", g.status, g.body)
	}
	// Responses are kept per key.
	if g := do(t, ts, http.MethodGet, "/v1/responses/"+resp.ID, "k2", ""); g.status != http.StatusNotFound {
		t.Fatalf("get with another key: %d %s", g.status, g.body)
	}
	c := do(t, ts, http.MethodPost, "/v1/responses", "k2", `{"model":"gpt-4.1","input":"more","previous_response_id":"`+resp.ID+`"}`)
	if c.status != http.StatusNotFound || !strings.Contains(string(c.body), "previous_response_not_found") {
		t.Fatalf("continue with another key: %d %s", c.status, c.body)
	}
	c = do(t, ts, http.MethodPost, "/v1/responses", "k1", `{"model":"gpt-4.1","input":"more","previous_response_id":"`+resp.ID+`"}`)
	var next responseObject
	if c.status != http.StatusOK || json.Unmarshal(c.body, &next) != nil || next.Usage.InputTokens <= resp.Usage.TotalTokens {
		t.Fatalf("continue: %d %s", c.status, c.body)
	}
	if d := do(t, ts, http.MethodDelete, "/v1/responses/"+resp.ID, "k1", ""); d.status != http.StatusOK {
		t.Fatalf("delete: %d %s", d.status, d.body)
	}
	if g := do(t, ts, http.MethodGet, "/v1/responses/"+resp.ID, "k1", ""); g.status != http.StatusNotFound {
		t.Fatalf("get after delete: %d", g.status)
	}
}

func TestResponsesStream(t *testing.T) {
	_, ts := start(t, Config{})
	r := do(t, ts, http.MethodPost, "/v1/responses", "", `{"model":"gpt-4.1","input":"hello","max_output_tokens":3,"stream":true}`)
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	out := string(r.body)
	for _, ev := range []string{"response.created", "response.in_progress", "response.output_item.added", "response.output_text.delta", "response.output_text.done", "response.incomplete"} {
		if !strings.Contains(out, "event: "+ev+"\ndata: {") {
			t.Fatalf("no %s in %s", ev, out)
		}
	}
	if n := strings.Count(out, "event: response.output_text.delta\n"); n != 3 {
		t.Fatalf("%d deltas, want 3 (max_output_tokens)", n)
	}
	if !strings.Contains(out, `"output_tokens":3`) {
		t.Fatalf("final usage missing: %s", out)
	}
}

func TestResponsesRateLimited(t *testing.T) {
	_, ts := start(t, Config{RPM: 1})
	body := `{"model":"gpt-4.1","input":"hello"}`
	if r := do(t, ts, http.MethodPost, "/v1/responses", "k", body); r.status != http.StatusOK {
		t.Fatalf("%d", r.status)
	}
	r := do(t, ts, http.MethodPost, "/v1/responses", "k", body)
	if r.status != http.StatusTooManyRequests || r.header.Get("retry-after") == "" || r.header.Get("x-ratelimit-limit-requests") != "1" {
		t.Fatalf("%d %v", r.status, r.header)
	}
}

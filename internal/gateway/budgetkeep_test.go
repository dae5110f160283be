package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	budgetmemory "github.com/llmgate/llmgate/budget/memory"
	"github.com/llmgate/llmgate/internal/tokens"
)

// longStream is a provider that streams chunks content chunks, then holds
// the stream open until release is closed, then ends it with its usage.
type longStream struct {
	chunks  int
	release chan struct{}
}

func (s *longStream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	event := func(data string) {
		fmt.Fprintf(w, "data: %s\n\n", data)
		_ = rc.Flush()
	}
	const chunk = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"content":"w "},"finish_reason":null}],"usage":null}`
	for range s.chunks {
		event(chunk)
	}
	select {
	case <-s.release:
	case <-r.Context().Done():
		return
	}
	event(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`)
	event(fmt.Sprintf(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d,"total_tokens":%d}}`, s.chunks, 7+s.chunks))
	event("[DONE]")
}

// TestStreamRenewsBudgetHold: while a stream runs past the budget TTL, its
// hold stays live (renewed, not expired and charged) and grows to what was
// streamed so far, beyond the estimate, so that a replica dying now would
// be charged at least that; the settle then charges the provider's usage.
func TestStreamRenewsBudgetHold(t *testing.T) {
	const (
		ttl      = 300 * time.Millisecond
		chunks   = 300
		estimate = 10 // completion tokens reserved without max_tokens
		messages = `[{"role":"user","content":"Tell me a long story."}]`
	)
	up := &longStream{chunks: chunks, release: make(chan struct{})}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-up.release:
		default:
			close(up.release)
		}
	})
	b := budget.Budget{Tenant: "team-a", Period: budget.Month, Tokens: 1_000_000}
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		for i := range o.Deployments {
			o.Deployments[i].Target.BaseURL = srv.URL + "/v1"
		}
		o.Admission.CompletionEstimate = estimate
		bb, err := budgetmemory.Open(budgetmemory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if o.Budgets, err = budget.New(bb, budget.Config{TTL: ttl}); err != nil {
			t.Fatal(err)
		}
		h.budgets = o.Budgets
		h.teamA.Budget = &b
	}})
	prompt := int64(tokens.Chat("gpt-4.1", json.RawMessage(messages), nil))
	spend := func() budget.Status {
		t.Helper()
		st, err := h.budgets.Spend(t.Context(), b, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	start := time.Now()
	resp := h.post("/v1/chat/completions", tenantKey, `{"model":"gpt-4.1","stream":true,"messages":`+messages+`}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for got := 0; got < chunks; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d chunks: %v", got, err)
		}
		if strings.Contains(line, `"content":"w "`) {
			got++
		}
	}
	// Every chunk reached the client, so the gateway has counted them: the
	// next renewal raises the hold from the estimate to what was streamed.
	want := budget.Amount{Tokens: prompt + chunks}
	waitFor(t, func() bool { return spend().Reserved.Tokens == want.Tokens })
	// Three TTLs after the start the hold is still the live one.
	time.Sleep(time.Until(start.Add(3 * ttl))) // the subject: the TTL's time passing
	if st := spend(); st.Holds != 1 || st.Spent != (budget.Amount{}) || st.Reserved.Tokens != want.Tokens {
		t.Fatalf("3 TTLs into the stream: %+v; want its hold of %d tokens live, nothing spent", st, want.Tokens)
	}

	close(up.release)
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatal(err)
	}
	if err := h.gw.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := spend()
	if st.Spent.Tokens != 7+chunks || st.Reserved != (budget.Amount{}) || st.Holds != 0 {
		t.Fatalf("after the stream: %+v; want the provider's %d tokens spent, nothing held", st, 7+chunks)
	}
	rows, err := h.budgets.Usage(t.Context(), b.Tenant, st.Window.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Deployment != "sim/gpt-4.1" || rows[0].Requests != 1 || rows[0].Expired != 0 {
		t.Fatalf("usage rows %+v; want one settled request on sim/gpt-4.1", rows)
	}
}

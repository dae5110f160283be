package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	budgetmemory "github.com/llmgate/llmgate/budget/memory"
	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/tokens"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
)

// TestUnansweredRequestIsCharged: a non-streamed request whose client
// leaves while the provider works on it is charged its estimate (the
// prompt and max_tokens): the provider finishes and bills it all the same.
// A request whose client leaves while it waits for admission never reached
// the provider and is charged nothing.
func TestUnansweredRequestIsCharged(t *testing.T) {
	const maxTokens = 50
	arrived := make(chan struct{}, 4)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	b := budget.Budget{Tenant: "team-a", Period: budget.Month, Tokens: 1_000_000}
	counter := &enqueueCounter{Backend: rlmemory.New(clock.Real{})}
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		for i := range o.Deployments {
			o.Deployments[i].Target.BaseURL = srv.URL + "/v1"
		}
		o.Limiter = ratelimit.New(counter)
		bb, err := budgetmemory.Open(budgetmemory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if o.Budgets, err = budget.New(bb, budget.Config{}); err != nil {
			t.Fatal(err)
		}
		h.budgets = o.Budgets
		h.teamA.Budget = &b
		h.teamA.Limits = Limits{RPM: 1} // a second request waits
	}})
	spent := func() budget.Status {
		t.Helper()
		st, err := h.budgets.Spend(t.Context(), b, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	send := func(content string) func() {
		ctx, cancel := context.WithCancel(t.Context())
		body, _ := json.Marshal(map[string]any{"model": "gpt-4.1", "max_tokens": maxTokens,
			"messages": []map[string]string{{"role": "user", "content": content}}})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/v1/chat/completions", strings.NewReader(string(body)))
		req.Header.Set("Authorization", "Bearer "+tenantKey)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		return func() { cancel(); <-done }
	}
	estimate := func(content string) int64 {
		m, _ := json.Marshal([]map[string]string{{"role": "user", "content": content}})
		return int64(tokens.Chat("gpt-4.1", m, nil)) + maxTokens
	}

	cancelA := send("at the provider")
	<-arrived
	cancelB := send("waiting for admission")
	waitFor(t, func() bool { return counter.queued.Load() > 0 })
	cancelB()
	cancelA()
	want := estimate("at the provider")
	waitFor(t, func() bool { st := spent(); return st.Holds == 0 && st.Spent.Tokens == want })
	if len(arrived) != 0 {
		t.Fatal("the request cancelled while waiting reached the provider")
	}
}

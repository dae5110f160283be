package provider_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/internal/provider"
)

// A deployment that is overloaded once: Do retries after the wait the
// upstream asked for, and the caller gets the answer.
func ExampleClient_Do() {
	var calls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("retry-after-ms", "10")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("x-ratelimit-remaining-requests", "499")
		_, _ = io.WriteString(w, `{"object":"chat.completion"}`)
	}))
	defer upstream.Close()

	c, err := provider.New(provider.Config{
		BackoffBase: time.Millisecond,
		Feedback: func(t *provider.Target, f provider.Feedback) {
			fmt.Println("feedback:", t.Name, f.Status, "remaining requests:", f.RemainingRequests)
		},
	})
	if err != nil {
		panic(err)
	}
	target := &provider.Target{Name: "sim/gpt-4.1", BaseURL: upstream.URL + "/v1", APIKey: "sk-example"}
	resp, res, err := c.Do(context.Background(), target, provider.Request{
		Path: "/chat/completions",
		Body: []byte(`{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", res.Attempts, "retried:", res.Retried, "waited at least 10ms:", res.Waited >= 10*time.Millisecond)
	fmt.Println("breaker:", c.State(target.Name))
	// Output:
	// feedback: sim/gpt-4.1 200 remaining requests: 499
	// 200 {"object":"chat.completion"}
	// attempts: 2 retried: [503] waited at least 10ms: true
	// breaker: closed
}

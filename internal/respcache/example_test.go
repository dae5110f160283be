package respcache_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/respcache"
)

func ExampleCanonical() {
	c, err := respcache.Canonical([]byte(`{ "temperature": 1.0, "model": "gpt-4o",
		"messages": [{"role": "user", "content": "Caf\u00e9?"}], "n": 1, "n": 2 }`))
	fmt.Println(string(c), err)
	// Output: {"messages":[{"content":"Café?","role":"user"}],"model":"gpt-4o","n":2,"temperature":1.0} <nil>
}

func ExampleKey() {
	a, _ := respcache.Key("acme", "gpt-4o", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"user":"alice"}`), false)
	b, _ := respcache.Key("acme", "gpt-4o", []byte(`{"messages": [{"content": "hi", "role": "user"}], "model": "gpt-4o", "stream": false}`), false)
	s, _ := respcache.Key("acme", "gpt-4o", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"stream":true}`), true)
	fmt.Println(a == b, a == s)
	// Output: true false
}

// Example shows the gateway's use: look up, and on a miss store the answer
// if it is complete.
func Example() {
	ctx := context.Background()
	store := respcache.NewMemory(64<<20, clock.Real{})
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	key, err := respcache.Key("tenant:acme", "gpt-4o", body, false)
	if err != nil {
		return // not cacheable: forward uncached
	}
	if _, ok, _ := store.Get(ctx, "acme", key); !ok {
		answer := &respcache.Entry{
			Status:  http.StatusOK,
			Header:  http.Header{"Content-Type": {"application/json"}},
			Body:    []byte(`{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}]}`),
			Created: time.Now(),
		}
		if respcache.Cacheable(answer, false) {
			_ = store.Put(ctx, "acme", key, answer, 10*time.Minute)
		}
	}
	e, ok, _ := store.Get(ctx, "acme", key)
	fmt.Println(ok, e.Status)
	// Output: true 200
}

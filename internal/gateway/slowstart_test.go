package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
)

// enqueueCounter counts the requests that queue in the limiter.
type enqueueCounter struct {
	ratelimit.Backend
	queued atomic.Int64
}

func (e *enqueueCounter) Enqueue(ctx context.Context, r *ratelimit.Request, lease time.Duration) (ratelimit.Decision, bool, time.Duration, error) {
	e.queued.Add(1)
	return e.Backend.Enqueue(ctx, r, lease)
}

// streamUpstream answers every chat completion with a stream. The first
// request's answer waits for head before its headers go out, and for end
// before it ends; the others stream at once.
type streamUpstream struct {
	head, end chan struct{}
	first     sync.Once
	arrived   atomic.Int64
}

func (u *streamUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	u.arrived.Add(1)
	held := false
	u.first.Do(func() { held = true })
	if held {
		<-u.head
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}`+"\n\n")
	w.(http.Flusher).Flush()
	if held {
		<-u.end
	}
	_, _ = io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`+"\n\ndata: [DONE]\n\n")
}

// TestSlowStart: until the provider first answers, a deployment has a
// window of Options.Admission.SlowStart requests in flight; the others
// queue. Its first answer ends the slow start, and the queued requests go
// at once, although the window's one permit is still held (by a stream
// that runs on).
func TestSlowStart(t *testing.T) {
	up := &streamUpstream{head: make(chan struct{}), end: make(chan struct{})}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	counter := &enqueueCounter{Backend: rlmemory.New(clock.Real{})}
	h := newHarness(t, harnessConfig{edit: func(o *Options, _ *harness) {
		for i := range o.Deployments {
			o.Deployments[i].Target.BaseURL = srv.URL + "/v1"
		}
		o.Limiter = ratelimit.New(counter)
		o.Admission.SlowStart = 1
	}})
	t.Cleanup(func() { close(up.end) })
	const others = 5
	stream := func(i int) {
		resp := h.post("/v1/chat/completions", tenantKey, fmt.Sprintf(`{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"q%d"}]}`, i))
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("request %d: %d", i, resp.StatusCode)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { stream(0) })
	waitFor(t, func() bool { return up.arrived.Load() == 1 })
	for i := range others {
		wg.Go(func() { stream(i + 1) })
	}
	waitFor(t, func() bool { return counter.queued.Load() >= others })
	if n := up.arrived.Load(); n != 1 {
		t.Fatalf("%d requests reached the provider before it answered; the window is 1", n)
	}
	close(up.head)           // the first answer: the slow start ends
	waitFor(t, func() bool { // the queued requests go while the first streams on
		return up.arrived.Load() == 1+others
	})
	up.end <- struct{}{}
	wg.Wait()
}

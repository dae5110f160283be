package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/tokens"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
)

// extendSpy records the usage each renewal of a rate-limit reservation
// carries.
type extendSpy struct {
	ratelimit.Backend
	mu   sync.Mutex         // protects used
	used map[string][]int64 // by reservation, the usage of its last renewal ("nil" when none)
}

func (s *extendSpy) Extend(ctx context.Context, id string, hold time.Duration, used []int64) error {
	s.mu.Lock()
	s.used[id] = slices.Clone(used)
	s.mu.Unlock()
	return s.Backend.Extend(ctx, id, hold, used)
}

// renewals returns a copy of what the renewals so far carried.
func (s *extendSpy) renewals() map[string][]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]int64, len(s.used))
	for k, v := range s.used {
		out[k] = slices.Clone(v)
	}
	return out
}

// TestRenewalsCarryStreamUsage: while a stream runs past half a
// reservation hold, the keeper's renewals of its rate-limit reservation
// carry what it has used so far of each charge (1 request; the prompt and
// the chunks streamed on the tokens limit), so that if the replica died
// the reservation would expire charged that. A request that is not
// streamed is renewed without usage: its estimate stands.
func TestRenewalsCarryStreamUsage(t *testing.T) {
	const (
		hold     = 200 * time.Millisecond
		chunks   = 40
		messages = `[{"role":"user","content":"Tell me a long story."}]`
	)
	up := &longStream{chunks: chunks, release: make(chan struct{})}
	// The stream as longStream serves it; a request that is not streamed
	// is answered once released.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct{ Stream bool }
		_ = json.Unmarshal(body, &req)
		if req.Stream {
			r.Body = io.NopCloser(bytes.NewReader(body))
			up.ServeHTTP(w, r)
			return
		}
		select {
		case <-up.release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"gpt-4.1","choices":[{"index":0,"message":{"role":"assistant","content":"w"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}}`)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-up.release:
		default:
			close(up.release)
		}
	})
	spy := &extendSpy{Backend: rlmemory.New(clock.Real{}), used: map[string][]int64{}}
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		o.Limiter = ratelimit.New(spy)
		o.Admission.ReservationHold = hold
		for i := range o.Deployments {
			o.Deployments[i].Target.BaseURL = srv.URL + "/v1"
			o.Deployments[i].Limits = Limits{RPM: 1000, TPM: 1_000_000}
		}
	}})
	prompt := int64(tokens.Chat("gpt-4.1", json.RawMessage(messages), nil))

	plain := make(chan *http.Response, 1)
	go func() {
		plain <- h.post("/v1/chat/completions", tenantKey, `{"model":"gpt-4.1-mini","max_tokens":50,"messages":`+messages+`}`)
	}()
	resp := h.post("/v1/chat/completions", tenantKey, `{"model":"gpt-4.1","stream":true,"max_tokens":500,"messages":`+messages+`}`)
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
	// Every chunk reached the client, so the gateway has counted them:
	// the next renewals carry them, on the tokens limit (the second
	// charge); the other charges (requests, and the slow start's
	// concurrency while it lasts) count 1.
	streamedUsage := func(used []int64) bool {
		if len(used) < 2 || used[1] != prompt+chunks {
			return false
		}
		for i, u := range used {
			if i != 1 && u != 1 {
				return false
			}
		}
		return true
	}
	var last map[string][]int64
	waitFor(t, func() bool {
		last = spy.renewals()
		streamed, unstreamed := 0, 0
		for _, used := range last {
			switch {
			case streamedUsage(used):
				streamed++
			case used == nil:
				unstreamed++
			}
		}
		return streamed == 1 && unstreamed == 1 && len(last) == 2
	})
	close(up.release)
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatal(err)
	}
	if r := <-plain; r.StatusCode != 200 {
		t.Fatalf("the request that was not streamed: %d", r.StatusCode)
	} else {
		r.Body.Close()
	}
	t.Logf("last renewals: %v (the stream's prompt %d + %d chunks; none for the other)", last, prompt, chunks)
}

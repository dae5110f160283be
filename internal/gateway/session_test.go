package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/lock"
	lockmemory "github.com/llmgate/llmgate/lock/memory"
)

// gatedUpstream records the order requests reach the provider and holds
// them until the gate opens.
type gatedUpstream struct {
	next http.Handler
	gate chan struct{}
	mu   sync.Mutex
	seen []arrival // in arrival order
}

type arrival struct {
	body  string
	fence uint64
}

func (g *gatedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f, _ := strconv.ParseUint(r.Header.Get("X-Fencing-Token"), 10, 64)
	g.mu.Lock()
	g.seen = append(g.seen, arrival{string(b), f})
	g.mu.Unlock()
	<-g.gate
	r.Body = io.NopCloser(strings.NewReader(string(b)))
	g.next.ServeHTTP(w, r)
}

// TestSessionOrder: the turns of a session reach the provider one at a
// time, in the order they were sent, with increasing fencing tokens; other
// sessions are not held up by it.
func TestSessionOrder(t *testing.T) {
	const sessions, turns = 3, 30
	backend := lockmemory.New(clock.Real{})
	h, up := gatedHarness(t, func(o *Options, h *harness) { o.Locker = lock.New(backend) })
	body := func(s, k int) string {
		return fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":5,"messages":[{"role":"user","content":"session %d turn %d"}]}`, s, k)
	}
	var wg sync.WaitGroup
	errs := make(chan error, sessions*turns)
	for s := range sessions {
		key := "session:team-a:conv-" + strconv.Itoa(s)
		for k := range turns {
			wg.Go(func() {
				resp := h.post("/v1/chat/completions", tenantKey, body(s, k), "X-Session-Id", "conv-"+strconv.Itoa(s))
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs <- fmt.Errorf("session %d turn %d: status %d", s, k, resp.StatusCode)
				}
			})
			// Send the next turn only once this one is in the session's
			// queue (turn 0 holds the session, blocked upstream): that
			// defines the send order.
			if k > 0 {
				waitFor(t, func() bool {
					n, err := backend.Waiters(context.Background(), key)
					return err == nil && n == k
				})
			} else {
				waitFor(t, func() bool { return arrived(up, body(s, 0)) })
			}
		}
	}
	close(up.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	next := make([]int, sessions)
	lastFence := make([]uint64, sessions)
	for _, a := range up.seen {
		var s, k int
		if _, err := fmt.Sscanf(a.body[strings.Index(a.body, "session"):], "session %d turn %d", &s, &k); err != nil {
			t.Fatalf("unexpected upstream body %s", a.body)
		}
		if k != next[s] {
			t.Fatalf("session %d: turn %d reached the provider when turn %d was next", s, k, next[s])
		}
		if a.fence <= lastFence[s] {
			t.Fatalf("session %d turn %d: fencing token %d not above %d", s, k, a.fence, lastFence[s])
		}
		next[s]++
		lastFence[s] = a.fence
	}
	for s, n := range next {
		if n != turns {
			t.Fatalf("session %d: %d turns reached the provider", s, n)
		}
	}
}

func arrived(up *gatedUpstream, body string) bool {
	up.mu.Lock()
	defer up.mu.Unlock()
	for _, a := range up.seen {
		if a.body == body {
			return true
		}
	}
	return false
}

// TestSessionWaiterLeaves: a client that gives up while its turn waits
// leaves the session's queue.
func TestSessionWaiterLeaves(t *testing.T) {
	backend := lockmemory.New(clock.Real{})
	h, up := gatedHarness(t, func(o *Options, h *harness) { o.Locker = lock.New(backend) })
	first := make(chan int, 1)
	go func() {
		resp := h.post("/v1/chat/completions", tenantKey, chatBody, "X-Session-Id", "s1")
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	waitFor(t, func() bool { up.mu.Lock(); defer up.mu.Unlock(); return len(up.seen) == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", h.url+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	req.Header.Set("X-Session-Id", "s1")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, func() bool { n, _ := backend.Waiters(context.Background(), "session:team-a:s1"); return n == 1 })
	cancel()
	<-done
	waitFor(t, func() bool { n, _ := backend.Waiters(context.Background(), "session:team-a:s1"); return n == 0 })
	close(up.gate)
	if code := <-first; code != 200 {
		t.Fatal(code)
	}
	if n := len(up.seen); n != 1 {
		t.Fatalf("%d requests reached the provider; the one that left must not", n)
	}
}

package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	lockmemory "github.com/llmgate/llmgate/lock/memory"
	lockredis "github.com/llmgate/llmgate/lock/redis"
)

// gatedUpstream records the order requests reach the provider and holds
// them until the gate opens.
type gatedUpstream struct {
	next http.Handler
	gate chan struct{}
	once sync.Once // closes gate
	mu   sync.Mutex
	seen []arrival // in arrival order
}

// open lets every held request go (and those to come); safe to repeat.
func (g *gatedUpstream) open() { g.once.Do(func() { close(g.gate) }) }

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
	h, up := gatedHarness(t, func(o *Options, h *harness) { o.Sessions.Locker = lock.New(backend) })
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
	up.open()
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

// sessionBackend is a lock store whose queues a test can watch.
type sessionBackend interface {
	lock.Backend
	Waiters(ctx context.Context, key string) (int, error)
}

// sessionBackends are the lock stores the session tests run on: memory,
// and lock/redis on a real redis-server.
func sessionBackends(t *testing.T) map[string]func(t *testing.T) sessionBackend {
	return map[string]func(t *testing.T) sessionBackend{
		"memory": func(t *testing.T) sessionBackend { return lockmemory.New(clock.Real{}) },
		"redis": func(t *testing.T) sessionBackend {
			return lockredis.New(testutil.StartRedis(t).Client(t), lockredis.Config{})
		},
	}
}

// TestSessionWaiterLeaves: a client that gives up while its turn waits
// leaves the session's queue.
func TestSessionWaiterLeaves(t *testing.T) {
	for name, newBackend := range sessionBackends(t) {
		t.Run(name, func(t *testing.T) {
			backend := newBackend(t)
			h, up := gatedHarness(t, func(o *Options, h *harness) { o.Sessions.Locker = lock.New(backend) })
			t.Cleanup(up.open)
			first := make(chan int, 1)
			go func() {
				resp := h.post("/v1/chat/completions", tenantKey, chatBody, "X-Session-Id", "s1")
				resp.Body.Close()
				first <- resp.StatusCode
			}()
			waitFor(t, func() bool { return up.calls() == 1 })
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
			up.open()
			if code := <-first; code != 200 {
				t.Fatal(code)
			}
			// The session is free for the next turn, which is served.
			resp := h.post("/v1/chat/completions", tenantKey, chatBody, "X-Session-Id", "s1")
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("the next turn: %d", resp.StatusCode)
			}
			if n := up.calls(); n != 2 {
				t.Fatalf("%d requests reached the provider; the one that left must not", n)
			}
		})
	}
}

// TestSessionID: where a request's session id comes from: the configured
// header, or the body's user field with x-llmgate-session: user.
func TestSessionID(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		o.Sessions.Locker = lock.New(lockmemory.New(clock.Real{}))
		o.Sessions.Header = "x-conversation"
	}})
	withUser := func(u string) string {
		return `{"model":"gpt-4.1","user":` + u + `,"messages":[{"role":"user","content":"hi"}]}`
	}
	cases := []struct {
		name, body string
		hdr        []string
		want       string // the session id
		param      string // else the 400's param
	}{
		{"none", chatBody, nil, "", ""},
		{"header", chatBody, []string{"X-Conversation", "c-1"}, "c-1", ""},
		{"another header", chatBody, []string{"X-Session-Id", "c-1"}, "", ""},
		{"user field", withUser(`"alice@example.com"`), []string{"X-Llmgate-Session", "user"}, "alice@example.com", ""},
		{"user field, header in capitals", withUser(`"alice"`), []string{"X-Llmgate-Session", "USER"}, "alice", ""},
		{"user field without the header", withUser(`"alice"`), nil, "", ""},
		{"the session header wins", withUser(`"alice"`), []string{"X-Conversation", "c-1", "X-Llmgate-Session", "user"}, "c-1", ""},
		{"no user field", chatBody, []string{"X-Llmgate-Session", "user"}, "", "x-llmgate-session"},
		{"empty user field", withUser(`""`), []string{"X-Llmgate-Session", "user"}, "", "x-llmgate-session"},
		{"user field not a string", withUser(`5`), []string{"X-Llmgate-Session", "user"}, "", "user"},
		{"user field with a space", withUser(`"alice smith"`), []string{"X-Llmgate-Session", "user"}, "", "user"},
		{"user field too long", withUser(`"` + strings.Repeat("a", maxSessionIDLen+1) + `"`), []string{"X-Llmgate-Session", "user"}, "", "user"},
		{"unknown source", withUser(`"alice"`), []string{"X-Llmgate-Session", "conversation"}, "", "x-llmgate-session"},
		{"header with a space", chatBody, []string{"X-Conversation", "c 1"}, "", "X-Conversation"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(tc.body))
			r.Header.Set("Authorization", "Bearer "+tenantKey)
			for i := 0; i+1 < len(tc.hdr); i += 2 {
				r.Header.Set(tc.hdr[i], tc.hdr[i+1])
			}
			c := &call{}
			_, _, aerr := h.gw.prepare(httptest.NewRecorder(), r, openai.ChatCompletions, c)
			switch {
			case tc.param == "" && aerr != nil:
				t.Fatal(aerr)
			case tc.param != "" && (aerr == nil || aerr.Status != 400 || aerr.Param != tc.param):
				t.Fatalf("got %v (param %q), want a 400 about %q", aerr, func() string {
					if aerr == nil {
						return ""
					}
					return aerr.Param
				}(), tc.param)
			case tc.param == "" && c.session != tc.want:
				t.Fatalf("session %q, want %q", c.session, tc.want)
			}
		})
	}
}

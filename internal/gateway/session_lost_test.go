package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/lock"
	lockmemory "github.com/llmgate/llmgate/lock/memory"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
)

// sessionLostTTL is the session lease of the tests below: the watchdog
// renews every third of it, so a stolen lease is noticed within that, and
// each renewal comes two thirds of it (2s, more than a busy machine's
// stalls) before the lease would lapse locally and cut the request by
// itself.
const sessionLostTTL = 3 * time.Second

// stealable is the memory lock store with a way to take a lease from its
// holder behind its back, as the store sees it when the holder was paused
// past its lease and another request took the session. It can also hand
// out grants whose validity has already run out (a holder paused right
// after it got the lock) and fail renewals (a store cut off).
type stealable struct {
	*lockmemory.Backend

	mu         sync.Mutex // protects holders, lapsed, extendErr, extends
	holders    map[string]string
	lapsed     bool  // grants come with a validity already run out
	extendErr  error // returned by Extend when set
	extends    int
	fenceByKey map[string][]uint64 // fences granted, in order
}

func newStealable() *stealable {
	return &stealable{Backend: lockmemory.New(clock.Real{}), holders: map[string]string{}, fenceByKey: map[string][]uint64{}}
}

func (s *stealable) granted(key, token string, g lock.Grant, err error) (lock.Grant, error) {
	if err != nil {
		return g, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holders[key] = token
	s.fenceByKey[key] = append(s.fenceByKey[key], g.Fence)
	if s.lapsed {
		g.ValidUntil = time.Now()
	}
	return g, nil
}

func (s *stealable) Acquire(ctx context.Context, key, token string, opts lock.Options) (lock.Grant, error) {
	g, err := s.Backend.Acquire(ctx, key, token, opts)
	return s.granted(key, token, g, err)
}

func (s *stealable) TryAcquire(ctx context.Context, key, token string, opts lock.Options) (lock.Grant, error) {
	g, err := s.Backend.TryAcquire(ctx, key, token, opts)
	return s.granted(key, token, g, err)
}

func (s *stealable) Extend(ctx context.Context, key, token string, ttl time.Duration) (time.Time, error) {
	s.mu.Lock()
	s.extends++
	err := s.extendErr
	s.mu.Unlock()
	if err != nil {
		return time.Time{}, err
	}
	return s.Backend.Extend(ctx, key, token, ttl)
}

// steal frees key from its holder in the store: the first waiter, if
// any, is handed the lock. The holder finds out at its next renewal.
func (s *stealable) steal(t *testing.T, key string) {
	t.Helper()
	s.mu.Lock()
	token := s.holders[key]
	s.mu.Unlock()
	if err := s.Backend.Release(context.Background(), key, token); err != nil {
		t.Fatalf("steal %s: %v", key, err)
	}
}

func (s *stealable) fences(key string) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]uint64(nil), s.fenceByKey[key]...)
}

// sessionErr decodes an OpenAI error body.
func sessionErr(t *testing.T, body []byte) (code, typ, msg string) {
	t.Helper()
	var e struct {
		Error struct {
			Message, Type string
			Code, Param   *string
		}
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == nil {
		t.Fatalf("not an OpenAI error with a code: %q", body)
	}
	return *e.Error.Code, e.Error.Type, e.Error.Message
}

// TestSessionLostWhileWaiting: a turn whose session lease is lost while it
// waits for admission (the only concurrency permit is busy) is never sent:
// it gets 409 session_lost, and the session's next turn, which took the
// session over, is the one that reaches the provider once the permit is
// free.
func TestSessionLostWhileWaiting(t *testing.T) {
	const session = "conv-secret-4d1e9a"
	key := "session:team-a:" + session
	locks := newStealable()
	limits := rlmemory.New(clock.Real{})
	h, up := gatedHarness(t, func(o *Options, h *harness) {
		o.Sessions.Locker = lock.New(locks)
		o.Sessions.TTL = sessionLostTTL
		o.Limiter = ratelimit.New(limits)
		for i := range o.Deployments {
			o.Deployments[i].Limits = Limits{Concurrency: 1}
		}
		h.teamA.Budget = &budget.Budget{Tenant: "team-a", Period: budget.Month, Tokens: 1_000_000}
	})
	t.Cleanup(up.open)
	turn := func(k int) string {
		return fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":5,"messages":[{"role":"user","content":"turn %d"}]}`, k)
	}
	type result struct {
		status int
		header http.Header
		body   []byte
	}
	post := func(body string, hdr ...string) chan result {
		ch := make(chan result, 1)
		go func() {
			resp := h.post("/v1/chat/completions", tenantKey, body, hdr...)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			ch <- result{resp.StatusCode, resp.Header, b}
		}()
		return ch
	}
	// A request of no session takes the permit and is held upstream.
	blocker := post(chatBody)
	waitFor(t, func() bool { return up.calls() == 1 })
	// Turn 1 holds the session and waits for the permit.
	first := post(turn(1), "X-Session-Id", session)
	waitFor(t, func() bool { n, _ := limits.Waiters(context.Background(), "dep:sim/gpt-4.1"); return n == 1 })
	// Turn 2 waits for the session.
	second := post(turn(2), "X-Session-Id", session)
	waitFor(t, func() bool { n, _ := locks.Waiters(context.Background(), key); return n == 1 })

	locks.steal(t, key) // turn 2 now holds the session
	var r1 result
	select {
	case r1 = <-first:
	case <-time.After(10 * sessionLostTTL):
		t.Fatal("turn 1 still waits after its lease was lost")
	}
	if code, _, msg := sessionErr(t, r1.body); r1.status != http.StatusConflict || code != "session_lost" {
		t.Fatalf("turn 1: %d %s; want 409 session_lost", r1.status, r1.body)
	} else if !strings.Contains(msg, "lost the session's lease") {
		t.Errorf("turn 1's message %q does not say why", msg)
	}
	if v := r1.header.Get("X-Should-Retry"); v != "false" {
		t.Errorf("x-should-retry %q; want false (a retry would come after turn 2)", v)
	}

	up.open()
	for name, ch := range map[string]chan result{"blocker": blocker, "turn 2": second} {
		if r := <-ch; r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", name, r.status, r.body)
		}
	}
	up.mu.Lock()
	seen := append([]arrival(nil), up.seen...)
	up.mu.Unlock()
	if len(seen) != 2 || seen[0].body != chatBody || seen[1].body != turn(2) {
		t.Fatalf("the provider saw %d requests (%v); want the blocker, then turn 2 only", len(seen), seen)
	}
	if f := locks.fences(key); len(f) != 2 || seen[1].fence != f[1] || f[1] <= f[0] {
		t.Errorf("fences granted %v, turn 2 sent %d; want turn 2's, above turn 1's", f, seen[1].fence)
	}
	if n := promtestutil.ToFloat64(h.gw.metrics.sessionsLost); n != 1 {
		t.Errorf("llmgate_session_leases_lost_total = %v; want 1", n)
	}
	// Turn 1 gave back what it held: the permit is free (no wait), and
	// its budget hold is gone. The others settle after their answers:
	// wait for that first.
	if err := h.gw.pending.wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	resp := h.post("/v1/chat/completions", tenantKey, chatBody, "X-Llmgate-Max-Wait", "0")
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a request after the others: %d; the permit is still held", resp.StatusCode)
	}
	if err := h.gw.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	st, err := h.budgets.Spend(t.Context(), *h.teamA.Budget, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	used := promtestutil.ToFloat64(h.gw.metrics.tokens.WithLabelValues("team-a", "gpt-4.1", "sim/gpt-4.1", "prompt")) +
		promtestutil.ToFloat64(h.gw.metrics.tokens.WithLabelValues("team-a", "gpt-4.1", "sim/gpt-4.1", "completion"))
	if st.Holds != 0 || float64(st.Spent.Tokens) != used {
		t.Errorf("budget: %d holds, %d tokens spent; want 0 holds and the %v tokens of the 3 requests answered", st.Holds, st.Spent.Tokens, used)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "session lease lost") {
		t.Errorf("no log line about the lost lease:\n%s", logs)
	}
	if strings.Contains(logs, session) {
		t.Errorf("the session id appeared in the logs:\n%s", logs)
	}
}

// streamingUpstream answers every stream with a few content chunks and
// then holds it open until the request is cancelled, which it records.
type streamingUpstream struct {
	chunks    int
	cancelled chan struct{} // closed when a held stream's request ends
	once      sync.Once
}

func (u *streamingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for i := range u.chunks {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w%d \"}}]}\n\n", i)
		_ = rc.Flush()
	}
	<-r.Context().Done()
	u.once.Do(func() { close(u.cancelled) })
}

// TestSessionLostMidStream: a stream whose session lease is lost while it
// runs is cut at once: the upstream request is cancelled, the client's
// stream ends with a session_lost error event (no [DONE]), and what was
// streamed is charged.
func TestSessionLostMidStream(t *testing.T) {
	const session, chunks = "conv-stream", 3
	key := "session:team-a:" + session
	locks := newStealable()
	up := &streamingUpstream{chunks: chunks, cancelled: make(chan struct{})}
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		srv := httptest.NewServer(up)
		h.t.Cleanup(srv.Close)
		for i := range o.Deployments {
			o.Deployments[i].Target.BaseURL = srv.URL + "/v1"
			o.Deployments[i].Limits = Limits{Concurrency: 1}
		}
		o.Sessions.Locker = lock.New(locks)
		o.Sessions.TTL = sessionLostTTL
		h.teamA.Budget = &budget.Budget{Tenant: "team-a", Period: budget.Month, Tokens: 1_000_000}
	}})
	resp := h.post("/v1/chat/completions", tenantKey,
		`{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"a long answer"}]}`, "X-Session-Id", session)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rd := bufio.NewReader(resp.Body)
	var events []string
	next := func() string {
		t.Helper()
		var ev strings.Builder
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				if ev.Len() > 0 {
					return ev.String()
				}
				return ""
			}
			if line == "\n" {
				return ev.String()
			}
			ev.WriteString(line)
		}
	}
	for len(events) < chunks {
		ev := next()
		if ev == "" {
			t.Fatalf("the stream ended after %d events", len(events))
		}
		if !strings.Contains(ev, `"chat.completion.chunk"`) {
			t.Fatalf("event %d is %q, want a content chunk (the lease was lost before the steal?)", len(events), ev)
		}
		events = append(events, ev)
	}

	locks.steal(t, key)
	select {
	case <-up.cancelled:
	case <-time.After(10 * sessionLostTTL):
		t.Fatal("the upstream stream was not cancelled after the lease was lost")
	}
	var rest []string
	for ev := next(); ev != ""; ev = next() {
		rest = append(rest, ev)
	}
	if len(rest) != 1 || !strings.HasPrefix(rest[0], "data: {\"error\"") {
		t.Fatalf("after the lease was lost the client got %q; want one error event", rest)
	}
	if code, _, _ := sessionErr(t, []byte(strings.TrimPrefix(strings.TrimSpace(rest[0]), "data: "))); code != "session_lost" {
		t.Fatalf("error event %s; want code session_lost", rest[0])
	}
	if n := promtestutil.ToFloat64(h.gw.metrics.sessionsLost); n != 1 {
		t.Errorf("llmgate_session_leases_lost_total = %v; want 1", n)
	}
	resp.Body.Close()

	// The stream is charged what it streamed (the prompt estimate and a
	// token per chunk), and nothing stays held.
	if err := h.gw.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	st, err := h.budgets.Spend(t.Context(), *h.teamA.Budget, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	prompt := promtestutil.ToFloat64(h.gw.metrics.tokens.WithLabelValues("team-a", "gpt-4.1", "sim/gpt-4.1", "prompt"))
	completion := promtestutil.ToFloat64(h.gw.metrics.tokens.WithLabelValues("team-a", "gpt-4.1", "sim/gpt-4.1", "completion"))
	if st.Holds != 0 || completion != chunks || prompt <= 0 || float64(st.Spent.Tokens) != prompt+completion {
		t.Errorf("budget: %d holds, %d tokens spent; tokens counted %v+%v; want 0 holds, %d completion tokens, all charged",
			st.Holds, st.Spent.Tokens, prompt, completion, chunks)
	}
}

// TestConfirmSession: the check before each upstream attempt passes a
// lease well within its validity without asking the store; one whose
// validity ran out locally (a paused replica) is confirmed with the
// store, and refused if the store says it is someone else's now or cannot
// answer.
func TestConfirmSession(t *testing.T) {
	const key = "session:team-a:s"
	for _, tc := range []struct {
		name      string
		lapsed    bool
		steal     bool
		extendErr error
		want      error
		extends   int
	}{
		{name: "valid", want: nil, extends: 0},
		{name: "lapsed, still held", lapsed: true, want: nil, extends: 1},
		{name: "lapsed, taken over", lapsed: true, steal: true, want: errSessionLost, extends: 1},
		{name: "lapsed, store down", lapsed: true, extendErr: errors.New("connection refused"), want: errSessionUnconfirmed, extends: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStealable()
			s.lapsed = tc.lapsed
			lease, err := lock.New(s).TryAcquire(t.Context(), key, lock.Options{TTL: sessionLostTTL})
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(context.Background())
			if tc.steal {
				s.steal(t, key)
				if _, err := s.TryAcquire(t.Context(), key, lock.NewToken(), lock.Options{TTL: sessionLostTTL}.WithDefaults()); err != nil {
					t.Fatal(err)
				}
			}
			s.extendErr = tc.extendErr
			err = confirmSession(t.Context(), lease)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("confirmSession: %v; want %v", err, tc.want)
			}
			s.mu.Lock()
			n := s.extends
			s.mu.Unlock()
			if n != tc.extends {
				t.Errorf("%d store calls; want %d", n, tc.extends)
			}
			if tc.steal && !errors.Is(lease.Err(), lock.ErrLost) {
				t.Errorf("the lease's end: %v; want lost", lease.Err())
			}
		})
	}
}

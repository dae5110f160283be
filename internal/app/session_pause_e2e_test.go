//go:build unix

package app

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
	lockredis "github.com/llmgate/llmgate/lock/redis"
)

// laneWaiters counts the requests queued for admission in every lane of
// the Redis rate-limit store (the lanes' sorted sets, "...:q:LANE").
func laneWaiters(t *testing.T, ctx context.Context, c rueidis.Client) int64 {
	t.Helper()
	var n int64
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match("llmgate:rl:*:q:*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range e.Elements {
			m, err := c.Do(ctx, c.B().Zcard().Key(k).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			n += m
		}
		if e.Cursor == 0 {
			return n
		}
		cursor = e.Cursor
	}
}

// pausedTurnRE reads the turn back from a request body of session "p".
var pausedTurnRE = regexp.MustCompile(`session p turn (\d+)"`)

// checkSessionCalls checks what the provider saw of session "p": the
// turns want, in that order, each arriving after the provider was done
// with the one before (never two at once), with increasing fencing tokens.
func checkSessionCalls(t *testing.T, calls []upstreamCall, want []int) {
	t.Helper()
	var got []int
	var prev *upstreamCall
	var prevFence uint64
	for i := range calls {
		c := &calls[i]
		m := pausedTurnRE.FindStringSubmatch(c.Body)
		if m == nil {
			continue
		}
		k, _ := strconv.Atoi(m[1])
		got = append(got, k)
		fence, err := strconv.ParseUint(c.Fence, 10, 64)
		if err != nil {
			t.Errorf("turn %d reached the provider with x-fencing-token %q", k, c.Fence)
		}
		if prev != nil {
			if prev.Done.IsZero() || c.At.Before(prev.Done) {
				t.Errorf("turn %d reached the provider at %s, while it was still serving the turn before (done %s)",
					k, c.At.Format("15:04:05.000"), prev.Done.Format("15:04:05.000"))
			}
			if fence <= prevFence {
				t.Errorf("turn %d: fencing token %d, not above the previous turn's %d", k, fence, prevFence)
			}
		}
		prev, prevFence = c, fence
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the provider saw turns %v of the session, in that order; want %v", got, want)
	}
}

// checkLost checks the paused replica's account of the lost lease: one
// in llmgate_session_leases_lost_total, a warning in its log, and the
// session id nowhere in it.
func checkLost(t *testing.T, ctx context.Context, r *replica, session string) {
	t.Helper()
	if n, err := r.Metric(ctx, "llmgate_session_leases_lost_total"); err != nil || n != 1 {
		t.Errorf("%s: llmgate_session_leases_lost_total = %v (%v); want 1", r.Name, n, err)
	}
	out := r.Stderr.String()
	if !strings.Contains(out, "session lease lost") {
		t.Errorf("%s logged nothing about the lost lease:\n%s", r.Name, out)
	}
	if strings.Contains(out, session) {
		t.Errorf("%s logged the session id %q:\n%s", r.Name, session, out)
	}
}

// TestE2ESessionHolderPaused: 3 replicas on one Redis, sessions.ttl 2s.
// The replica holding a session (A) is paused with SIGSTOP past the TTL,
// another replica (B) sends the session's next turn, then A runs again
// (SIGCONT). The provider receives the session's turns in send order,
// never two at once, with increasing fencing tokens; the paused turn gets
// session_lost, counted and logged on A, and A serves the next turn.
func TestE2ESessionHolderPaused(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		ttl     = 2 * time.Second
		session = "conv-paused-7e1b"
		// margin is what a loaded 2-core machine adds to any wait below:
		// the waiter noticing, and the call.
		margin = 5 * time.Second
	)
	turn := func(k int) string {
		return fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":4,"messages":[{"role":"user","content":"session p turn %d"}]}`, k)
	}
	hdr := []string{"X-Session-Id", session}
	key := "session:team-a:" + session

	// A waits for admission (the provider's only concurrency permit is
	// busy) when it is paused; the permit is freed while it sleeps, so it
	// would find its admission granted when it runs again. Its turn must
	// not be sent: it lost the session to turn 2 meanwhile.
	t.Run("waiting for admission", func(t *testing.T) {
		const hold = 3 * ttl
		rds := testutil.StartRedis(t)
		s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
		reps := e2eutil.StartReplicas(t, 3, gatewayConfig{Store: rds.URL(), SimURL: s.URL, LogLevel: "info",
			Limits: "{concurrency: 1}", MaxWait: "60s",
			// The blocker's permit must outlive a stalled renewal on a
			// loaded machine (renewed every half hold), or it frees and
			// turn 1 goes out before A is paused: three TTLs.
			Extra: fmt.Sprintf("sessions: {ttl: %v}\nratelimit: {reservation_hold: %v}\n", ttl, hold)})
		ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
		defer cancel()
		client := rds.Client(t)
		locks := lockredis.New(client, lockredis.Config{})

		s.Hold()
		blocker := make(chan reply, 1)
		go func() {
			blocker <- e2eutil.Send(ctx, reps[2], `{"model":"gpt-4.1","max_tokens":4,"messages":[{"role":"user","content":"blocker"}]}`)
		}()
		s.WaitArrival(t, "blocker", 30*time.Second)
		first := make(chan reply, 1)
		go func() { first <- e2eutil.Send(ctx, reps[0], turn(1), hdr...) }()
		waitUntil(t, 30*time.Second, "turn 1 waits for admission", func() bool { return laneWaiters(t, ctx, client) == 1 })

		resume := reps[0].Pause(t)
		pausedAt := time.Now()
		for _, c := range s.Seen() {
			if strings.Contains(c.Body, `session p turn 1"`) {
				t.Fatal("turn 1 reached the provider before A was paused: it was not waiting for admission")
			}
		}
		second := make(chan reply, 1)
		go func() { second <- e2eutil.Send(ctx, reps[1], turn(2), hdr...) }()
		waitUntil(t, 30*time.Second, "turn 2 waits for the session", func() bool {
			n, err := locks.Waiters(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			return n == 1 || time.Since(pausedAt) > ttl // past the TTL it may hold it already
		})
		s.Release() // the permit is free: the paused turn 1 is first in line for it

		// A's lease runs out within the TTL of the pause; the permit the
		// queue handed to the paused A, within one reservation hold of
		// that.
		bound := ttl + hold + margin
		s.WaitArrival(t, `session p turn 2"`, bound)
		t.Logf("turn 2 reached the provider %v after its session's holder was paused", time.Since(pausedAt).Round(time.Millisecond))
		if r := <-second; r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("turn 2 via %s: %d %v %s", reps[1].Name, r.Status, r.Err, r.Body)
		}
		if b := <-blocker; b.Err != nil || b.Status != http.StatusOK {
			t.Fatalf("blocker: %d %v %s", b.Status, b.Err, b.Body)
		}

		resume()
		resumedAt := time.Now()
		var r1 reply
		select {
		case r1 = <-first:
		case <-time.After(ttl + margin):
			t.Fatalf("turn 1 not answered within %v of SIGCONT", ttl+margin)
		}
		t.Logf("turn 1 answered %v after SIGCONT", r1.Done.Sub(resumedAt).Round(time.Millisecond))
		if r := e2eutil.Send(ctx, reps[0], turn(3), hdr...); r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("turn 3 via %s after it ran again: %d %v %s", reps[0].Name, r.Status, r.Err, r.Body)
		}
		checkSessionCalls(t, s.Seen(), []int{2, 3})
		if r1.Err != nil || r1.Status != http.StatusConflict {
			t.Fatalf("turn 1 via the paused %s: %d %v %s; want 409 session_lost", reps[0].Name, r1.Status, r1.Err, r1.Body)
		}
		if e := decodeError(t, r1.Body); e.Error.Code != "session_lost" || r1.Header.Get("X-Should-Retry") != "false" {
			t.Errorf("turn 1 via the paused %s: %s (x-should-retry %q); want session_lost, not to be retried automatically",
				reps[0].Name, r1.Body, r1.Header.Get("X-Should-Retry"))
		}
		checkLost(t, ctx, reps[0], session)
	})

	// A is paused in the middle of relaying turn 1's stream; the provider
	// finishes writing it into A's socket while A sleeps. When A runs
	// again the rest is not relayed: the stream ends with session_lost,
	// and turn 2 has been served meanwhile.
	t.Run("mid-stream", func(t *testing.T) {
		rds := testutil.StartRedis(t)
		// 6 tokens a 40th of the TTL apart: the provider is done with the
		// stream well before A's lease can run out.
		s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}, TokenDelay: ttl / 40})
		reps := e2eutil.StartReplicas(t, 3, gatewayConfig{Store: rds.URL(), SimURL: s.URL, LogLevel: "info",
			Extra: fmt.Sprintf("sessions: {ttl: %v}\n", ttl)})
		ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
		defer cancel()

		type streamed struct {
			events []string
			err    error
		}
		started := make(chan struct{})
		first := make(chan streamed, 1)
		go func() {
			var out streamed
			defer func() { first <- out }()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, reps[0].URL+"/v1/chat/completions", strings.NewReader(
				`{"model":"gpt-4.1","max_tokens":6,"stream":true,"messages":[{"role":"user","content":"session p turn 1"}]}`))
			if err != nil {
				out.err = err
				return
			}
			req.Header.Set("Authorization", "Bearer "+e2eutil.TenantKey)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(hdr[0], hdr[1])
			resp, err := e2eutil.HTTP.Do(req)
			if err != nil {
				out.err = err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				out.err = fmt.Errorf("status %d", resp.StatusCode)
				return
			}
			sc := bufio.NewScanner(resp.Body)
			once := sync.Once{}
			for sc.Scan() {
				line := sc.Text()
				if !strings.HasPrefix(line, "data: ") {
					continue
				}
				out.events = append(out.events, line)
				if strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
					once.Do(func() { close(started) })
				}
			}
			out.err = sc.Err()
		}()
		select {
		case <-started:
		case r := <-first:
			t.Fatalf("turn 1's stream ended before its first token: %v %q", r.err, r.events)
		case <-time.After(30 * time.Second):
			t.Fatal("turn 1's stream sent no token within 30s")
		}
		resume := reps[0].Pause(t)
		pausedAt := time.Now()
		r2 := e2eutil.Send(ctx, reps[1], turn(2), hdr...)
		t.Logf("turn 2 answered %v after its session's holder was paused mid-stream", r2.Done.Sub(pausedAt).Round(time.Millisecond))
		if r2.Err != nil || r2.Status != http.StatusOK {
			t.Fatalf("turn 2 via %s: %d %v %s", reps[1].Name, r2.Status, r2.Err, r2.Body)
		}
		if took := r2.Done.Sub(pausedAt); took > ttl+margin {
			t.Errorf("turn 2 waited %v after the pause; a paused holder may keep a session for at most the lease (%v) plus a margin", took, ttl)
		}

		resume()
		var r1 streamed
		select {
		case r1 = <-first:
		case <-time.After(ttl + margin):
			t.Fatalf("turn 1's stream did not end within %v of SIGCONT", ttl+margin)
		}
		if r1.err != nil {
			t.Fatalf("turn 1's stream: %v (events %q)", r1.err, r1.events)
		}
		last := r1.events[len(r1.events)-1]
		if !strings.HasPrefix(last, `data: {"error":`) || !strings.Contains(last, `"code":"session_lost"`) {
			t.Errorf("turn 1's stream ended with %q; want a session_lost error event (events %q)", last, r1.events)
		}
		for _, ev := range r1.events {
			if ev == "data: [DONE]" {
				t.Errorf("turn 1's stream was relayed to its end after the lease was lost: %q", r1.events)
			}
		}
		if r := e2eutil.Send(ctx, reps[0], turn(3), hdr...); r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("turn 3 via %s after it ran again: %d %v %s", reps[0].Name, r.Status, r.Err, r.Body)
		}
		checkSessionCalls(t, s.Seen(), []int{1, 2, 3})
		checkLost(t, ctx, reps[0], session)
	})
}

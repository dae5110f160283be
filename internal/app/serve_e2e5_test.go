//go:build unix

package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dedupredis "github.com/llmgate/llmgate/dedup/redis"
	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/internal/tokens"
	lockredis "github.com/llmgate/llmgate/lock/redis"
)

// End-to-end tests of what replicas share beyond limits and budgets:
// de-duplication of identical requests, idempotency keys, the response
// cache and session ordering. Each runs three 'llmgate serve' processes on
// one real redis-server in front of the simulated provider, which records
// what reaches it and can hold requests until the test releases them, so
// that "all in flight at once" is a fact the test waits for, not a hope.

const (
	// shareTimeout bounds every request of these tests.
	shareTimeout = 60 * time.Second
	// followerSeries counts requests that followed another's upstream call.
	followerSeries = `llmgate_dedup_total{role="follower"}`
)

// TestE2EDedupAcrossReplicas: 100 identical temperature-0 requests spread
// over three replicas while the provider holds the first one make exactly
// one upstream call; all 100 get the same answer, byte for byte (streams:
// the same events in the same order), one as the leader and 99 as
// followers, each with its own request id.
func TestE2EDedupAcrossReplicas(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	rds := testutil.StartRedis(t)
	// A delay per token, so that followers relay a stream while it is
	// being produced.
	s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}, TokenDelay: 2 * time.Millisecond})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{Store: rds.URL(), SimURL: s.URL, LogLevel: "info"})
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) { dedupBurst(t, s, reps, stream) })
	}
}

func dedupBurst(t *testing.T, s *gatedSim, reps []*replica, stream bool) {
	const n = 100
	ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
	defer cancel()
	prompt := fmt.Sprintf("one question for everyone (stream=%v)", stream)
	// Key order and whitespace differ between callers: the same request.
	forms := [2]string{
		fmt.Sprintf(`{"model":"gpt-4.1","temperature":0,"max_tokens":24,"stream":%v,"messages":[{"role":"user","content":%q}]}`, stream, prompt),
		fmt.Sprintf(`{ "messages": [ {"content": %q, "role": "user"} ], "stream": %v, "max_tokens": 24, "temperature": 0, "model": "gpt-4.1" }`, prompt, stream),
	}
	followersBefore := e2eutil.SumMetric(t, ctx, reps, followerSeries)
	callsBefore, simBefore := s.Count(), s.Stats().Total.Calls
	s.Hold()
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = e2eutil.Send(ctx, reps[i%len(reps)], forms[i%2], "X-Request-Id", fmt.Sprintf("dedup-%v-%d", stream, i))
		})
	}
	// Every request is in the flight before the provider answers.
	waitUntil(t, 30*time.Second, fmt.Sprintf("1 request reached the provider and %d follow it", n-1), func() bool {
		if c := s.Count() - callsBefore; c > 1 {
			t.Fatalf("%d identical requests reached the provider", c)
		}
		return s.Count()-callsBefore == 1 && e2eutil.SumMetric(t, ctx, reps, followerSeries)-followersBefore == n-1
	})
	s.Release()
	wg.Wait()

	leader := -1
	roles := map[string]int{}
	for i, r := range replies {
		if r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("request %d via %s: %d %v %s", i, reps[i%len(reps)].Name, r.Status, r.Err, r.Body)
		}
		role := r.Header.Get("X-Llmgate-Dedup")
		roles[role]++
		if role == "leader" {
			leader = i
		}
		if got, want := r.Header.Get("X-Request-Id"), fmt.Sprintf("dedup-%v-%d", stream, i); got != want {
			t.Errorf("request %d: x-request-id %q, want its own %q", i, got, want)
		}
	}
	if roles["leader"] != 1 || roles["follower"] != n-1 || leader < 0 {
		t.Fatalf("x-llmgate-dedup roles %v; want 1 leader and %d followers", roles, n-1)
	}
	want := replies[leader]
	for i, r := range replies {
		if !bytes.Equal(r.Body, want.Body) {
			t.Fatalf("request %d (%s) got another answer than the leader (request %d):\n%s\n--- leader ---\n%s",
				i, r.Header.Get("X-Llmgate-Dedup"), leader, r.Body, want.Body)
		}
		if ct := r.Header.Get("Content-Type"); ct != want.Header.Get("Content-Type") {
			t.Errorf("request %d: content-type %q, the leader's %q", i, ct, want.Header.Get("Content-Type"))
		}
	}
	if calls, served := s.Count()-callsBefore, s.Stats().Total.Calls-simBefore; calls != 1 || served != 1 {
		t.Fatalf("%d requests reached the provider (%d served); want 1", calls, served)
	}
	if stream {
		evs := sseEvents(want.Body)
		if len(evs) < 4 || evs[len(evs)-1] != "data: [DONE]" || !strings.HasPrefix(want.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("the shared stream is not a complete SSE stream (%d events, %q):\n%s", len(evs), want.Header.Get("Content-Type"), want.Body)
		}
		t.Logf("leader: request %d via %s; 99 followers relayed the same %d events (%d bytes)", leader, reps[leader%len(reps)].Name, len(evs), len(want.Body))
		return
	}
	var cc struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(want.Body, &cc); err != nil || len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" {
		t.Fatalf("the shared answer is not a chat completion (%v): %s", err, want.Body)
	}
	t.Logf("leader: request %d via %s; 99 followers got the same %d bytes", leader, reps[leader%len(reps)].Name, len(want.Body))
}

// TestE2EIdempotencyKeyAcrossReplicas: a request with an Idempotency-Key
// is answered once; a retry through another replica after it completed
// gets the stored answer, byte for byte, without an upstream call (also
// with the body's keys in another order); the key with another body gets
// 409 on every replica, and the stored answer survives that.
func TestE2EIdempotencyKeyAcrossReplicas(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	rds := testutil.StartRedis(t)
	s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{Store: rds.URL(), SimURL: s.URL, LogLevel: "info"})
	ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
	defer cancel()
	const key = "order-42-attempt"
	body := `{"model":"gpt-4.1","max_tokens":12,"messages":[{"role":"user","content":"charge order 42"}]}`
	reordered := `{ "messages": [ {"content": "charge order 42", "role": "user"} ], "max_tokens": 12, "model": "gpt-4.1" }`

	first := e2eutil.Send(ctx, reps[0], body, "Idempotency-Key", key)
	if first.Err != nil || first.Status != http.StatusOK || first.Header.Get("X-Llmgate-Dedup") != "leader" {
		t.Fatalf("first request via %s: %d %v role %q %s", reps[0].Name, first.Status, first.Err, first.Header.Get("X-Llmgate-Dedup"), first.Body)
	}
	// Completed: the flight is finished in Redis and kept for
	// dedup.idempotency_ttl (24h by default).
	rc := rds.Client(t)
	hkey := dedupredis.New(rc, dedupredis.Config{}).Key("idem:team-a:" + key)
	waitUntil(t, 10*time.Second, "the idempotent flight is finished in Redis", func() bool {
		st, err := rc.Do(ctx, rc.B().Hget().Key(hkey).Field("s").Build()).ToString()
		return err == nil && st == "f"
	})
	if ttl, err := rc.Do(ctx, rc.B().Pttl().Key(hkey).Build()).AsInt64(); err != nil || time.Duration(ttl)*time.Millisecond < 23*time.Hour {
		t.Errorf("the stored answer expires in %dms (%v); want about 24h", ttl, err)
	}
	if c := s.Count(); c != 1 {
		t.Fatalf("%d requests reached the provider", c)
	}

	retries := []struct {
		r    *replica
		body string
	}{{reps[1], body}, {reps[2], body}, {reps[2], reordered}, {reps[0], body}}
	for i, rt := range retries {
		got := e2eutil.Send(ctx, rt.r, rt.body, "Idempotency-Key", key)
		if got.Err != nil || got.Status != http.StatusOK || !bytes.Equal(got.Body, first.Body) || got.Header.Get("X-Llmgate-Dedup") != "follower" {
			t.Fatalf("retry %d via %s: %d %v role %q\n%s\nwant the stored\n%s", i, rt.r.Name, got.Status, got.Err,
				got.Header.Get("X-Llmgate-Dedup"), got.Body, first.Body)
		}
	}
	if c := s.Count(); c != 1 {
		t.Fatalf("%d requests reached the provider; retries must get the stored answer", c)
	}

	other := strings.Replace(body, "order 42", "order 43", 1)
	for _, r := range reps {
		got := e2eutil.Send(ctx, r, other, "Idempotency-Key", key)
		if got.Err != nil {
			t.Fatal(got.Err)
		}
		if e := decodeError(t, got.Body); got.Status != http.StatusConflict || e.Error.Code != "idempotency_key_reused" {
			t.Errorf("the key with another body via %s: %d %s; want 409 idempotency_key_reused", r.Name, got.Status, got.Body)
		}
	}
	if again := e2eutil.Send(ctx, reps[1], body, "Idempotency-Key", key); again.Status != http.StatusOK || !bytes.Equal(again.Body, first.Body) {
		t.Errorf("after the conflicts, a retry via %s: %d %v %s", reps[1].Name, again.Status, again.Err, again.Body)
	}
	if c := s.Count(); c != 1 {
		t.Errorf("%d requests reached the provider in all; want 1", c)
	}
}

// TestE2EDedupLeaderKilled: 24 identical requests over three replicas; the
// provider holds the leader's call. The leader's replica (the one whose
// request id reached the provider) is killed with SIGKILL, then the
// provider lets the call go. The clients of the killed replica lose their
// connection; the followers on the other replicas take over within the
// lease TTL (2s) and a new upstream call: all of them get 200 and the same
// answer, one of them as the new leader; the provider saw two calls in all
// (the dead one and the takeover).
func TestE2EDedupLeaderKilled(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		leaseTTL   = 2 * time.Second
		perReplica = 8
		// takeoverBound: the dead leader's lease runs out within leaseTTL
		// and followers check it every leaseTTL/3; the margin is the new
		// upstream call on a loaded 2-core machine.
		takeoverBound = leaseTTL + leaseTTL/3 + 5*time.Second
		// clientDeadline bounds every client: none may hang.
		clientDeadline = 30 * time.Second
	)
	rds := testutil.StartRedis(t)
	s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}, TokenDelay: 2 * time.Millisecond})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{
		Store: rds.URL(), SimURL: s.URL, LogLevel: "info", Extra: fmt.Sprintf("dedup: {lease_ttl: %v}\n", leaseTTL),
	})
	ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
	defer cancel()
	body := `{"model":"gpt-4.1","temperature":0,"max_tokens":16,"messages":[{"role":"user","content":"who takes over?"}]}`

	s.Hold()
	replies := make([][]reply, len(reps))
	var wg sync.WaitGroup
	for ri, r := range reps {
		replies[ri] = make([]reply, perReplica)
		for i := range perReplica {
			wg.Go(func() {
				rctx, rcancel := context.WithTimeout(ctx, clientDeadline)
				defer rcancel()
				replies[ri][i] = e2eutil.Send(rctx, r, body, "X-Request-Id", fmt.Sprintf("kill-%d-%d", ri, i))
			})
		}
	}
	total := len(reps) * perReplica
	waitUntil(t, 30*time.Second, fmt.Sprintf("1 request reached the provider and %d follow it", total-1), func() bool {
		return s.Count() == 1 && e2eutil.SumMetric(t, ctx, reps, followerSeries) == float64(total-1)
	})
	// The leader is on the replica whose request reached the provider.
	leaderID := s.Seen()[0].RequestID
	var li, lj int
	if _, err := fmt.Sscanf(leaderID, "kill-%d-%d", &li, &lj); err != nil || li < 0 || li >= len(reps) {
		t.Fatalf("the provider saw x-request-id %q (%v); want one of the test's", leaderID, err)
	}
	dead := reps[li]
	dead.Kill(t)
	killedAt := time.Now()
	s.Release()
	wg.Wait()

	var (
		answer  []byte
		leaders []string
		slowest time.Duration
	)
	for ri, rs := range replies {
		for i, r := range rs {
			if ri == li {
				// Its clients lose their connection; none may hang.
				if r.Err == nil {
					t.Errorf("request %d via the killed %s: %d %s; want a broken connection", i, dead.Name, r.Status, r.Body)
				}
				continue
			}
			if r.Err != nil || r.Status != http.StatusOK {
				t.Errorf("request %d via %s: %d %v %s", i, reps[ri].Name, r.Status, r.Err, r.Body)
				continue
			}
			took := r.Done.Sub(killedAt)
			slowest = max(slowest, took)
			if took > takeoverBound {
				t.Errorf("request %d via %s answered %v after the kill; the takeover must take at most %v", i, reps[ri].Name, took, takeoverBound)
			}
			if answer == nil {
				answer = r.Body
			} else if !bytes.Equal(r.Body, answer) {
				t.Errorf("request %d via %s got another answer:\n%s\nwant\n%s", i, reps[ri].Name, r.Body, answer)
			}
			if r.Header.Get("X-Llmgate-Dedup") == "leader" {
				leaders = append(leaders, r.Header.Get("X-Request-Id"))
			}
		}
	}
	calls := s.Seen()
	t.Logf("leader %s on %s killed; the followers were answered within %v of the kill; the provider saw %d calls (the second from %s)",
		leaderID, dead.Name, slowest.Round(time.Millisecond), len(calls), calls[len(calls)-1].RequestID)
	if len(calls) != 2 {
		t.Fatalf("%d calls reached the provider; want 2 (the dead leader's and the takeover)", len(calls))
	}
	if len(leaders) != 1 || leaders[0] != calls[1].RequestID {
		t.Errorf("new leaders %v; want exactly the request whose call reached the provider second (%s)", leaders, calls[1].RequestID)
	}
	if strings.HasPrefix(calls[1].RequestID, fmt.Sprintf("kill-%d-", li)) {
		t.Errorf("the takeover call %s came from the killed replica", calls[1].RequestID)
	}
}

// TestE2ECacheHitsAcrossReplicas: a tenant with cache: {ttl: 1m} and
// limits: {rpm: 2}. After one miss per form (JSON, stream) has filled the
// shared cache, hits through every replica are byte-identical replays
// marked x-llmgate-cache: hit, reach no provider and use no quota: the two
// misses used the tenant's whole minute, which a final uncached request
// shows (429).
func TestE2ECacheHitsAcrossReplicas(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const hitsPerReplica = 3
	rds := testutil.StartRedis(t)
	s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}, TokenDelay: time.Millisecond})
	reps := e2eutil.StartReplicasYAML(t, 3, e2eutil.TenantYAML(t,
		gatewayConfig{Store: rds.URL(), SimURL: s.URL, LogLevel: "info", MaxWait: "0s"},
		"    cache: {ttl: 1m}\n    limits: {rpm: 2}\n"))
	ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
	defer cancel()
	rc := rds.Client(t)
	entries := func() int {
		keys, err := rc.Do(ctx, rc.B().Keys().Pattern(`llmgate:cache:*:e:*`).Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}

	for form, stream := range []bool{false, true} {
		// max_tokens above the simulator's longest answer (47 tokens): an
		// answer cut by the limit would not be cached.
		body := fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":64,"stream":%v,"messages":[{"role":"user","content":"cache me (stream=%v)"}]}`, stream, stream)
		first := e2eutil.Send(ctx, reps[form], body)
		if first.Err != nil || first.Status != http.StatusOK || first.Header.Get("X-Llmgate-Cache") != "miss" {
			t.Fatalf("stream=%v: first request: %d %v cache %q %s", stream, first.Status, first.Err, first.Header.Get("X-Llmgate-Cache"), first.Body)
		}
		// The fill runs after the answer, in the background.
		waitUntil(t, 10*time.Second, "the answer is in the shared cache", func() bool { return entries() == form+1 })
		calls := s.Count()
		for k := range hitsPerReplica * len(reps) {
			r := reps[k%len(reps)]
			hit := e2eutil.Send(ctx, r, body)
			if hit.Err != nil || hit.Status != http.StatusOK {
				t.Fatalf("stream=%v: hit %d via %s: %d %v %s", stream, k, r.Name, hit.Status, hit.Err, hit.Body)
			}
			if hit.Header.Get("X-Llmgate-Cache") != "hit" || !bytes.Equal(hit.Body, first.Body) {
				t.Fatalf("stream=%v: request %d via %s: cache %q\n%s\nwant the first answer\n%s", stream, k, r.Name,
					hit.Header.Get("X-Llmgate-Cache"), hit.Body, first.Body)
			}
			if ct := hit.Header.Get("Content-Type"); ct != first.Header.Get("Content-Type") {
				t.Errorf("stream=%v: a hit's content-type %q, the first answer's %q", stream, ct, first.Header.Get("Content-Type"))
			}
		}
		if c := s.Count(); c != calls {
			t.Fatalf("stream=%v: %d cache hits reached the provider", stream, c-calls)
		}
		if stream {
			if evs := sseEvents(first.Body); len(evs) < 4 || evs[len(evs)-1] != "data: [DONE]" {
				t.Fatalf("the cached stream is not complete: %q", evs)
			}
		}
	}
	// The two misses used the tenant's 2 requests per minute: a request the
	// cache cannot answer is refused, so the hits above were free.
	calls := s.Count()
	last := e2eutil.Send(ctx, reps[2], `{"model":"gpt-4.1","max_tokens":64,"messages":[{"role":"user","content":"not cached"}]}`)
	if last.Err != nil {
		t.Fatal(last.Err)
	}
	if e := decodeError(t, last.Body); last.Status != http.StatusTooManyRequests || e.Error.Code != "rate_limit_exceeded" {
		t.Errorf("an uncached request after the hits: %d %s; want 429 (the tenant's rpm is used up)", last.Status, last.Body)
	}
	if c := s.Count(); c != calls || c != 2 {
		t.Errorf("the provider saw %d calls in all; want the 2 misses", c)
	}
}

// sessionTurnRE reads the session and turn back from a request body.
var sessionTurnRE = regexp.MustCompile(`session (\d+) turn (\d+)"`)

// TestE2ESessionOrderAcrossReplicas: 3 sessions of 30 turns, each turn
// sent to a random replica, reach the provider one turn at a time per
// session, in the order they were sent, with increasing fencing tokens.
// Sessions 0 and 1 are named by x-session-id, session 2 by the body's user
// field with x-llmgate-session: user. The send order is made a fact: the
// provider holds turn 0 of every session, and turn k is sent only once the
// session's queue in Redis holds k waiters.
func TestE2ESessionOrderAcrossReplicas(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const sessions, turns = 3, 30
	rds := testutil.StartRedis(t)
	s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{Store: rds.URL(), SimURL: s.URL, LogLevel: "info"})
	ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
	defer cancel()
	// The gateway's session lock: "session:<tenant>:<id>" on lock/redis
	// with its default prefix.
	locks := lockredis.New(rds.Client(t), lockredis.Config{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("replica choice seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	sessionID := func(sn int) string { return "conv-" + strconv.Itoa(sn) }
	body := func(sn, k int) string {
		user := ""
		if sn == 2 {
			user = fmt.Sprintf(`"user":%q,`, sessionID(sn))
		}
		return fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":4,%s"messages":[{"role":"user","content":"session %d turn %d"}]}`, user, sn, k)
	}
	header := func(sn int) []string {
		if sn == 2 {
			return []string{"X-Llmgate-Session", "user"}
		}
		return []string{"X-Session-Id", sessionID(sn)}
	}

	s.Hold()
	replies := make([][]reply, sessions)
	via := make([][]string, sessions)
	for sn := range sessions {
		replies[sn], via[sn] = make([]reply, turns), make([]string, turns)
	}
	var wg sync.WaitGroup
	for k := range turns {
		for sn := range sessions {
			r := reps[rng.IntN(len(reps))]
			via[sn][k] = r.Name
			wg.Go(func() { replies[sn][k] = e2eutil.Send(ctx, r, body(sn, k), header(sn)...) })
		}
		for sn := range sessions {
			if k == 0 {
				s.WaitArrival(t, fmt.Sprintf(`session %d turn 0"`, sn), 30*time.Second)
				continue
			}
			waitUntil(t, 30*time.Second, fmt.Sprintf("session %d has %d waiters", sn, k), func() bool {
				n, err := locks.Waiters(ctx, "session:team-a:"+sessionID(sn))
				if err != nil {
					t.Fatal(err)
				}
				return n == k
			})
		}
	}
	released := time.Now()
	s.Release()
	wg.Wait()
	t.Logf("%d turns answered %v after the provider let turn 0 go", sessions*turns, time.Since(released).Round(time.Millisecond))

	for sn := range sessions {
		for k, r := range replies[sn] {
			if r.Err != nil || r.Status != http.StatusOK {
				t.Errorf("session %d turn %d via %s: %d %v %s", sn, k, via[sn][k], r.Status, r.Err, r.Body)
			}
		}
	}
	next := make([]int, sessions)
	lastFence := make([]uint64, sessions)
	for _, c := range s.Seen() {
		m := sessionTurnRE.FindStringSubmatch(c.Body)
		if m == nil {
			t.Fatalf("unexpected request at the provider: %s", c.Body)
		}
		sn, _ := strconv.Atoi(m[1])
		k, _ := strconv.Atoi(m[2])
		fence, err := strconv.ParseUint(c.Fence, 10, 64)
		if err != nil {
			t.Fatalf("session %d turn %d reached the provider with x-fencing-token %q", sn, k, c.Fence)
		}
		if k != next[sn] {
			t.Fatalf("session %d: turn %d (sent via %s) reached the provider when turn %d was next", sn, k, via[sn][k], next[sn])
		}
		if fence <= lastFence[sn] {
			t.Fatalf("session %d turn %d: fencing token %d, not above the previous turn's %d", sn, k, fence, lastFence[sn])
		}
		next[sn]++
		lastFence[sn] = fence
	}
	for sn, n := range next {
		if n != turns {
			t.Errorf("session %d: %d of %d turns reached the provider", sn, n, turns)
		}
	}
}

// TestE2ECacheTTLs: an entry's TTL, as Redis keeps it, is the tenant's
// cache.ttl (1m) or the request's x-llmgate-cache-ttl, capped at
// cache.max_ttl (2h); the tenant's cache.models (gpt-4.1 only) limit what
// it opts into, and a request's x-llmgate-cache-ttl opts in any model;
// x-llmgate-cache: skip neither reads nor writes the cache.
func TestE2ECacheTTLs(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	rds := testutil.StartRedis(t)
	models := []string{"gpt-4.1", "gpt-4.1-mini"}
	s := e2eutil.NewGatedSim(t, sim.Config{Models: models, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicasYAML(t, 2, e2eutil.TenantYAML(t,
		gatewayConfig{Store: rds.URL(), SimURL: s.URL, LogLevel: "info", Models: models, Extra: "cache: {max_ttl: 2h}\n"},
		"    cache: {ttl: 1m, models: [gpt-4.1]}\n"))
	ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
	defer cancel()
	rc := rds.Client(t)
	entries := func() map[string]bool {
		keys, err := rc.Do(ctx, rc.B().Keys().Pattern(`llmgate:cache:*:e:*`).Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		m := make(map[string]bool, len(keys))
		for _, k := range keys {
			m[k] = true
		}
		return m
	}
	body := func(model, prompt string) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":64,"messages":[{"role":"user","content":%q}]}`, model, prompt)
	}
	skip := []string{"X-Llmgate-Cache", "skip"}
	for _, tc := range []struct {
		name, body string
		hdr        []string
		ttl        time.Duration // 0: not cached
	}{
		{"tenant ttl", body("gpt-4.1", "a"), nil, time.Minute},
		{"request ttl", body("gpt-4.1", "b"), []string{"X-Llmgate-Cache-Ttl", "5m"}, 5 * time.Minute},
		{"request ttl in seconds", body("gpt-4.1", "c"), []string{"X-Llmgate-Cache-Ttl", "30"}, 30 * time.Second},
		{"request ttl above max_ttl", body("gpt-4.1", "d"), []string{"X-Llmgate-Cache-Ttl", "48h"}, 2 * time.Hour},
		{"model not opted in", body("gpt-4.1-mini", "e"), nil, 0},
		{"model not opted in, request ttl", body("gpt-4.1-mini", "f"), []string{"X-Llmgate-Cache-Ttl", "10m"}, 10 * time.Minute},
		{"skip", body("gpt-4.1", "g"), skip, 0},
		{"skip a cached answer", body("gpt-4.1", "a"), skip, 0},
	} {
		before, calls := entries(), s.Count()
		first := e2eutil.Send(ctx, reps[0], tc.body, tc.hdr...)
		want := "miss"
		if tc.ttl == 0 {
			want = "" // the cache was not asked
		}
		if first.Err != nil || first.Status != http.StatusOK || first.Header.Get("X-Llmgate-Cache") != want {
			t.Fatalf("%s: %d %v cache %q, want %q: %s", tc.name, first.Status, first.Err, first.Header.Get("X-Llmgate-Cache"), want, first.Body)
		}
		if tc.ttl != 0 {
			var key string
			waitUntil(t, 10*time.Second, tc.name+": the answer is in the cache", func() bool {
				for k := range entries() {
					if !before[k] {
						key = k
						return true
					}
				}
				return false
			})
			ms, err := rc.Do(ctx, rc.B().Pttl().Key(key).Build()).AsInt64()
			if ttl := time.Duration(ms) * time.Millisecond; err != nil || ttl > tc.ttl || ttl < tc.ttl-10*time.Second {
				t.Errorf("%s: the entry expires in %v (%v); want %v", tc.name, ttl, err, tc.ttl)
			}
		}
		again := e2eutil.Send(ctx, reps[1], tc.body, tc.hdr...)
		if again.Err != nil || again.Status != http.StatusOK {
			t.Fatalf("%s, again: %d %v %s", tc.name, again.Status, again.Err, again.Body)
		}
		switch {
		case tc.ttl != 0 && (again.Header.Get("X-Llmgate-Cache") != "hit" || !bytes.Equal(again.Body, first.Body) || s.Count() != calls+1):
			t.Errorf("%s, again via %s: cache %q, %d upstream calls; want a hit of the first answer and 1 call",
				tc.name, reps[1].Name, again.Header.Get("X-Llmgate-Cache"), s.Count()-calls)
		case tc.ttl == 0 && (again.Header.Get("X-Llmgate-Cache") != "" || s.Count() != calls+2):
			t.Errorf("%s, again via %s: cache %q, %d upstream calls; want the cache left alone and 2 calls",
				tc.name, reps[1].Name, again.Header.Get("X-Llmgate-Cache"), s.Count()-calls)
		}
		if tc.ttl == 0 && len(entries()) != len(before) {
			t.Errorf("%s: the cache has %d entries, %d before", tc.name, len(entries()), len(before))
		}
	}
}

// TestE2ECacheStampede: 30 identical requests of a tenant opted into the
// cache (temperature 1: not de-duplicated for being deterministic) miss at
// once over three replicas while the provider holds the first: one
// upstream call, 30 identical answers; the next is a cache hit.
func TestE2ECacheStampede(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const n = 30
	rds := testutil.StartRedis(t)
	s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}, TokenDelay: time.Millisecond})
	reps := e2eutil.StartReplicasYAML(t, 3, e2eutil.TenantYAML(t, gatewayConfig{Store: rds.URL(), SimURL: s.URL, LogLevel: "info"}, "    cache: {ttl: 1m}\n"))
	ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
	defer cancel()
	body := `{"model":"gpt-4.1","temperature":1,"max_tokens":64,"stream":true,"messages":[{"role":"user","content":"what everyone asks"}]}`
	s.Hold()
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i] = e2eutil.Send(ctx, reps[i%len(reps)], body) })
	}
	waitUntil(t, 30*time.Second, fmt.Sprintf("1 request reached the provider and %d follow it", n-1), func() bool {
		if c := s.Count(); c > 1 {
			t.Fatalf("%d identical requests reached the provider", c)
		}
		return s.Count() == 1 && e2eutil.SumMetric(t, ctx, reps, followerSeries) == n-1
	})
	s.Release()
	wg.Wait()
	for i, r := range replies {
		if r.Err != nil || r.Status != http.StatusOK || r.Header.Get("X-Llmgate-Cache") != "miss" || !bytes.Equal(r.Body, replies[0].Body) {
			t.Fatalf("request %d: %d %v cache %q\n%s\nwant\n%s", i, r.Status, r.Err, r.Header.Get("X-Llmgate-Cache"), r.Body, replies[0].Body)
		}
	}
	rc := rds.Client(t)
	waitUntil(t, 10*time.Second, "the answer is in the cache", func() bool {
		keys, err := rc.Do(ctx, rc.B().Keys().Pattern(`llmgate:cache:*:e:*`).Build()).AsStrSlice()
		return err == nil && len(keys) == 1
	})
	hit := e2eutil.Send(ctx, reps[2], body)
	if hit.Status != http.StatusOK || hit.Header.Get("X-Llmgate-Cache") != "hit" || !bytes.Equal(hit.Body, replies[0].Body) {
		t.Fatalf("after the stampede: %d %v cache %q %s", hit.Status, hit.Err, hit.Header.Get("X-Llmgate-Cache"), hit.Body)
	}
	if c := s.Count(); c != 1 {
		t.Fatalf("%d calls reached the provider; want 1", c)
	}
}

// TestE2EFollowersAndHitsUseNoQuota: the tenant may make one request, by
// rpm: 1 or by a token budget that holds exactly one request's estimate.
// One upstream call uses it up. Then, through every replica, a retry with
// its Idempotency-Key that bypasses the cache (a follower of the finished
// flight) and a cache hit still get the answer, byte for byte, while any
// other request is refused: followers and hits cost no rate limit and no
// budget. The followers show in the usage rows as requests without tokens;
// the idempotency key's answer is kept for dedup.idempotency_ttl (1h).
func TestE2EFollowersAndHitsUseNoQuota(t *testing.T) {
	t.Parallel()
	const prompt = "pay once"
	body := fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":64,"messages":[{"role":"user","content":%q}]}`, prompt)
	// The reservation the gateway makes: the prompt as counted offline
	// plus max_tokens.
	estimate := int64(tokens.Chat("gpt-4.1", json.RawMessage(fmt.Sprintf(`[{"role":"user","content":%q}]`, prompt)), nil)) + 64
	for _, tc := range []struct{ name, quota, code string }{
		{"rpm", "    limits: {rpm: 1}\n", "rate_limit_exceeded"},
		{"budget", fmt.Sprintf("    budget: {period: day, tokens: %d}\n", estimate), "insufficient_quota"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e2eutil.LogRuntime(t)
			rds := testutil.StartRedis(t)
			s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
			reps := e2eutil.StartReplicasYAML(t, 3, e2eutil.TenantYAML(t,
				gatewayConfig{Store: rds.URL(), SimURL: s.URL, LogLevel: "info", MaxWait: "0s", Extra: "dedup: {idempotency_ttl: 1h}\n"},
				"    cache: {ttl: 1m}\n"+tc.quota))
			ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
			defer cancel()
			const key = "pay-1"
			first := e2eutil.Send(ctx, reps[0], body, "Idempotency-Key", key)
			if first.Err != nil || first.Status != http.StatusOK || first.Header.Get("X-Llmgate-Dedup") != "leader" || first.Header.Get("X-Llmgate-Cache") != "miss" {
				t.Fatalf("first request: %d %v dedup %q cache %q %s", first.Status, first.Err,
					first.Header.Get("X-Llmgate-Dedup"), first.Header.Get("X-Llmgate-Cache"), first.Body)
			}
			rc := rds.Client(t)
			hkey := dedupredis.New(rc, dedupredis.Config{}).Key("idem:team-a:" + key)
			waitUntil(t, 10*time.Second, "the flight is finished and the answer cached", func() bool {
				st, err := rc.Do(ctx, rc.B().Hget().Key(hkey).Field("s").Build()).ToString()
				keys, kerr := rc.Do(ctx, rc.B().Keys().Pattern(`llmgate:cache:*:e:*`).Build()).AsStrSlice()
				return err == nil && st == "f" && kerr == nil && len(keys) == 1
			})
			if ms, err := rc.Do(ctx, rc.B().Pttl().Key(hkey).Build()).AsInt64(); err != nil || ms > time.Hour.Milliseconds() || ms < (59*time.Minute).Milliseconds() {
				t.Errorf("the idempotent answer is kept %dms (%v); want dedup.idempotency_ttl, 1h", ms, err)
			}
			for _, r := range reps {
				f := e2eutil.Send(ctx, r, body, "Idempotency-Key", key, "X-Llmgate-Cache", "skip")
				if f.Err != nil || f.Status != http.StatusOK || f.Header.Get("X-Llmgate-Dedup") != "follower" || !bytes.Equal(f.Body, first.Body) {
					t.Fatalf("retry via %s: %d %v dedup %q %s", r.Name, f.Status, f.Err, f.Header.Get("X-Llmgate-Dedup"), f.Body)
				}
				h := e2eutil.Send(ctx, r, body)
				if h.Err != nil || h.Status != http.StatusOK || h.Header.Get("X-Llmgate-Cache") != "hit" || !bytes.Equal(h.Body, first.Body) {
					t.Fatalf("cache hit via %s: %d %v cache %q %s", r.Name, h.Status, h.Err, h.Header.Get("X-Llmgate-Cache"), h.Body)
				}
			}
			last := e2eutil.Send(ctx, reps[1], strings.Replace(body, prompt, "pay again, for another and longer question", 1))
			if last.Err != nil {
				t.Fatal(last.Err)
			}
			if e := decodeError(t, last.Body); last.Status != http.StatusTooManyRequests || e.Error.Code != tc.code {
				t.Errorf("a request neither the cache nor a flight answers: %d %s; want 429 %s (the quota is used up)", last.Status, last.Body, tc.code)
			}
			if c := s.Count(); c != 1 {
				t.Errorf("%d calls reached the provider; want 1", c)
			}
			// Usage: the leader's tokens (the provider's count) and 3
			// de-duplicated requests without tokens.
			st := s.Stats().Total
			var rows []struct {
				Rows []struct {
					Deployment       string `json:"deployment"`
					Requests         int64  `json:"requests"`
					PromptTokens     int64  `json:"prompt_tokens"`
					CompletionTokens int64  `json:"completion_tokens"`
				} `json:"rows"`
			}
			waitUntil(t, 10*time.Second, "the usage rows show the leader and 3 followers", func() bool {
				if err := reps[2].Get(ctx, "/admin/usage?tenant=team-a", e2eutil.AdminToken, &rows); err != nil {
					t.Fatal(err)
				}
				var leader, followers int64
				for _, r := range rows[0].Rows {
					switch r.Deployment {
					case "dedup-follower":
						followers += r.Requests
					case "cache-hit": // counted apart, as free
					default:
						leader += r.Requests
					}
				}
				return leader == 1 && followers == 3
			})
			for _, r := range rows[0].Rows {
				free := r.Deployment == "dedup-follower" || r.Deployment == "cache-hit"
				if free && (r.PromptTokens != 0 || r.CompletionTokens != 0) ||
					!free && (r.PromptTokens != st.PromptTokens || r.CompletionTokens != st.CompletionTokens) {
					t.Errorf("usage row %+v; the provider billed %d+%d tokens for the one call", r, st.PromptTokens, st.CompletionTokens)
				}
			}
		})
	}
}

// TestE2ESessionReplicaKilled: with sessions: {header: x-conversation,
// ttl: 2s}, a replica killed with SIGKILL while its turn holds the session
// (the provider holds that turn) keeps the session no longer than its
// lease: the next turn, queued on another replica, reaches the provider
// within the lease plus a margin, with a higher fencing token.
func TestE2ESessionReplicaKilled(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		ttl = 2 * time.Second
		// bound: the dead replica's lease runs out within ttl of the
		// kill; the margin is the waiter noticing and the call on a
		// loaded 2-core machine.
		bound = ttl + 5*time.Second
	)
	rds := testutil.StartRedis(t)
	s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 2, gatewayConfig{Store: rds.URL(), SimURL: s.URL, LogLevel: "info",
		Extra: fmt.Sprintf("sessions: {header: x-conversation, ttl: %v}\n", ttl)})
	ctx, cancel := context.WithTimeout(t.Context(), shareTimeout)
	defer cancel()
	locks := lockredis.New(rds.Client(t), lockredis.Config{})
	turn := func(k int) string {
		return fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":4,"messages":[{"role":"user","content":"session 0 turn %d"}]}`, k)
	}
	s.Hold()
	dead := make(chan reply, 1)
	go func() { dead <- e2eutil.Send(ctx, reps[0], turn(0), "X-Conversation", "conv-k") }()
	s.WaitArrival(t, `session 0 turn 0"`, 30*time.Second)
	next := make(chan reply, 1)
	go func() { next <- e2eutil.Send(ctx, reps[1], turn(1), "X-Conversation", "conv-k") }()
	waitUntil(t, 30*time.Second, "turn 1 waits for the session", func() bool {
		n, err := locks.Waiters(ctx, "session:team-a:conv-k")
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	reps[0].Kill(t)
	killedAt := time.Now()
	s.Release()
	r := <-next
	took := r.Done.Sub(killedAt)
	t.Logf("turn 1 answered %v after the session's holder was killed", took.Round(time.Millisecond))
	if r.Err != nil || r.Status != http.StatusOK {
		t.Fatalf("turn 1 via %s: %d %v %s", reps[1].Name, r.Status, r.Err, r.Body)
	}
	if took > bound {
		t.Errorf("turn 1 waited %v after the kill; a dead replica may hold a session for at most the lease (%v) plus a margin, %v", took, ttl, bound)
	}
	if d := <-dead; d.Err == nil {
		t.Errorf("turn 0 via the killed %s: %d %s; want a broken connection", reps[0].Name, d.Status, d.Body)
	}
	calls := s.Seen()
	if len(calls) != 2 || !strings.Contains(calls[1].Body, `turn 1"`) {
		t.Fatalf("the provider saw %d calls; want turn 0, then turn 1", len(calls))
	}
	f0, err0 := strconv.ParseUint(calls[0].Fence, 10, 64)
	f1, err1 := strconv.ParseUint(calls[1].Fence, 10, 64)
	if err0 != nil || err1 != nil || f1 <= f0 {
		t.Errorf("fencing tokens %q then %q; want increasing", calls[0].Fence, calls[1].Fence)
	}
}

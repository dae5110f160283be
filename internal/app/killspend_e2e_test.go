//go:build unix

package app

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	budgetredis "github.com/llmgate/llmgate/budget/redis"
	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// End-to-end tests of what a tenant's budget is charged for the streams of
// a replica killed with SIGKILL: their reservations expire unsettled and
// are charged, the estimate or the usage the replica last renewed them
// with, whichever is more (see the budget package doc). The provider is
// the simulated one behind a wrapper that counts the content chunks it
// wrote to each stream and can hold every stream at a chunk count, so that
// "the provider served N tokens when the hold was renewed" is a fact the
// test sets up, not a timing guess.

const (
	// killTTL is budget.reservation_ttl in these tests: short, so that a
	// killed replica's holds are charged within seconds. Holds are renewed
	// every third of it (checked every sixth).
	killTTL = 3 * time.Second
	// killMargin is what the tests allow on top of killTTL for a hold to
	// be swept after it expired: the admin API is polled every 20ms, and
	// a loaded machine may be slow to answer.
	killMargin = 2 * time.Second
	// killStreams is how many streams run through the replica that dies.
	killStreams = 10
	// killTokenDelay is the simulated provider's delay between tokens.
	killTokenDelay = 50 * time.Millisecond
)

// meteredSim is the simulated provider on a loopback listener, wrapped to
// count the content chunks it writes to each chat completion (by the
// request's last message) and, while paused, to hold each stream before
// its next content chunk once it has written pauseAt of them.
type meteredSim struct {
	*sim.Server
	url string // the OpenAI base URL, ending in /v1

	mu      sync.Mutex       // protects served, active, pauseAt, changed
	served  map[string]int64 // content chunks written, by prompt
	active  int              // chat completion requests being answered
	pauseAt int64            // > 0: streams wait before their content chunk pauseAt+1
	changed chan struct{}    // closed and replaced when any of the above changes
}

func newMeteredSim(t *testing.T, cfg sim.Config) *meteredSim {
	t.Helper()
	srv, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &meteredSim{Server: srv, served: map[string]int64{}, changed: make(chan struct{})}
	s.url = e2eutil.ServeSimChat(t, srv, func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) {
		s.update(func() { s.active++ })
		defer s.update(func() { s.active-- })
		next.ServeHTTP(&meteredWriter{ResponseWriter: w, s: s, ctx: r.Context(), prompt: lastMessage(body)}, r)
	})
	t.Cleanup(s.resume) // runs first: nothing held keeps Close waiting
	return s
}

// update runs f with s.mu held and wakes the waiters.
func (s *meteredSim) update(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
}

// pause holds every stream before its content chunk n+1, from now on.
func (s *meteredSim) pause(n int64) { s.update(func() { s.pauseAt = n }) }

// resume lets the held streams go on and stops holding.
func (s *meteredSim) resume() { s.update(func() { s.pauseAt = 0 }) }

// snapshot returns a copy of the content chunks written so far, by prompt.
func (s *meteredSim) snapshot() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.served))
	for k, v := range s.served {
		out[k] = v
	}
	return out
}

// waitFor waits until cond, called with s.mu held, is true, failing the
// test after timeout.
func (s *meteredSim) waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok, changed := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%s: not within %v (served %v)", what, timeout, s.snapshot())
		}
	}
}

// waitServed waits until every prompt was served at least n content chunks.
func (s *meteredSim) waitServed(t *testing.T, prompts []string, n int64, timeout time.Duration) {
	t.Helper()
	s.waitFor(t, fmt.Sprintf("the provider serves %d tokens to each stream", n), timeout, func() bool {
		for _, p := range prompts {
			if s.served[p] < n {
				return false
			}
		}
		return true
	})
}

// waitIdle waits until no chat completion is being answered.
func (s *meteredSim) waitIdle(t *testing.T, timeout time.Duration) {
	t.Helper()
	s.waitFor(t, "the provider ends every answer", timeout, func() bool { return s.active == 0 })
}

// meteredWriter counts the content chunks a chat completion writes, and
// holds them while its meteredSim is paused.
type meteredWriter struct {
	http.ResponseWriter
	s      *meteredSim
	ctx    context.Context // the request's: done when the gateway is gone
	prompt string
}

// Write takes one server-sent event (the simulator writes each whole).
func (w *meteredWriter) Write(p []byte) (int, error) {
	if !isContentEvent(p) {
		return w.ResponseWriter.Write(p)
	}
	if err := w.wait(); err != nil {
		return 0, err
	}
	n, err := w.ResponseWriter.Write(p)
	if err == nil {
		w.s.update(func() { w.s.served[w.prompt]++ })
	}
	return n, err
}

// wait returns when the next content chunk may be written, or the
// gateway went away.
func (w *meteredWriter) wait() error {
	for {
		w.s.mu.Lock()
		held, changed := w.s.pauseAt > 0 && w.s.served[w.prompt] >= w.s.pauseAt, w.s.changed
		w.s.mu.Unlock()
		if !held {
			return nil
		}
		select {
		case <-changed:
		case <-w.ctx.Done():
			return w.ctx.Err()
		}
	}
}

// Unwrap lets http.ResponseController flush the real writer.
func (w *meteredWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// isContentEvent reports whether p is a stream chunk with generated text.
func isContentEvent(p []byte) bool {
	data, ok := bytes.CutPrefix(p, []byte("data: {"))
	if !ok {
		return false
	}
	var ch struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(append([]byte("{"), bytes.TrimSpace(data)...), &ch) != nil {
		return false
	}
	return len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != ""
}

// lastMessage returns the text of a chat request's last message.
func lastMessage(body []byte) string {
	var req struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		return ""
	}
	return req.Messages[len(req.Messages)-1].Content
}

// promptBody is a chat completion request for gpt-4.1 with one user message;
// maxTokens 0 sends none.
func promptBody(prompt string, maxTokens int64, stream bool) string {
	req := map[string]any{
		"model":    "gpt-4.1",
		"messages": []map[string]string{{"role": "user", "content": prompt}},
		"stream":   stream,
	}
	if maxTokens > 0 {
		req["max_tokens"] = maxTokens
	}
	b, _ := json.Marshal(req)
	return string(b)
}

// probed is a prompt with the usage of the simulator's answer to it.
type probed struct {
	prompt                     string
	promptTokens, answerTokens int64
}

// pickPrompts returns n prompts, "<prefix> 0", "<prefix> 1", ..., whose
// answers (deterministic: the simulator's words depend on the model and
// the prompt only) have a length for which keep is true, asking a
// simulator of the test's own, without delays.
func pickPrompts(t *testing.T, prefix string, n int, keep func(tokens int64) bool) []probed {
	t.Helper()
	srv, err := sim.New(sim.Config{Models: []string{"gpt-4.1"}})
	if err != nil {
		t.Fatal(err)
	}
	h := srv.Handler()
	var out []probed
	for i := 0; len(out) < n; i++ {
		if i == 100*n {
			t.Fatalf("%d of %d prompts %q with a fitting answer among %d", len(out), n, prefix, i)
		}
		p := fmt.Sprintf("%s %d", prefix, i)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(promptBody(p, 0, false))))
		var resp struct {
			Usage struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &resp) != nil {
			t.Fatalf("probing %q: %d %s", p, rec.Code, rec.Body)
		}
		if keep(resp.Usage.CompletionTokens) {
			out = append(out, probed{prompt: p, promptTokens: resp.Usage.PromptTokens, answerTokens: resp.Usage.CompletionTokens})
		}
	}
	return out
}

// streamResult is what a client read of a stream.
type streamResult struct {
	chunks int64 // content chunks
	done   bool  // it ended with [DONE]
	err    error // the stream broke (or could not start)
}

// readStream sends a streamed chat completion through r and reads it,
// reporting each content chunk's count on progress; safe from any
// goroutine.
func readStream(ctx context.Context, r *replica, body string, progress func(int64)) streamResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return streamResult{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e2eutil.TenantKey)
	resp, err := e2eutil.HTTP.Do(req)
	if err != nil {
		return streamResult{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return streamResult{err: fmt.Errorf("%s: %d %s", r.Name, resp.StatusCode, b)}
	}
	var res streamResult
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case data == "[DONE]":
			res.done = true
		case isContentEvent([]byte("data: " + data)):
			res.chunks++
			progress(res.chunks)
		}
	}
	res.err = sc.Err()
	if res.err == nil && !res.done {
		res.err = io.ErrUnexpectedEOF
	}
	return res
}

// adminUsage is a tenant's entry in GET /admin/usage.
type adminUsage struct {
	Window string             `json:"window"`
	Rows   []budget.UsageRow  `json:"rows"`
	Budget *adminBudgetStatus `json:"budget"`
}

type adminBudgetStatus struct {
	SpentTokens int64 `json:"spent_tokens"`
	CapTokens   int64 `json:"cap_tokens"`
	Holds       int   `json:"live_reservations"`
}

// teamUsage reads team-a's usage and budget through r's admin API.
func teamUsage(ctx context.Context, r *replica) (adminUsage, error) {
	var out []adminUsage
	if err := r.Get(ctx, "/admin/usage?tenant=team-a", e2eutil.AdminToken, &out); err != nil {
		return adminUsage{}, err
	}
	if len(out) != 1 || out[0].Budget == nil {
		return adminUsage{}, fmt.Errorf("admin usage of team-a has no budget: %+v", out)
	}
	return out[0], nil
}

// sumRows adds up usage rows.
func sumRows(rows []budget.UsageRow) budget.UsageRow {
	var s budget.UsageRow
	for _, r := range rows {
		s.Requests += r.Requests
		s.Expired += r.Expired
		s.PromptTokens += r.PromptTokens
		s.CompletionTokens += r.CompletionTokens
		s.MicroUSD += r.MicroUSD
	}
	return s
}

// storeTotals reads team-a's budget totals straight from Redis (the admin
// API shows the number of live holds, not what they hold), as any replica
// would: the read sweeps expired holds.
type storeTotals struct {
	b   *budgetredis.Backend
	key budget.Key
}

func newStoreTotals(t *testing.T, rds *testutil.Redis, window string) storeTotals {
	return storeTotals{b: budgetredis.New(rds.Client(t), budgetredis.Config{}), key: budget.Key{Tenant: "team-a", WindowID: window}}
}

func (s storeTotals) get(t *testing.T, ctx context.Context) budget.Totals {
	t.Helper()
	tot, err := s.b.Totals(ctx, s.key)
	if err != nil {
		t.Fatal(err)
	}
	return tot
}

// poll calls f every 20ms until it reports true, and fails the test with
// its last description after timeout. It returns how long that took.
func poll(t *testing.T, what string, timeout time.Duration, f func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, desc := f()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v; last: %s", what, timeout, desc)
		}
		<-tick.C // polling a store or an admin API: nothing to wait on
	}
}

// killConfig is the YAML of the replicas: team-a with a daily token
// budget of capTokens, budget holds renewed every third of killTTL.
func killConfig(rds *testutil.Redis, s *meteredSim, capTokens int64) gatewayConfig {
	return gatewayConfig{
		Store: rds.URL(), SimURL: s.url, LogLevel: "info",
		Budget: fmt.Sprintf("{period: day, tokens: %d}", capTokens),
		Extra:  fmt.Sprintf("budget: {reservation_ttl: %s}\n", killTTL),
	}
}

// clientStreams are streams the test's clients read, one per prompt.
type clientStreams struct {
	via     *replica
	results chan streamResult // each stream's, when it ends

	mu      sync.Mutex    // protects read
	read    []int64       // content chunks each client read so far
	changed chan struct{} // signalled when read changes
}

// startStreams starts a stream per prompt through r.
func startStreams(ctx context.Context, r *replica, ps []probed, maxTokens int64) *clientStreams {
	cs := &clientStreams{via: r, results: make(chan streamResult, len(ps)), read: make([]int64, len(ps)), changed: make(chan struct{}, 1)}
	for i, p := range ps {
		go func() {
			cs.results <- readStream(ctx, r, promptBody(p.prompt, maxTokens, true), func(c int64) {
				cs.mu.Lock()
				cs.read[i] = c
				cs.mu.Unlock()
				select {
				case cs.changed <- struct{}{}:
				default: // a wake-up is pending: the waiter will look again
				}
			})
		}()
	}
	return cs
}

// waitRead waits until every client has read n content chunks (so that
// the replica has relayed, and counted, them); none may end before.
func (cs *clientStreams) waitRead(t *testing.T, n int64, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		cs.mu.Lock()
		least := slices.Min(cs.read)
		cs.mu.Unlock()
		if least >= n {
			return
		}
		select {
		case <-cs.changed:
		case res := <-cs.results:
			t.Fatalf("a stream through %s ended after %d chunks, before the kill: %v", cs.via.Name, res.chunks, res.err)
		case <-deadline.C:
			t.Fatalf("the clients did not read %d chunks of each stream within %v (least %d)", n, timeout, least)
		}
	}
}

// waitKilled collects the results of the streams through a killed
// replica: each must have broken, not ended.
func (cs *clientStreams) waitKilled(t *testing.T) {
	t.Helper()
	for range cs.read {
		res := <-cs.results
		if res.err == nil || res.done {
			t.Errorf("a stream through the killed replica ended normally after %d chunks", res.chunks)
		}
	}
}

// TestE2EKilledReplicaSpendIsCharged: replica A learns a small completion
// estimate (8 short answers without max_tokens), then relays 10 streams
// without max_tokens whose answers are several times longer. The provider
// holds each stream at 20 tokens until A has renewed every hold with that
// usage, then lets them go on; A is killed with SIGKILL mid-stream. Within
// the reservation TTL (plus a margin) of the kill, replica B shows no live
// hold, and the budget was charged for each killed stream at least its
// prompt and the 20 tokens served when its hold was last renewed, and no
// more than the provider served; the usage rows count the 10 as expired.
// (Tokens served after the last renewal, above an estimate that was not an
// upper bound, may go uncharged: see the budget package doc.)
func TestE2EKilledReplicaSpendIsCharged(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		capTokens = 100_000 // never reached
		warmups   = 8       // what it takes to learn an estimate
		shortMax  = 12      // the warm-up answers' most tokens: the estimate
		longMin   = 42      // the killed streams' answers' least tokens
		renewedAt = 20      // tokens served to each stream when its hold is renewed
		afterward = 5       // tokens at least served to each after that, before the kill
	)
	warm := pickPrompts(t, "warm-up", warmups, func(n int64) bool { return n <= shortMax })
	long := pickPrompts(t, "long story", killStreams, func(n int64) bool { return n >= longMin })
	rds := testutil.StartRedis(t)
	s := newMeteredSim(t, sim.Config{Models: []string{"gpt-4.1"}, TokenDelay: killTokenDelay, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 2, killConfig(rds, s, capTokens))
	a, b := reps[0], reps[1]
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	// A learns the estimate: the longest of the warm-up answers.
	var estimate, warmSpend int64
	errs := make(chan error, len(warm))
	for _, p := range warm {
		estimate = max(estimate, p.answerTokens)
		warmSpend += p.promptTokens + p.answerTokens
		go func() {
			resp, body, err := a.TryPost(ctx, "/v1/chat/completions", e2eutil.TenantKey, promptBody(p.prompt, 0, false))
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("warm-up via A: %d %s", resp.StatusCode, body)
			}
			errs <- err
		}()
	}
	for range warm {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	poll(t, "the warm-ups are settled", 15*time.Second, func() (bool, string) {
		u, err := teamUsage(ctx, b)
		return err == nil && u.Budget.Holds == 0 && u.Budget.SpentTokens == warmSpend, fmt.Sprintf("%+v %v", u.Budget, err)
	})
	u, err := teamUsage(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	totals := newStoreTotals(t, rds, u.Window)

	// The streams: each reserves its prompt and the estimate, and goes
	// past it; the provider holds each once it served renewedAt tokens.
	var prompts []string
	var held, estimates int64 // what the holds are renewed to; what was reserved
	for _, p := range long {
		prompts = append(prompts, p.prompt)
		held += p.promptTokens + renewedAt
		estimates += p.promptTokens + estimate
	}
	// Admitted, each holds its prompt and the estimate (renewals with
	// less than the estimate served leave it so).
	s.pause(1)
	streams := startStreams(ctx, a, long, 0)
	streams.waitRead(t, 1, 30*time.Second)
	if tot := totals.get(t, ctx); tot.Reserved.Tokens != estimates || tot.Holds != killStreams {
		t.Fatalf("the streams hold %+v; want %d holds of the prompts and the estimate, %d tokens", tot, killStreams, estimates)
	}
	s.pause(renewedAt)
	streams.waitRead(t, renewedAt, 30*time.Second)
	// Every hold renewed with what was served: the keeper renews each
	// within half the TTL; a hold not renewed within the TTL would expire.
	took := poll(t, "A renews every hold with the tokens served", killTTL, func() (bool, string) {
		tot := totals.get(t, ctx)
		return tot.Reserved.Tokens == held && tot.Holds == killStreams, fmt.Sprintf("%+v", tot)
	})
	t.Logf("estimate %d completion tokens; holds raised from %d to %d tokens (prompts + %d served each) within %v of the chunks",
		estimate, estimates, held, renewedAt, took.Round(time.Millisecond))

	// The streams go on past the last renewal we know of; A dies.
	s.resume()
	s.waitServed(t, prompts, renewedAt+afterward, 10*time.Second)
	a.Kill(t)
	killedAt := time.Now()
	streams.waitKilled(t)
	s.waitIdle(t, 10*time.Second)
	var served int64 // prompts and content chunks the provider served through A
	sv := s.snapshot()
	for _, p := range long {
		served += p.promptTokens + sv[p.prompt]
		if sv[p.prompt] >= p.answerTokens {
			t.Errorf("stream %q was served whole (%d tokens) before the kill", p.prompt, sv[p.prompt])
		}
	}

	// Within the TTL of the kill, the holds are charged.
	after := waitCharged(t, ctx, b)
	swept := time.Since(killedAt)
	billed := after.Budget.SpentTokens - warmSpend
	rows := sumRows(after.Rows)
	t.Logf("holds charged %v after the kill (TTL %v); billed %d tokens for the killed streams: provider served %d (prompts + chunks), %d at the last known renewal, %d reserved at admission",
		swept.Round(time.Millisecond), killTTL, billed, served, held, estimates)
	if billed < held {
		t.Errorf("billed %d tokens for the killed streams; the provider had served %d when their holds were renewed", billed, held)
	}
	if billed > served {
		t.Errorf("billed %d tokens for the killed streams; the provider served only %d", billed, served)
	}
	if after.Budget.SpentTokens > capTokens {
		t.Errorf("spent %d tokens of a %d-token budget", after.Budget.SpentTokens, capTokens)
	}
	if rows.Requests != warmups+killStreams || rows.Expired != killStreams {
		t.Errorf("usage rows count %d requests, %d expired; want %d, %d: %+v", rows.Requests, rows.Expired, warmups+killStreams, killStreams, after.Rows)
	}
	if rows.PromptTokens+rows.CompletionTokens != after.Budget.SpentTokens {
		t.Errorf("usage rows count %d+%d tokens, the budget spent %d", rows.PromptTokens, rows.CompletionTokens, after.Budget.SpentTokens)
	}
	if tot := totals.get(t, ctx); tot.Reserved != (budget.Amount{}) || tot.Holds != 0 || tot.Spent.Tokens != after.Budget.SpentTokens {
		t.Errorf("store totals after the expiry: %+v; want nothing reserved, %d tokens spent", tot, after.Budget.SpentTokens)
	}
}

// TestE2EKilledReplicaSpendWithMaxTokens: 10 streams with max_tokens
// (upper-bound estimates) nearly fill a tenant's token budget; their
// replica A is killed with SIGKILL mid-stream. Within the reservation TTL
// of the kill the budget was charged at least everything the provider
// served through A, at most what was spent and reserved at the kill (the
// cap is not overshot: the expiries charge the estimates), and replica B
// refuses the next request: the dead replica's spend counts.
func TestE2EKilledReplicaSpendWithMaxTokens(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		maxTokens = 30
		longMin   = 42 // the answers' least tokens: each would use all of max_tokens
		servedMin = 10 // tokens at least served to each stream before the kill
		slack     = 5  // what the cap leaves beyond the streams' holds: less than any request
	)
	long := pickPrompts(t, "capped story", killStreams, func(n int64) bool { return n >= longMin })
	var prompts []string
	var estimates int64
	for _, p := range long {
		prompts = append(prompts, p.prompt)
		estimates += p.promptTokens + maxTokens
	}
	capTokens := estimates + slack
	rds := testutil.StartRedis(t)
	s := newMeteredSim(t, sim.Config{Models: []string{"gpt-4.1"}, TokenDelay: killTokenDelay, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 2, killConfig(rds, s, capTokens))
	a, b := reps[0], reps[1]
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	u, err := teamUsage(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	totals := newStoreTotals(t, rds, u.Window)

	streams := startStreams(ctx, a, long, maxTokens)
	s.waitServed(t, prompts, servedMin, 10*time.Second)
	atKill := totals.get(t, ctx)
	a.Kill(t)
	killedAt := time.Now()
	if atKill.Holds != killStreams || atKill.Reserved.Tokens != estimates || atKill.Spent.Tokens != 0 {
		t.Errorf("before the kill: %+v; want %d holds of %d tokens in all, nothing spent", atKill, killStreams, estimates)
	}
	streams.waitKilled(t)
	s.waitIdle(t, 10*time.Second)
	var served int64
	sv := s.snapshot()
	for _, p := range long {
		served += p.promptTokens + sv[p.prompt]
	}

	after := waitCharged(t, ctx, b)
	swept := time.Since(killedAt)
	billed, bound := after.Budget.SpentTokens, atKill.Spent.Tokens+atKill.Reserved.Tokens
	rows := sumRows(after.Rows)
	t.Logf("holds charged %v after the kill (TTL %v); billed %d tokens: provider served %d, spent+reserved at the kill %d, cap %d",
		swept.Round(time.Millisecond), killTTL, billed, served, bound, capTokens)
	if billed < served {
		t.Errorf("billed %d tokens; the provider served %d through the killed replica", billed, served)
	}
	if billed > bound || billed > capTokens {
		t.Errorf("billed %d tokens; spent and reserved at the kill were %d, the cap %d", billed, bound, capTokens)
	}
	if billed != estimates {
		t.Errorf("billed %d tokens; the expiries charge the estimates, %d", billed, estimates)
	}
	if rows.Requests != killStreams || rows.Expired != killStreams {
		t.Errorf("usage rows count %d requests, %d expired; want %d of each: %+v", rows.Requests, rows.Expired, killStreams, after.Rows)
	}

	// What is left is less than any request: B refuses the next one.
	resp, body := b.Post(t, ctx, "/v1/chat/completions", e2eutil.TenantKey, hello)
	if e := decodeError(t, body); resp.StatusCode != http.StatusTooManyRequests || e.Error.Code != "insufficient_quota" {
		t.Errorf("a request via B after the expiries: %d %s; want 429 insufficient_quota", resp.StatusCode, body)
	}
}

// waitCharged waits, within the TTL of the kill and a margin, until the
// killed replica's holds are charged (none live), and returns the usage
// then, read through b.
func waitCharged(t *testing.T, ctx context.Context, b *replica) adminUsage {
	t.Helper()
	var after adminUsage
	poll(t, "the killed replica's holds are charged", killTTL+killMargin, func() (bool, string) {
		var err error
		after, err = teamUsage(ctx, b)
		return err == nil && after.Budget.Holds == 0, fmt.Sprintf("%+v %v", after.Budget, err)
	})
	return after
}

//go:build unix

package app

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// stallingSim is the simulated provider wrapped so that every stream stops
// after its first stallAfter content chunks and hangs until the gateway
// drops it: a stream far longer than any shutdown grace, whose tokens the
// provider sent are exactly those counted in sent (no chunk is ever in
// flight when the gateway cuts it).
type stallingSim struct {
	*sim.Server
	url        string
	stallAfter int
	sent       atomic.Int64 // content chunks written to the gateway, all streams
	stalled    atomic.Int64 // streams hanging now
}

func newStallingSim(t *testing.T, cfg sim.Config, stallAfter int) *stallingSim {
	t.Helper()
	srv, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &stallingSim{Server: srv, stallAfter: stallAfter}
	h := srv.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&stallingWriter{ResponseWriter: w, s: s, ctx: r.Context()}, r)
	}))
	t.Cleanup(hs.Close)
	s.url = hs.URL + "/v1"
	return s
}

// stallingWriter counts the content chunks of one stream (the simulator
// writes one event per Write) and blocks the one after stallAfter until
// the request ends.
type stallingWriter struct {
	http.ResponseWriter
	s       *stallingSim
	ctx     context.Context
	content int
}

func (w *stallingWriter) Write(p []byte) (int, error) {
	data, ok := bytes.CutPrefix(p, []byte("data: "))
	if !ok || !openai.ParseChunk(data).Content {
		return w.ResponseWriter.Write(p)
	}
	if w.content == w.s.stallAfter {
		w.s.stalled.Add(1)
		defer w.s.stalled.Add(-1)
		<-w.ctx.Done() // the gateway dropped the stream
		return 0, w.ctx.Err()
	}
	n, err := w.ResponseWriter.Write(p)
	if err == nil {
		w.content++
		w.s.sent.Add(1)
	}
	return n, err
}

func (w *stallingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *stallingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestE2EShutdownSettlesCutStreams: SIGTERM to a replica on Redis with
// streams running that are longer than its shutdown grace. /readyz turns
// 503 shutting_down at once while the listener still accepts; the listener
// closes after server.drain_delay; the streams are cut only once
// server.shutdown_grace has passed after that, each told in-band; the
// process exits 0 soon after. Every token the provider sent was charged to
// the tenant's budget (prompt estimate plus the chunks streamed, exactly
// what docs/gateway.md says), and nothing stays held: no budget hold, no
// rate-limit reservation, no concurrency permit.
func TestE2EShutdownSettlesCutStreams(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		streams    = 6
		stallAfter = 5 // content chunks each stream gets before it hangs
		drainDelay = 500 * time.Millisecond
		grace      = time.Second
		// margin covers a slow start of the shutdown and the exit on a
		// loaded machine; the settles have settleWait on top.
		margin = 5 * time.Second
	)
	rds := testutil.StartRedis(t)
	s := newStallingSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}, TokenDelay: 10 * time.Millisecond}, stallAfter)
	cfg := gatewayConfig{
		Store: rds.URL(), SimURL: s.url, LogLevel: "info",
		Limits: "{rpm: 10000, tpm: 10000000, concurrency: 100}",
		Budget: "{period: day, tokens: 1000000}",
		Extra:  fmt.Sprintf("server: {drain_delay: %v, shutdown_grace: %v}\n", drainDelay, grace),
	}
	// Replica B only reads the budget afterwards (it serves no request,
	// so it holds nothing in the store itself).
	reps := e2eutil.StartReplicasYAML(t, 2, e2eutil.TenantYAML(t, cfg, "    limits: {tpm: 1000000, concurrency: 50}\n"))
	a, b := reps[0], reps[1]
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	// The streams, each read until the provider hangs, then to its end.
	type cut struct {
		rest string // what came after the stall
		at   time.Time
		err  error
	}
	cuts := make(chan cut, streams)
	var readers sync.WaitGroup
	for _, br := range openStalledStreams(t, ctx, a, streams, stallAfter) {
		readers.Go(func() {
			var rest bytes.Buffer
			_, err := rest.ReadFrom(br)
			cuts <- cut{rest.String(), time.Now(), err}
		})
	}
	waitUntil(t, 10*time.Second, "every stream hangs at the provider", func() bool { return s.stalled.Load() == streams })

	sigterm := time.Now()
	if err := a.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// /readyz, each time on a new connection, until the listener refuses.
	poll := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	var notReady, refused time.Time
	for refused.IsZero() {
		resp, err := poll.Get(a.URL + "/readyz")
		switch {
		case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF):
			// Refused, or reset from the backlog of the listener closing.
			refused = time.Now()
		case err != nil:
			t.Fatalf("/readyz during the shutdown: %v", err)
		default:
			var e bytes.Buffer
			_, _ = e.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && notReady.IsZero() {
				if !strings.Contains(e.String(), `"code":"shutting_down"`) {
					t.Errorf("/readyz while draining: %s; want the shutting_down error", e.String())
				}
				notReady = time.Now()
			}
		}
		if time.Since(sigterm) > drainDelay+margin {
			t.Fatalf("the listener still accepts %v after SIGTERM (drain_delay %v)", time.Since(sigterm), drainDelay)
		}
		time.Sleep(10 * time.Millisecond) // polling a health endpoint: nothing to wait on
	}
	if notReady.IsZero() {
		t.Errorf("the listener closed %v after SIGTERM without /readyz ever answering 503", refused.Sub(sigterm))
	} else if refused.Sub(sigterm) < drainDelay {
		t.Errorf("the listener closed %v after SIGTERM, before drain_delay %v", refused.Sub(sigterm), drainDelay)
	}

	// The streams are cut at the end of the grace, each told so.
	readers.Wait()
	close(cuts)
	for c := range cuts {
		rest := strings.TrimLeft(c.rest, "\n")
		if c.err != nil || strings.Contains(rest, "[DONE]") || !strings.HasPrefix(rest, `data: {"error":`) || !strings.Contains(rest, `"code":"shutting_down"`) {
			t.Errorf("a stream after the provider's stall: %q (%v); want only the shutting_down error event", rest, c.err)
		}
		if d := c.at.Sub(sigterm); d < drainDelay+grace {
			t.Errorf("a stream was cut %v after SIGTERM, before drain_delay + shutdown_grace %v", d, drainDelay+grace)
		}
	}
	select {
	case <-a.Done:
	case <-time.After(drainDelay + grace + settleWait + margin - time.Since(sigterm)):
		t.Fatalf("%s still running %v after SIGTERM:\n%s", a.Name, time.Since(sigterm), a.Stderr.String())
	}
	if code := a.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("%s exited %d after SIGTERM; want 0:\n%s", a.Name, code, a.Stderr.String())
	}
	out := a.Stderr.String()
	for _, phase := range []string{"shutting down: /readyz answers 503", "closing the listener", "shutdown grace over: cutting the requests still running",
		"stopped: every request settled"} {
		if !strings.Contains(out, phase) {
			t.Errorf("%s did not log %q:\n%s", a.Name, phase, out)
		}
	}

	// Everything was settled before the exit: read it at once, through B.
	spent, holds, err := e2eutil.UsageOf(ctx, b, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	st := s.Stats().Total
	served := st.PromptTokens + s.sent.Load()
	t.Logf("provider served %d prompt + %d completion tokens over %d streams; the budget charged %d, %d holds live",
		st.PromptTokens, s.sent.Load(), st.Calls, spent, holds)
	if st.Calls != streams || s.sent.Load() != streams*stallAfter {
		t.Fatalf("the provider served %d calls and %d content chunks; want %d and %d", st.Calls, s.sent.Load(), streams, streams*stallAfter)
	}
	switch {
	case spent < served:
		t.Errorf("the budget charged %d tokens, the provider served %d: cut streams went unbilled", spent, served)
	case spent > served:
		t.Errorf("the budget charged %d tokens, the provider served %d; a cut stream is charged its prompt estimate plus one token per chunk streamed", spent, served)
	}
	if holds != 0 {
		t.Errorf("%d budget holds live after the exit", holds)
	}
	assertNothingHeld(t, ctx, rds)
}

// assertNothingHeld fails the test if the rate-limit store holds a live
// reservation or a concurrency permit, or the budget store a hold.
func assertNothingHeld(t *testing.T, ctx context.Context, rds *testutil.Redis) {
	t.Helper()
	rc := rds.Client(t)
	keys, err := rc.Do(ctx, rc.B().Keys().Pattern("llmgate:*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	var reservations, settled int
	for _, k := range keys {
		switch {
		case strings.Contains(k, "}:r:"): // a rate-limit reservation: "h..." held, "s" settled
			v, err := rc.Do(ctx, rc.B().Get().Key(k).Build()).ToString()
			if err != nil {
				t.Fatal(err)
			}
			reservations++
			if strings.HasPrefix(v, "h") {
				t.Errorf("rate-limit reservation %s is still held", k)
			} else {
				settled++
			}
		case strings.Contains(k, "}:c:"): // concurrency permits
			n, err := rc.Do(ctx, rc.B().Zcard().Key(k).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("%d concurrency permits still held in %s", n, k)
			}
		case strings.HasPrefix(k, "llmgate:budget:") && strings.HasSuffix(k, ":h"): // live budget holds
			n, err := rc.Do(ctx, rc.B().Hlen().Key(k).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("%d budget holds live in %s", n, k)
			}
		}
	}
	t.Logf("%d keys in the store; %d rate-limit reservations, %d of them settled", len(keys), reservations, settled)
}

// TestE2EShutdownSecondSignal: a second signal skips the rest of a long
// drain delay and grace: the replica exits at once, its stream cut and
// settled.
func TestE2EShutdownSecondSignal(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		stallAfter = 3
		wait       = time.Minute // drain_delay and shutdown_grace: far longer than the test
	)
	rds := testutil.StartRedis(t)
	s := newStallingSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}}, stallAfter)
	a := e2eutil.StartReplicasYAML(t, 1, gatewayConfig{
		Store: rds.URL(), SimURL: s.url, LogLevel: "info", Budget: "{period: day, tokens: 1000000}",
		Extra: fmt.Sprintf("server: {drain_delay: %v, shutdown_grace: %v}\n", wait, wait),
	}.YAML())[0]
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	br := openStalledStreams(t, ctx, a, 1, stallAfter)[0]
	waitUntil(t, 10*time.Second, "the stream hangs at the provider", func() bool { return s.stalled.Load() == 1 })

	sigterm := time.Now()
	if err := a.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a.Stderr.WaitFor(t, "shutting down: /readyz answers 503", 10*time.Second)
	if err := a.Cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var rest bytes.Buffer
	if _, err := rest.ReadFrom(br); err != nil || !strings.Contains(rest.String(), `"code":"shutting_down"`) {
		t.Errorf("the stream after the second signal: %q (%v); want the shutting_down error event", rest.String(), err)
	}
	select {
	case <-a.Done:
	case <-time.After(wait):
		t.Fatalf("%s still running %v after two signals:\n%s", a.Name, time.Since(sigterm), a.Stderr.String())
	}
	if code := a.Cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(a.Stderr.String(), "second signal: skipping") {
		t.Errorf("%s exited %d after two signals:\n%s", a.Name, code, a.Stderr.String())
	}
	t.Logf("exited %v after SIGTERM", time.Since(sigterm).Round(time.Millisecond))
	assertNothingHeld(t, ctx, rds)
}

// openStalledStreams opens n streams through r and reads each until the
// provider (a stallingSim that stalls after stallAfter content chunks) has
// sent all it will; it returns their readers, positioned there.
func openStalledStreams(t *testing.T, ctx context.Context, r *replica, n, stallAfter int) []*bufio.Reader {
	t.Helper()
	var out []*bufio.Reader
	for i := range n {
		body := fmt.Sprintf(`{"model":"gpt-4.1","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"a long story, part %d"}]}`, i)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+e2eutil.TenantKey)
		resp, err := e2eutil.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: %d", i, resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		for got := 0; got < stallAfter; {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("stream %d after %d chunks: %v", i, got, err)
			}
			if d, ok := strings.CutPrefix(line, "data: "); ok && openai.ParseChunk([]byte(d)).Content {
				got++
			}
		}
		out = append(out, br)
	}
	return out
}

//go:build unix

package app

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/sim"
)

// Helpers of the end-to-end tests of de-duplication, idempotency keys, the
// response cache and session ordering (serve_e2e5_test.go). They add to
// e2e_helpers_test.go what those tests need: a provider that can hold
// requests, replicas on a hand-edited configuration, and metric scraping.

// upstreamCall is one chat completion request as the provider saw it.
type upstreamCall struct {
	body      string
	requestID string // the gateway's x-request-id
	fence     string // x-fencing-token; "" when none was sent
	at        time.Time
	done      time.Time // when the provider finished with it (zero while it runs)
}

// gatedSim is the simulated provider on a loopback listener, wrapped to
// record every chat completion request in arrival order (with the time
// it arrived and the time the provider was done with it) and, while it is
// holding, to keep each one waiting until release.
type gatedSim struct {
	*sim.Server
	url string // the OpenAI base URL, ending in /v1

	mu      sync.Mutex    // protects gate, calls, changed
	gate    chan struct{} // requests arriving while non-nil wait for it to close
	calls   []upstreamCall
	changed chan struct{} // closed and replaced on every arrival
}

func newGatedSim(t testing.TB, cfg sim.Config) *gatedSim {
	t.Helper()
	srv, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &gatedSim{Server: srv, changed: make(chan struct{})}
	s.url = serveSimChat(t, srv, func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) {
		s.mu.Lock()
		i := len(s.calls)
		s.calls = append(s.calls, upstreamCall{
			body: string(body), requestID: r.Header.Get("X-Request-Id"), fence: r.Header.Get("X-Fencing-Token"), at: time.Now(),
		})
		gate := s.gate
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.calls[i].done = time.Now()
			s.mu.Unlock()
		}()
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done(): // the gateway gave up or died
				return
			}
		}
		next.ServeHTTP(w, r)
	})
	t.Cleanup(s.release) // runs first: nothing held keeps Close waiting
	return s
}

// serveSimChat serves srv on a loopback listener until the test ends and
// returns its OpenAI base URL. Chat completions go through chat, with
// their body read (and put back for next, srv's handler); the rest go to
// srv directly.
func serveSimChat(t testing.TB, srv *sim.Server, chat func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler)) string {
	h := srv.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		chat(w, r, body, h)
	}))
	t.Cleanup(hs.Close)
	return hs.URL + "/v1"
}

// hold makes requests that arrive from now on wait until release.
func (s *gatedSim) hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate == nil {
		s.gate = make(chan struct{})
	}
}

// release lets every held request through and stops holding.
func (s *gatedSim) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
}

// seen returns a copy of the requests so far, in arrival order.
func (s *gatedSim) seen() []upstreamCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]upstreamCall(nil), s.calls...)
}

// count returns how many requests arrived so far.
func (s *gatedSim) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

// waitArrival waits until a request whose body contains text has arrived,
// failing the test after timeout.
func (s *gatedSim) waitArrival(t testing.TB, text string, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		changed := s.changed
		found := false
		for _, c := range s.calls {
			if strings.Contains(c.body, text) {
				found = true
				break
			}
		}
		s.mu.Unlock()
		if found {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("no request with %q reached the provider within %v", text, timeout)
		}
	}
}

// waitCount waits until at least n requests have arrived, failing the
// test after timeout.
func (s *gatedSim) waitCount(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		changed, got := s.changed, len(s.calls)
		s.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%d requests reached the provider within %v; want %d", got, timeout, n)
		}
	}
}

// tenantYAML is c's configuration with settings, YAML lines indented for
// an entry of tenants:, added to tenant team-a.
func tenantYAML(t *testing.T, c gatewayConfig, settings string) string {
	t.Helper()
	const anchor = "    api_key_env: E2E_TENANT_KEY\n"
	y := c.yaml()
	if strings.Count(y, anchor) != 1 {
		t.Fatalf("tenant team-a's entry not found in the configuration:\n%s", y)
	}
	return strings.Replace(y, anchor, anchor+settings, 1)
}

// startReplicasYAML starts n replicas on one configuration file with the
// given content and waits until all are ready.
func startReplicasYAML(t *testing.T, n int, yaml string) []*replica {
	t.Helper()
	path := filepath.Join(t.TempDir(), "llmgate.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	rs := make([]*replica, n)
	for i := range rs {
		rs[i] = launchServe(t, fmt.Sprintf("replica-%c", 'A'+i), e2eEnv, "--config", path)
	}
	for _, r := range rs {
		r.waitReady(t)
	}
	return rs
}

// metric returns the value of one series of the replica's /metrics, its
// name and labels written as Prometheus prints them (for example
// `llmgate_dedup_total{role="follower"}`); 0 when the series is absent
// (a counter vector shows a label only once it was used).
func (r *replica) metric(ctx context.Context, series string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := e2eHTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s/metrics: %d", r.name, resp.StatusCode)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), series+" ")
		if !ok {
			continue
		}
		f, _, _ := strings.Cut(v, " ") // a timestamp may follow
		return strconv.ParseFloat(f, 64)
	}
	return 0, sc.Err()
}

// sumMetric adds up one series over the replicas (call it from the test's
// goroutine).
func sumMetric(t *testing.T, ctx context.Context, reps []*replica, series string) float64 {
	t.Helper()
	var sum float64
	for _, r := range reps {
		v, err := r.metric(ctx, series)
		if err != nil {
			t.Fatalf("%s %s: %v", r.name, series, err)
		}
		sum += v
	}
	return sum
}

// reply is what a client got for one request.
type reply struct {
	status int // 0 on a transport error
	header http.Header
	body   []byte
	err    error
	done   time.Time
}

// send posts a chat completion body through r and returns what came back;
// safe from any goroutine.
func send(ctx context.Context, r *replica, body string, hdr ...string) reply {
	resp, b, err := r.tryPost(ctx, "/v1/chat/completions", e2eTenantKey, body, hdr...)
	rep := reply{err: err, body: b, done: time.Now()}
	if err == nil {
		rep.status, rep.header = resp.StatusCode, resp.Header
	}
	return rep
}

// sseEvents splits an SSE body into its events (without the blank line
// that ends each).
func sseEvents(body []byte) []string {
	var out []string
	for ev := range strings.SplitSeq(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		out = append(out, ev)
	}
	return out
}

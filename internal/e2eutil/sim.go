package e2eutil

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/sim"
)

// UpstreamCall is one chat completion request as the provider saw it.
type UpstreamCall struct {
	Body      string
	RequestID string // the gateway's x-request-id
	Fence     string // x-fencing-token; "" when none was sent
	At        time.Time
	Done      time.Time // when the provider finished with it (zero while it runs)
}

// GatedSim is the simulated provider on a loopback listener, wrapped to
// record every chat completion request in arrival order (with the time
// it arrived and the time the provider was done with it) and, while it is
// holding, to keep each one waiting until release.
type GatedSim struct {
	*sim.Server
	URL string // the OpenAI base URL, ending in /v1

	mu      sync.Mutex    // protects gate, calls, changed
	gate    chan struct{} // requests arriving while non-nil wait for it to close
	calls   []UpstreamCall
	changed chan struct{} // closed and replaced on every arrival
}

// NewGatedSim starts a GatedSim on cfg, stopped when the test ends.
func NewGatedSim(t testing.TB, cfg sim.Config) *GatedSim {
	t.Helper()
	srv, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &GatedSim{Server: srv, changed: make(chan struct{})}
	s.URL = ServeSimChat(t, srv, func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) {
		s.mu.Lock()
		i := len(s.calls)
		s.calls = append(s.calls, UpstreamCall{
			Body: string(body), RequestID: r.Header.Get("X-Request-Id"), Fence: r.Header.Get("X-Fencing-Token"), At: time.Now(),
		})
		gate := s.gate
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.calls[i].Done = time.Now()
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
	t.Cleanup(s.Release) // runs first: nothing held keeps Close waiting
	return s
}

// ServeSimChat serves srv on a loopback listener until the test ends and
// returns its OpenAI base URL. Chat completions go through chat, with
// their body read (and put back for next, srv's handler); the rest go to
// srv directly.
func ServeSimChat(t testing.TB, srv *sim.Server, chat func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler)) string {
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

// Hold makes requests that arrive from now on wait until Release.
func (s *GatedSim) Hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate == nil {
		s.gate = make(chan struct{})
	}
}

// Release lets every held request through and stops holding.
func (s *GatedSim) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
}

// Seen returns a copy of the requests so far, in arrival order.
func (s *GatedSim) Seen() []UpstreamCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]UpstreamCall(nil), s.calls...)
}

// Count returns how many requests arrived so far.
func (s *GatedSim) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

// WaitArrival waits until a request whose body contains text has arrived,
// failing the test after timeout.
func (s *GatedSim) WaitArrival(t testing.TB, text string, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		changed := s.changed
		found := false
		for _, c := range s.calls {
			if strings.Contains(c.Body, text) {
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

// WaitCount waits until at least n requests have arrived, failing the
// test after timeout.
func (s *GatedSim) WaitCount(t testing.TB, n int, timeout time.Duration) {
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

// WaitUntil polls cond until it holds, failing the test after timeout.
// For conditions on processes and stores that offer nothing to wait on.
func WaitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

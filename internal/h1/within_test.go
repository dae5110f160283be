package h1

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// within is RoundTripWithin of a POST with body "b".
func within(t *testing.T, tr *Transport, ctx context.Context, u string, d time.Duration) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader("b"))
	if err != nil {
		t.Fatal(err)
	}
	return tr.RoundTripWithin(req, d)
}

// TestWithinHeadersLate: headers that do not come within the bound fail
// the call with ErrHeaderTimeout, not as a cancellation.
func TestWithinHeadersLate(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-release })
	_, err := within(t, newTransport(), t.Context(), s.URL, 20*time.Millisecond)
	if !errors.Is(err, ErrHeaderTimeout) || errors.Is(err, context.Canceled) {
		t.Fatalf("RoundTripWithin = %v, want ErrHeaderTimeout", err)
	}
}

// TestWithinSparesBody: once a 200's headers are in, its body may take far
// longer than the bound, and the connection serves the next request with
// no deadline left on it.
func TestWithinSparesBody(t *testing.T) {
	// d leaves a loaded CI machine time for the headers; the body takes
	// longer than d.
	const d = 200 * time.Millisecond
	s, conns := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("head;"))
		w.(http.Flusher).Flush()
		time.Sleep(d + d/2) // the slow body under test, not a synchronisation
		w.Write([]byte("tail"))
	})
	tr := newTransport()
	resp, err := within(t, tr, t.Context(), s.URL, d)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != "head;tail" {
		t.Fatalf("body %q", got)
	}
	// Plain RoundTrip on the same connection: a deadline left over would
	// have passed by now.
	resp, err = post(t, tr, t.Context(), s.URL, "b")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1 reused", n)
	}
}

// TestWithinErrorBody: the bound goes on over an error response's body; a
// complete one frees the connection for reuse without its deadline.
func TestWithinErrorBody(t *testing.T) {
	// The stalled call waits out d; the whole one must fit in it, on a
	// loaded CI machine too.
	const stalled, d = 30 * time.Millisecond, 200 * time.Millisecond
	release := make(chan struct{})
	defer close(release)
	s, conns := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte("slow"))
		w.(http.Flusher).Flush()
		if r.URL.Path == "/stall" {
			<-release
		}
		w.Write([]byte("-error"))
	})
	tr := newTransport()
	resp, err := within(t, tr, t.Context(), s.URL+"/stall", stalled)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, ErrHeaderTimeout) {
		t.Fatalf("stalled error body: %v, want ErrHeaderTimeout", err)
	}
	resp, err = within(t, tr, t.Context(), s.URL+"/whole", d)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != "slow-error" {
		t.Fatalf("body %q", got)
	}
	time.Sleep(d + d/2)                                       // past that call's bound: it must not be left on the connection
	resp, err = post(t, tr, t.Context(), s.URL+"/whole", "b") // plain RoundTrip sets no deadline of its own
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != "slow-error" {
		t.Fatalf("body %q", got)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the stalled one closed, then one reused)", n)
	}
}

// TestWithinCancel: a cancellation during the bounded wait is the
// context's error, and one after the headers (when the bound has been
// lifted from the connection) still cuts the body.
func TestWithinCancel(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	s, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/body" {
			w.Write([]byte("head"))
			w.(http.Flusher).Flush()
		}
		arrived <- struct{}{}
		<-release
	})
	tr := newTransport()
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-arrived
		cancel()
	}()
	_, err := within(t, tr, ctx, s.URL+"/headers", time.Hour)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrHeaderTimeout) {
		t.Fatalf("cancelled while waiting: %v, want context.Canceled only", err)
	}

	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	resp, err := within(t, tr, ctx, s.URL+"/body", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	<-arrived
	cancel()
	if _, err := io.ReadAll(resp.Body); err == nil || errors.Is(err, ErrHeaderTimeout) {
		t.Fatalf("body read after a cancellation: %v, want it cut, and not as a timeout", err)
	}
}

// TestWithinFallback: a request that goes to Fallback is bounded too, by
// a timer; the fallback's body is spared once a 200's headers are in.
func TestWithinFallback(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stall" {
			<-release
		}
		w.Write([]byte("ok"))
	})
	fb := &recordingFallback{}
	tr := New(fb)
	unknownLength := func(path string) *http.Request {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL+path, io.MultiReader(strings.NewReader("b")))
		req.ContentLength = -1 // goes to the fallback
		return req
	}
	if _, err := tr.RoundTripWithin(unknownLength("/stall"), 20*time.Millisecond); !errors.Is(err, ErrHeaderTimeout) {
		t.Fatalf("fallback, stalled: %v, want ErrHeaderTimeout", err)
	}
	resp, err := tr.RoundTripWithin(unknownLength("/ok"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != "ok" {
		t.Fatalf("body %q", got)
	}
	if fb.n.Load() != 2 {
		t.Fatalf("fallback used %d times, want 2", fb.n.Load())
	}
}

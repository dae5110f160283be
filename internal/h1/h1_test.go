package h1

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// newServer starts an HTTP server that counts the connections it accepts.
func newServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	s := httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s, &conns
}

// echo answers with the request's method, URI, a header and body.
func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "%s %s x=%s len=%d body=%s", r.Method, r.URL.RequestURI(), r.Header.Get("X-Test"), r.ContentLength, b)
}

func newTransport() *Transport {
	return New(failingFallback{})
}

// failingFallback fails the test's expectations loudly if it is used.
type failingFallback struct{}

func (failingFallback) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("fallback used")
}

func post(t *testing.T, tr http.RoundTripper, ctx context.Context, u, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Test", "v1")
	return tr.RoundTrip(req)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	_ = resp.Body.Close()
	return string(b)
}

func TestRoundTripReusesOneConnection(t *testing.T) {
	s, conns := newServer(t, echo)
	tr := newTransport()
	for i := range 50 {
		resp, err := post(t, tr, t.Context(), s.URL+"/v1/chat?q=1", fmt.Sprintf("hello %d", i))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/plain" {
			t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		want := fmt.Sprintf("POST /v1/chat?q=1 x=v1 len=%d body=hello %d", len(fmt.Sprintf("hello %d", i)), i)
		if got := readAll(t, resp); got != want {
			t.Fatalf("request %d: %q, want %q", i, got, want)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 50 sequential requests, want 1", n)
	}
}

func TestConcurrentRequests(t *testing.T) {
	s, conns := newServer(t, echo)
	tr := newTransport()
	const workers, each = 16, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				body := fmt.Sprintf("w%d-%d", w, i)
				resp, err := post(t, tr, t.Context(), s.URL+"/x", body)
				if err != nil {
					t.Error(err)
					return
				}
				if got, want := readAll(t, resp), fmt.Sprintf("POST /x x=v1 len=%d body=%s", len(body), body); got != want {
					t.Errorf("%q, want %q", got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := conns.Load(); n > workers {
		t.Fatalf("%d connections for %d concurrent workers", n, workers)
	}
}

// TestStreamArrivesEventByEvent: the first event is readable while the
// server still holds back the second.
func TestStreamArrivesEventByEvent(t *testing.T) {
	gotFirst := make(chan struct{})
	s, conns := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-gotFirst:
		case <-time.After(10 * time.Second):
			return // the client never saw the first event: it buffered
		}
		fmt.Fprint(w, "data: two\n\ndata: [DONE]\n\n")
	})
	tr := newTransport()
	for range 2 { // the second run reuses the connection after a chunked body
		resp, err := post(t, tr, t.Context(), s.URL, "{}")
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "data: one\n" {
			t.Fatalf("first line %q, %v", line, err)
		}
		gotFirst <- struct{}{}
		rest, err := io.ReadAll(br)
		if err != nil || string(rest) != "\ndata: two\n\ndata: [DONE]\n\n" {
			t.Fatalf("rest %q, %v", rest, err)
		}
		_ = resp.Body.Close()
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1 (a chunked body read to its end frees the connection)", n)
	}
}

func TestConnectionCloseIsNotReused(t *testing.T) {
	s, conns := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		echo(w, r)
	})
	tr := newTransport()
	for range 3 {
		resp, err := post(t, tr, t.Context(), s.URL, "b")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3 (the server closes each)", n)
	}
}

func TestBodyClosedEarlyClosesConnection(t *testing.T) {
	s, conns := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte("x"), 64<<10))
	})
	tr := newTransport()
	for range 2 {
		resp, err := post(t, tr, t.Context(), s.URL, "b")
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 10)
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (a body closed half read is not reusable)", n)
	}
}

func TestInformationalResponsesAreSkipped(t *testing.T) {
	s, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "made")
	})
	resp, err := post(t, newTransport(), t.Context(), s.URL, "b")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201 after the 103", resp.StatusCode)
	}
	if got := readAll(t, resp); got != "made" {
		t.Fatalf("body %q", got)
	}
}

func TestCancelWhileWaitingForHeaders(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	arrived := make(chan struct{}, 1)
	s, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
	})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-arrived
		cancel()
	}()
	_, err := post(t, newTransport(), ctx, s.URL, "b")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("RoundTrip = %v, want context.Canceled", err)
	}
}

func TestCancelMidBody(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	gone := make(chan struct{})
	s, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done(): // the client's connection closed
			close(gone)
		case <-release:
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	resp, err := post(t, newTransport(), ctx, s.URL, "b")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 11)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := resp.Body.Read(buf); err == nil {
		t.Fatal("Read after cancel succeeded")
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the server never saw the connection close")
	}
}

// rawServer accepts connections and runs serve on each.
func rawServer(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var conns atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
	return "http://" + ln.Addr().String(), &conns
}

// TestIdleConnectionClosedByServerIsRetried: a server that closes each
// connection after one answer, without saying so, makes the next request
// on the pooled connection fail before any byte: it is sent again, body
// included, on a new connection.
func TestIdleConnectionClosedByServerIsRetried(t *testing.T) {
	var requests atomic.Int64
	u, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(req.Body)
		requests.Add(1)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
	})
	tr := newTransport()
	for i := range 3 {
		// The first request leaves the connection in the pool; the server
		// has closed it by the time the second one takes it.
		resp, err := post(t, tr, t.Context(), u, fmt.Sprintf("body %d", i))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := readAll(t, resp); got != fmt.Sprintf("body %d", i) {
			t.Fatalf("request %d: %q", i, got)
		}
	}
	if n := requests.Load(); n != 3 {
		t.Fatalf("server handled %d requests, want 3", n)
	}
	if n := conns.Load(); n < 3 {
		t.Fatalf("%d connections, want a new one per request", n)
	}
}

// TestNoRetryOnceTheServerAnswered: a server that dies halfway through its
// answer has handled the request; it is not sent again.
func TestNoRetryOnceTheServerAnswered(t *testing.T) {
	var requests atomic.Int64
	u, _ := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if requests.Add(1) == 1 {
				fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				continue
			}
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-") // and hang up
			return
		}
	})
	tr := newTransport()
	resp, err := post(t, tr, t.Context(), u, "a")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if _, err := post(t, tr, t.Context(), u, "b"); err == nil {
		t.Fatal("a cut answer gave no error")
	}
	if n := requests.Load(); n != 2 {
		t.Fatalf("server handled %d requests, want 2 (no retry after it answered)", n)
	}
}

func TestCloseDelimitedBody(t *testing.T) {
	u, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
	})
	tr := newTransport()
	for range 2 {
		resp, err := post(t, tr, t.Context(), u, "a")
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, resp); got != "until the end" {
			t.Fatalf("body %q", got)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (a close-delimited body ends its connection)", n)
	}
}

func TestHeaderInjectionIsRefused(t *testing.T) {
	s, conns := newServer(t, echo)
	tr := newTransport()
	for _, h := range [][2]string{
		{"X-Test", "a\r\nX-Evil: 1"},
		{"X-Test", "a\nb"},
		{"X-Test", "nul\x00"},
		{"Bad Name", "v"},
		{"X-Evil:\r\n", "v"},
	} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL, strings.NewReader("b"))
		req.Header[h[0]] = []string{h[1]}
		if _, err := tr.RoundTrip(req); err == nil {
			t.Errorf("header %q: %q was sent", h[0], h[1])
		} else if ValidToken(h[0]) && strings.Contains(err.Error(), h[1]) {
			t.Errorf("error %q repeats the header's value", err)
		}
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("%d connections opened for refused requests", n)
	}
}

type recordingFallback struct{ n atomic.Int64 }

func (f *recordingFallback) RoundTrip(req *http.Request) (*http.Response, error) {
	f.n.Add(1)
	return http.DefaultTransport.RoundTrip(req)
}

func TestFallback(t *testing.T) {
	s, _ := newServer(t, echo)
	fb := &recordingFallback{}
	tr := New(fb)
	tr.Proxy = func(r *http.Request) (*url.URL, error) {
		if strings.Contains(r.URL.Path, "proxied") {
			return url.Parse("http://127.0.0.1:1")
		}
		return nil, nil
	}
	// A body of unknown length goes to the fallback.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL+"/x", io.MultiReader(strings.NewReader("abc")))
	req.ContentLength = -1
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if fb.n.Load() != 1 {
		t.Fatalf("fallback used %d times, want 1 for a body of unknown length", fb.n.Load())
	}
	// A known body goes direct.
	resp, err = post(t, tr, t.Context(), s.URL+"/x", "abc")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if fb.n.Load() != 1 {
		t.Fatalf("fallback used for a plain request")
	}
	// A host whose first request needs a proxy goes to the fallback for
	// good (the fallback here ignores the proxy and goes direct).
	other := strings.Replace(s.URL, "127.0.0.1", "localhost", 1)
	for _, path := range []string{"/proxied", "/any"} {
		resp, err := post(t, tr, t.Context(), other+path, "abc")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	if fb.n.Load() != 3 {
		t.Fatalf("fallback used %d times, want 3", fb.n.Load())
	}
}

func TestTLS(t *testing.T) {
	var proto atomic.Value
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto.Store(r.Proto)
		echo(w, r)
	}))
	s.EnableHTTP2 = true // offered, but the transport asks for HTTP/1.1
	s.StartTLS()
	t.Cleanup(s.Close)
	pool := x509.NewCertPool()
	pool.AddCert(s.Certificate())
	tr := newTransport()
	tr.TLSConfig = &tls.Config{RootCAs: pool}
	for range 2 {
		resp, err := post(t, tr, t.Context(), s.URL+"/secure", "hi")
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, resp); got != "POST /secure x=v1 len=2 body=hi" {
			t.Fatalf("body %q", got)
		}
	}
	if p := proto.Load(); p != "HTTP/1.1" {
		t.Fatalf("server saw %v, want HTTP/1.1", p)
	}
	// Without the test CA, the certificate is refused.
	if _, err := post(t, newTransport(), t.Context(), s.URL, "hi"); err == nil {
		t.Fatal("an unknown certificate was accepted")
	}
}

func TestIdleLimits(t *testing.T) {
	s, conns := newServer(t, echo)
	tr := newTransport()
	tr.IdleTimeout = time.Nanosecond // every pooled connection is too old to use
	for range 3 {
		resp, err := post(t, tr, t.Context(), s.URL, "a")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections with a 1ns idle timeout, want 3", n)
	}

	tr = newTransport()
	tr.MaxIdlePerHost = 2
	var resps []*http.Response
	for range 5 {
		resp, err := post(t, tr, t.Context(), s.URL, "a")
		if err != nil {
			t.Fatal(err)
		}
		resps = append(resps, resp)
	}
	for _, r := range resps {
		readAll(t, r)
	}
	if idle := idleCount(tr); idle != 2 {
		t.Fatalf("%d idle connections, want MaxIdlePerHost = 2", idle)
	}
	tr.CloseIdleConnections()
	if idle := idleCount(tr); idle != 0 {
		t.Fatalf("%d idle connections left after CloseIdleConnections", idle)
	}
}

func idleCount(tr *Transport) int {
	n := 0
	tr.hosts.Range(func(_, v any) bool {
		h := v.(*host)
		h.mu.Lock()
		n += len(h.idle)
		h.mu.Unlock()
		return true
	})
	return n
}

func TestRequestBodyIsClosed(t *testing.T) {
	s, _ := newServer(t, echo)
	tr := newTransport()
	for _, bad := range []bool{false, true} {
		b := &closeRecorder{Reader: strings.NewReader("abc")}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL, b)
		req.ContentLength = 3
		if bad {
			req.Header.Set("X-Test", "a\r\nb")
		}
		resp, err := tr.RoundTrip(req)
		if err == nil {
			readAll(t, resp)
		}
		if !b.closed {
			t.Fatalf("bad=%v: the request body was not closed", bad)
		}
	}
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

// FuzzWriteRequest: whatever the header and path, either the transport
// refuses the request, or a server reads back exactly one request with the
// same header value and body.
func FuzzWriteRequest(f *testing.F) {
	f.Add("X-Test", "value", "/v1/chat/completions", "body")
	f.Add("X-Test", "a\r\nX-Evil: 1", "/", "")
	f.Add("Authorization", "Bearer sk-1", "/a?b=c", "{}")
	f.Add("X", "\t tab", "/%0d%0a", "x")
	f.Fuzz(func(t *testing.T, name, value, path, body string) {
		u, err := url.Parse("http://example.test" + path)
		if err != nil || u.Host != "example.test" {
			return
		}
		req, err := http.NewRequest(http.MethodPost, u.String(), strings.NewReader(body))
		if err != nil {
			return
		}
		req.Header[name] = []string{value}
		if validHeaders(req) != nil {
			return
		}
		var buf bytes.Buffer
		c := &conn{bw: bufio.NewWriter(&buf)}
		if err := c.writeRequest(req); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(bytes.NewReader(buf.Bytes()))
		got, err := http.ReadRequest(br)
		if err != nil {
			t.Fatalf("server cannot read %q: %v", buf.Bytes(), err)
		}
		gotBody, _ := io.ReadAll(got.Body)
		if string(gotBody) != body {
			t.Fatalf("body %q, want %q", gotBody, body)
		}
		if !skipHeader(http.CanonicalHeaderKey(name)) && http.CanonicalHeaderKey(name) != "Host" && http.CanonicalHeaderKey(name) != "User-Agent" {
			if gv := got.Header.Values(name); len(gv) != 1 || gv[0] != strings.Trim(value, " \t") {
				t.Fatalf("header %q = %q, want [%q]", name, gv, value)
			}
		}
		if _, err := http.ReadRequest(br); err != io.EOF {
			t.Fatalf("a second request was smuggled in %q: %v", buf.Bytes(), err)
		}
	})
}

// TestValidToken: every byte, against RFC 9110's definition of tchar.
func TestValidToken(t *testing.T) {
	for c := 0; c < 256; c++ {
		want := c > ' ' && c < 0x7f && !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, rune(c))
		if got := ValidToken(string([]byte{byte(c)})); got != want {
			t.Errorf("ValidToken(%q) = %v, want %v", []byte{byte(c)}, got, want)
		}
	}
	if ValidToken("") {
		t.Error("the empty string is a token")
	}
}

// TestHostOf: a URL's host is found by its scheme and host as written, the
// same for every spelling of one address, and the lookup table stays
// bounded.
func TestHostOf(t *testing.T) {
	tr := &Transport{Proxy: func(*http.Request) (*url.URL, error) { return nil, nil }}
	get := func(raw string) *host {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, raw, nil)
		if err != nil {
			t.Fatal(err)
		}
		h, err := tr.hostOf(req)
		if err != nil || h == nil {
			t.Fatalf("hostOf(%s) = %v, %v", raw, h, err)
		}
		return h
	}
	a := get("http://127.0.0.1/v1/a")
	if get("http://127.0.0.1:80/v1/b") != a || get("http://127.0.0.1/v1/c") != a {
		t.Error("one address, spelled two ways, got two hosts")
	}
	if get("https://127.0.0.1/v1/a") == a {
		t.Error("http and https share a host")
	}
	first := make(map[string]*host)
	for i := range maxByURL + 50 {
		raw := fmt.Sprintf("http://127.0.0.1:%d/", 10000+i)
		first[raw] = get(raw)
	}
	for raw, h := range first {
		if get(raw) != h {
			t.Fatalf("%s: a second lookup found another host", raw)
		}
	}
	if n := len(*tr.byURL.Load()); n > maxByURL {
		t.Errorf("the lookup table holds %d entries; want at most %d", n, maxByURL)
	}
}

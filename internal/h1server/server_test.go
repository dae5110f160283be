package h1server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"strings"
	"testing"
	"time"
)

// start serves h on a loopback port until the test ends.
func start(t *testing.T, h http.Handler) (*Server, string) {
	t.Helper()
	return startServer(t, &Server{Handler: h})
}

// startServer runs s on a loopback port until the test ends.
func startServer(t *testing.T, s *Server) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve = %v, want ErrServerClosed", err)
		}
	})
	return s, ln.Addr().String()
}

// echo answers the request's method, path, a header and its body.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "%s %s %s %q", r.Method, r.URL.Path, r.Header.Get("X-Test"), b)
})

func TestWithNetHTTPClient(t *testing.T) {
	_, addr := start(t, echo)
	c := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 5 * time.Second}}
	defer c.CloseIdleConnections()
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte("chunked "))
		_, _ = pw.Write([]byte("body"))
		_ = pw.Close()
	}()
	cases := []struct {
		name   string
		req    func() *http.Request
		answer string
	}{
		{"GET", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/a", nil)
			return r
		}, `GET /a  ""`},
		{"POST with a length", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/b", strings.NewReader(`{"x":1}`))
			r.Header.Set("X-Test", "yes")
			return r
		}, `POST /b yes "{\"x\":1}"`},
		{"chunked POST", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/c", pr)
			return r
		}, `POST /c  "chunked body"`},
		{"Expect: 100-continue", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPut, "http://"+addr+"/d", strings.NewReader("after the 100"))
			r.Header.Set("Expect", "100-continue")
			return r
		}, `PUT /d  "after the 100"`},
	}
	reused := 0
	for _, tc := range cases {
		req := tc.req()
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) {
				if i.Reused {
					reused++
				}
			},
		}))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || string(b) != tc.answer {
			t.Fatalf("%s: %d %q %v; want 200 %q", tc.name, resp.StatusCode, b, err, tc.answer)
		}
	}
	if reused != len(cases)-1 {
		t.Errorf("%d of %d requests reused the connection; want all but the first", reused, len(cases))
	}
}

// TestHeaderFreshPerRequest: requests on one connection share its header
// map, emptied in between. No header of one answer leaks into the next,
// and a value slice a handler kept stays as it was.
func TestHeaderFreshPerRequest(t *testing.T) {
	keptc := make(chan []string, 1) // from the server's goroutine
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if len(h) != 0 {
			t.Errorf("%s: the handler found headers already set: %v", r.URL.Path, h)
		}
		if r.URL.Path == "/first" {
			h["X-First"] = []string{"1"}
			keptc <- h["X-First"]
		}
		h["X-Path"] = []string{r.URL.Path}
		_, _ = io.WriteString(w, "ok")
	}))
	answers := exchange(t, addr, "GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	i := strings.Index(answers[1:], "HTTP/1.1 ") // the second answer's status line
	if i < 0 {
		t.Fatalf("want two answers, got %q", answers)
	}
	a1, a2 := answers[:i+1], answers[i+1:]
	if !strings.Contains(a1, "X-First: 1\r\n") || !strings.Contains(a1, "X-Path: /first\r\n") {
		t.Errorf("first answer %q", a1)
	}
	if strings.Contains(a2, "X-First") || !strings.Contains(a2, "X-Path: /second\r\n") {
		t.Errorf("second answer %q: want X-Path /second and no X-First", a2)
	}
	if kept := <-keptc; len(kept) != 1 || kept[0] != "1" {
		t.Errorf("the kept value slice changed to %q", kept)
	}
}

// exchange writes raw to a new connection and returns everything the
// server sends until it closes the connection.
func exchange(t *testing.T, addr, raw string) string {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(nc, raw); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(nc)
	if err != nil {
		t.Fatalf("reading the answer: %v (so far %q)", err, b)
	}
	return string(b)
}

func TestRawExchanges(t *testing.T) {
	_, addr := start(t, echo)
	big := strings.Repeat("a", DefaultMaxHeaderBytes)
	cases := []struct {
		name string
		raw  string
		want []string // in order
		not  []string
	}{
		{"pipelined, then close", "GET /1 HTTP/1.1\r\nHost: x\r\n\r\nPOST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
			[]string{"HTTP/1.1 200 OK", `GET /1  ""`, "HTTP/1.1 200 OK", "Connection: close", `POST /2  "hi"`}, nil},
		{"HTTP/1.0 closes", "GET /old HTTP/1.0\r\n\r\n", []string{"HTTP/1.1 200 OK", "Connection: close", `GET /old  ""`}, nil},
		{"a long header line", "GET /long HTTP/1.1\r\nHost: x\r\nX-Test: " + strings.Repeat("b", 10000) + "\r\nConnection: close\r\n\r\n",
			[]string{"HTTP/1.1 200 OK", "GET /long " + strings.Repeat("b", 10000)}, nil},
		{"a malformed request line", "GARBAGE\r\n\r\n", []string{"HTTP/1.1 400 Bad Request", `"error":{"message":"malformed request line"`}, nil},
		{"headers too large", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n", []string{"HTTP/1.1 431 "}, nil},
		{"Content-Length and chunked", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", []string{"HTTP/1.1 400 "}, []string{"200 OK"}},
		{"two different lengths", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", []string{"HTTP/1.1 400 "}, []string{"200 OK"}},
		{"no Host in HTTP/1.1", "GET / HTTP/1.1\r\n\r\n", []string{"HTTP/1.1 400 "}, nil},
		{"a control byte in a value", "GET / HTTP/1.1\r\nHost: x\r\nX-Test: a\x01b\r\n\r\n", []string{"HTTP/1.1 400 "}, nil},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", []string{"HTTP/1.1 505 "}, nil},
		{"HEAD has no body", "HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			[]string{"HTTP/1.1 200 OK", "HTTP/1.1 200 OK", `GET /after  ""`}, []string{"HEAD /h"}},
		{"unread body skipped", "POST /u HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			[]string{`POST /u  "hello"`, `GET /next  ""`}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := exchange(t, addr, tc.raw)
			rest := got
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("answer %.300q lacks %.80q (in order)", got, w)
				}
				rest = rest[i+len(w):]
			}
			for _, w := range tc.not {
				if strings.Contains(got, w) {
					t.Fatalf("answer %.300q has %q", got, w)
				}
			}
		})
	}
}

// TestExpectUnread: an answer given without reading a body the client
// holds back (Expect: 100-continue) sends no 100 and closes the connection:
// the body may never come.
func TestExpectUnread(t *testing.T) {
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
	}))
	got := exchange(t, addr, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\nExpect: 100-continue\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 413 ") || strings.Contains(got, "100 Continue") {
		t.Fatalf("answer %q; want a 413 alone, then the connection closed", got)
	}
}

// TestStreamFlushes: a flushed chunk reaches the client while the handler
// still runs, in chunked framing that net/http's client reads.
func TestStreamFlushes(t *testing.T) {
	release := make(chan struct{})
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		<-release
		fmt.Fprint(w, "data: two\n\n")
	}))
	resp, err := http.Get("http://" + addr + "/s")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if te := resp.TransferEncoding; len(te) != 1 || te[0] != "chunked" {
		t.Errorf("Transfer-Encoding %v, want chunked", te)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first event %q, %v", line, err)
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

// TestFraming: a body without a Content-Length gets one when it is whole
// and small by the time the handler returns (as net/http's server does);
// a long or flushed one goes chunked. The header is the one at
// WriteHeader either way.
func TestFraming(t *testing.T) {
	long := strings.Repeat("z", maxHeld+1)
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		switch r.URL.Path {
		case "/small":
			w.WriteHeader(http.StatusTeapot)
			w.Header().Set("X-Late", "ignored") // after WriteHeader
			fmt.Fprint(w, "short ")
			fmt.Fprint(w, "answer")
		case "/empty":
			w.WriteHeader(http.StatusAccepted)
		case "/exact":
			fmt.Fprint(w, long[:maxHeld])
		case "/long":
			fmt.Fprint(w, "x")
			fmt.Fprint(w, long)
		case "/flushed":
			fmt.Fprint(w, "early")
			_ = http.NewResponseController(w).Flush()
			fmt.Fprint(w, " late")
		}
	}))
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		path   string
		status int
		body   string
		length int64 // -1: chunked
	}{
		{"/small", http.StatusTeapot, "short answer", 12},
		{"/empty", http.StatusAccepted, "", 0},
		{"/exact", http.StatusOK, long[:maxHeld], maxHeld},
		{"/long", http.StatusOK, "x" + long, -1},
		{"/flushed", http.StatusOK, "early late", -1},
	} {
		resp, err := client.Get("http://" + addr + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != tc.status || string(b) != tc.body {
			t.Errorf("%s: %d %.40q %v; want %d %.40q", tc.path, resp.StatusCode, b, err, tc.status, tc.body)
		}
		chunked := len(resp.TransferEncoding) == 1 && resp.TransferEncoding[0] == "chunked"
		if resp.ContentLength != tc.length || chunked != (tc.length < 0) {
			t.Errorf("%s: Content-Length %d, Transfer-Encoding %v; want length %d", tc.path, resp.ContentLength, resp.TransferEncoding, tc.length)
		}
		if resp.Header.Get("X-Late") != "" {
			t.Errorf("%s: a header set after WriteHeader was sent", tc.path)
		}
	}
}

// TestClientLeavingCancels: a client that closes its connection ends its
// request's context, whether it leaves while the handler runs or before,
// with epoll (Linux) and with the goroutine watch, and whether the context
// has a deadline (RequestTimeout) or not.
func TestClientLeavingCancels(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Minute} {
		for _, noEpoll := range []bool{false, true} {
			for _, early := range []bool{false, true} {
				t.Run(fmt.Sprintf("timeout=%v/noEpoll=%v/early=%v", timeout, noEpoll, early), func(t *testing.T) {
					testClientLeaving(t, timeout, noEpoll, early)
				})
			}
		}
	}
}

// TestRequestTimeout: RequestTimeout is each request's context deadline,
// counted from its handler's start, and ends the context when it passes.
func TestRequestTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	type result struct {
		left time.Duration // deadline - handler start
		err  error         // the context's error once done
	}
	results := make(chan result, 1)
	_, addr := startServer(t, &Server{RequestTimeout: timeout, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		dl, ok := r.Context().Deadline()
		if !ok {
			results <- result{err: errors.New("no deadline")}
			return
		}
		<-r.Context().Done()
		results <- result{left: dl.Sub(start), err: r.Context().Err()}
	})})
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	res := <-results
	if !errors.Is(res.err, context.DeadlineExceeded) {
		t.Fatalf("context ended with %v; want its deadline", res.err)
	}
	if res.left > timeout || res.left < timeout/2 {
		t.Fatalf("deadline %v after the handler started; want %v", res.left, timeout)
	}
}

func testClientLeaving(t *testing.T, timeout time.Duration, noEpoll, early bool) {
	entered, cancelled := make(chan struct{}), make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		close(entered)
		select {
		case <-r.Context().Done():
			cancelled <- context.Cause(r.Context())
		case <-time.After(10 * time.Second):
			cancelled <- errors.New("not cancelled in 10s")
		}
	})
	var nc net.Conn
	s := &Server{Handler: h, noEpoll: noEpoll, RequestTimeout: timeout}
	if early {
		// The client leaves after sending its request and before its
		// handler runs; with epoll the server learns it in between.
		s.afterRead = func(c *conn) {
			nc.Close()
			deadline := time.Now().Add(10 * time.Second)
			for c.epoll && time.Now().Before(deadline) {
				c.watchMu.Lock()
				gone := c.gone
				c.watchMu.Unlock()
				if gone {
					return
				}
				time.Sleep(time.Millisecond) // the kernel's event, on its own time
			}
		}
	}
	_, addr := startServer(t, s)
	var err error
	if nc, err = net.Dial("tcp", addr); err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(nc, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	if !early {
		<-entered
		nc.Close()
	}
	want := errClientGone // the cause, without a deadline
	if timeout > 0 {
		want = context.Canceled
	}
	if err := <-cancelled; !errors.Is(err, want) {
		t.Fatalf("context ended with %v; want %v", err, want)
	}
}

// TestShutdownWaits: Shutdown closes idle connections at once and waits
// for a request in progress.
func TestShutdownWaits(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	s, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(entered)
			<-release
		}
		fmt.Fprint(w, "done")
	}))
	idle, err := net.Dial("tcp", addr) // connected, sends nothing
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	answer := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/slow")
		if err != nil {
			answer <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer <- string(b)
	}()
	<-entered
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	_ = idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("idle connection: read %v; want it closed by Shutdown", err)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v while a request ran", err)
	default:
	}
	close(release)
	if got := <-answer; got != "done" {
		t.Fatalf("the request in progress got %q", got)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
}

// TestPanicClosesOnlyItsConnection: a handler panic ends its connection
// without an answer; the server goes on.
func TestPanicClosesOnlyItsConnection(t *testing.T) {
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic("boom")
		}
		fmt.Fprint(w, "fine")
	}))
	if got := exchange(t, addr, "GET /panic HTTP/1.1\r\nHost: x\r\n\r\n"); got != "" {
		t.Fatalf("a panicking handler's answer %q; want none", got)
	}
	if got := exchange(t, addr, "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); !strings.Contains(got, "fine") {
		t.Fatalf("after a panic: %q", got)
	}
}

// FuzzParseRequest: the request parser never panics on any input, and a
// request it accepts is framed one way and has what the handler needs.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
		"GET http://h/p?q=1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
		"PUT / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nz",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(raw), 64)
		r, status, err := parseRequest(br, 4096, nil)
		if err != nil {
			if r != nil || status < 0 {
				t.Fatalf("parseRequest failed with %v but returned %v, %d", err, r, status)
			}
			return
		}
		hr := &r.http
		if hr.Method == "" || hr.URL == nil || (hr.ProtoMinor == 1 && len(hr.Header["Host"]) != 1) { // an empty Host is valid
			t.Fatalf("accepted %q as %+v", raw, hr)
		}
		if r.chunked && hr.ContentLength != -1 || !r.chunked && hr.ContentLength < 0 {
			t.Fatalf("framing of %q: chunked %v, length %d", raw, r.chunked, hr.ContentLength)
		}
		// The headers are what net/textproto makes of the same lines.
		tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(raw)))
		for {
			line, err := tp.ReadLine()
			if err != nil {
				t.Fatalf("accepted %q, which has no request line: %v", raw, err)
			}
			if line != "" {
				break
			}
		}
		want, err := tp.ReadMIMEHeader()
		if err != nil {
			t.Fatalf("accepted %q, whose headers net/textproto rejects: %v", raw, err)
		}
		if !maps.EqualFunc(hr.Header, http.Header(want), slices.Equal) {
			t.Fatalf("headers of %q: %q; net/textproto reads %q", raw, hr.Header, want)
		}
		_, _ = io.Copy(io.Discard, &r.body) // reading the body never panics
	})
}

// TestDeadlinesOutlived: a handler that runs longer than the idle and
// read-header timeouts leaves its connection usable for the next request
// (the deadline of the wait for its request passed while it ran), and a
// body read after that time still arrives.
func TestDeadlinesOutlived(t *testing.T) {
	const timeout = 50 * time.Millisecond
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-time.After(3 * timeout) // the subject: time passing beyond the deadlines
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s %d", r.URL.Path, len(b))
	})
	_, addr := startServer(t, &Server{Handler: h, IdleTimeout: timeout, ReadHeaderTimeout: timeout})
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	var addrs []string
	for i, body := range []string{"", "small", strings.Repeat("b", 64<<10)} {
		trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) { addrs = append(addrs, ci.Conn.LocalAddr().String()) }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodPost, fmt.Sprintf("http://%s/%d", addr, i), strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("/%d %d", i, len(body)); resp.StatusCode != http.StatusOK || string(b) != want {
			t.Fatalf("request %d: %d %q, want %q", i, resp.StatusCode, b, want)
		}
	}
	if addrs[0] != addrs[1] {
		t.Errorf("the second request came on a new connection (%v): the first one did not survive its handler", addrs)
	}
}

// TestSlowHeaderCut: a keep-alive client that starts its next request and
// stalls in the header is cut after ReadHeaderTimeout, not IdleTimeout.
func TestSlowHeaderCut(t *testing.T) {
	_, addr := startServer(t, &Server{Handler: echo, ReadHeaderTimeout: 100 * time.Millisecond, IdleTimeout: time.Minute})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	br := bufio.NewReader(nc)
	_, _ = io.WriteString(nc, "GET /1 HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_, _ = io.WriteString(nc, "GET /2 HTTP/1.1\r\nHost: x\r\n") // and nothing more
	_ = nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("stalled header: read %d, %v; want the server to close the connection", n, err)
	}
}

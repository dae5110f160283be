// Package h1server is a lean HTTP/1.1 server for the gateway: it runs any http.Handler with less work per request than net/http's server.
//
// llmgate serve uses it unless http_server is net/http. In `llmgate bench
// gateway --variants direct,proxy,memory,memory-nethttp` (BENCHMARKS.md,
// session 8) the gateway served by it answers about 7 % more requests a
// second at c=64 than on net/http's server, with less CPU per request. It
// keeps what a handler relies on
// (an *http.Request with its headers and a context that ends when the
// client leaves, a ResponseWriter that can flush) and what a server must do
// (keep-alive, Content-Length and chunked bodies, Expect: 100-continue,
// header size limits, read timeouts, panics, graceful shutdown), and
// nothing else: no HTTP/2, no TLS, no upgrades, no trailers.
package h1server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/llmgate/llmgate/internal/h1"
)

// Defaults for zero Server fields.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxHeaderBytes    = 1 << 20
)

// maxDiscard is how much of a body the handler left unread is skipped to
// keep the connection; beyond it the connection is closed.
const maxDiscard = 256 << 10

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = http.ErrServerClosed

// Server serves HTTP/1.x requests to Handler. Set its fields before Serve.
type Server struct {
	Handler http.Handler
	// ReadHeaderTimeout bounds the reading of a request's line and headers.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends nothing for
	// this long.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's line and headers (431 above).
	MaxHeaderBytes int
	// RequestTimeout, if positive, is the deadline of each request's
	// context, counted from when its handler starts. A handler that would
	// bound its requests itself (the gateway does) can use it instead of a
	// context of its own: one context less per request. The context of a
	// request whose client left then ends with context.Canceled as its
	// cause (without a deadline, the cause says the client left).
	RequestTimeout time.Duration
	// Logger receives handler panics. Default: discarded.
	Logger *slog.Logger

	noEpoll   bool        // tests: the goroutine watch on Linux too
	afterRead func(*conn) // tests: runs between reading a request and its handler

	mu        sync.Mutex // protects listeners, conns and closing
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   bool
}

// Serve accepts connections on ln until Shutdown or Close, and always
// returns an error: ErrServerClosed after those.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrServerClosed
	}
	if s.listeners == nil {
		s.listeners = make(map[net.Listener]struct{})
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			if isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff) // as net/http does on EMFILE and the like
				continue
			}
			return err
		}
		backoff = 0
		c := &conn{s: s, nc: nc}
		c.idle.Store(true) // no request yet: Shutdown may close it
		if !s.track(c) {
			_ = nc.Close()
			return ErrServerClosed
		}
		go c.serve()
	}
}

// isTemporary reports whether an Accept error says to try again (EMFILE,
// ECONNABORTED, a timeout).
func isTemporary(err error) bool {
	var t interface {
		Temporary() bool
		Timeout() bool
	}
	return errors.As(err, &t) && (t.Temporary() || t.Timeout())
}

func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	if s.conns == nil {
		s.conns = make(map[*conn]struct{})
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// Shutdown stops accepting, closes idle connections, and waits for the
// requests in progress to end (their connections close after them), or
// for ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopListening()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.closeIdle() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Close stops accepting and closes every connection at once.
func (s *Server) Close() error {
	s.stopListening()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		_ = c.nc.Close()
	}
	return nil
}

func (s *Server) stopListening() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	s.listeners = nil
}

// closeIdle closes the idle connections and returns how many are left.
func (s *Server) closeIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.idle.Load() {
			_ = c.nc.Close()
			delete(s.conns, c)
		}
	}
	return len(s.conns)
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

func (s *Server) readHeaderTimeout() time.Duration {
	if s.ReadHeaderTimeout > 0 {
		return s.ReadHeaderTimeout
	}
	return DefaultReadHeaderTimeout
}

func (s *Server) idleTimeout() time.Duration {
	if s.IdleTimeout > 0 {
		return s.IdleTimeout
	}
	return DefaultIdleTimeout
}

func (s *Server) maxHeaderBytes() int {
	if s.MaxHeaderBytes > 0 {
		return s.MaxHeaderBytes
	}
	return DefaultMaxHeaderBytes
}

// conn is one client connection. Its goroutine reads a request, runs the
// handler and writes the answer, then the next.
type conn struct {
	s    *Server
	nc   net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	idle atomic.Bool // waiting for a request (Shutdown may close it)

	// A client that leaves ends its request's context. On Linux one epoll
	// instance tells (hangup_linux.go); c is registered there under
	// hangupID. Elsewhere, or when registering fails, the watch does it:
	// once a handler has read its request's body, the connection's watcher
	// goroutine reads on (net/http does this with a goroutine per request,
	// which it must stop when the handler returns). The watcher's read is
	// not stopped: it is the wait for the next request, whose first bytes it
	// hands over through watchRes.
	hangupID uint64
	rawConn  syscall.RawConn
	// header is the answer's header map, emptied for each request: a map
	// sized for an answer's headers is about a kilobyte, the largest of a
	// request's allocations. No handler may use it after it returns (the
	// http.ResponseWriter contract), and the value slices it held are left
	// alone, so a copy a handler kept of them stays valid.
	header   http.Header
	epoll    bool       // registered for hangups: no watch needed
	watchMu  sync.Mutex // protects gone, watching and cancel
	gone     bool       // the client left
	watching bool       // the current request started a watch
	// cancel ends the running request's context: cancelCause when it has
	// no deadline (its cause then says the client left), else cancel.
	cancelCause context.CancelCauseFunc
	cancel      context.CancelFunc
	watchReq    chan struct{}    // to the watcher: read on; made with the watcher
	watchRes    chan watchResult // from the watcher: what it read
	// watchBuf is what the watcher reads into; ahead is what of it the
	// connection's reader has not taken yet. The channels hand it over.
	watchBuf []byte
	ahead    []byte

	scratch      scratch
	remote       string // remoteAddr's
	heldBuf      []byte // responses' held bodies, one after the other
	nextDeadline int    // what Read sets before reading the connection
}

type watchResult struct {
	n   int
	err error
}

// Read is the connection's reader for bufio: what the watcher read comes
// first. Only the connection's goroutine calls it. It sets the read
// deadline that nextDeadline asks for just before reading the connection:
// a request that came whole in the wait's read is parsed, and its body
// read, without another deadline set (each costs a timer update in the
// runtime), and nothing reads the connection again before the next wait
// sets one.
func (c *conn) Read(p []byte) (int, error) {
	if len(c.ahead) > 0 {
		n := copy(p, c.ahead)
		c.ahead = c.ahead[n:]
		return n, nil
	}
	switch c.nextDeadline {
	case deadlineHeader:
		_ = c.nc.SetReadDeadline(time.Now().Add(c.s.readHeaderTimeout()))
	case deadlineNone:
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	c.nextDeadline = deadlineKeep
	return c.nc.Read(p)
}

// The read deadlines Read sets before it next reads the connection.
const (
	deadlineKeep   = iota // the one set
	deadlineHeader        // the rest of a request's header: ReadHeaderTimeout
	deadlineNone          // a body: none
)

// startWatch has the watcher read on once the request's body has ended.
func (c *conn) startWatch() {
	if c.epoll {
		return
	}
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	if c.watching || c.br.Buffered() > 0 || len(c.ahead) > 0 {
		return // the next request's bytes are already here: nothing to watch
	}
	c.watching = true
	if c.watchReq == nil {
		c.watchReq, c.watchRes = make(chan struct{}, 1), make(chan watchResult, 1)
		c.watchBuf = make([]byte, 4096)
		go c.watcher()
	}
	c.watchReq <- struct{}{}
}

func (c *conn) watcher() {
	for range c.watchReq {
		// The whole buffer: what comes is the next request, read in one
		// system call.
		n, err := c.nc.Read(c.watchBuf)
		if n == 0 && err != nil {
			c.hangup()
		}
		c.watchRes <- watchResult{n, err}
	}
}

// hangup ends the request in progress, if any, because the client left.
func (c *conn) hangup() {
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	c.gone = true
	c.cancelRequest()
}

// cancelRequest ends the running request's context, if any; watchMu must
// be held.
func (c *conn) cancelRequest() {
	switch {
	case c.cancelCause != nil:
		c.cancelCause(errClientGone)
	case c.cancel != nil:
		c.cancel()
	}
}

// takeWatch reports whether the request just served started a watch, and
// clears it.
func (c *conn) takeWatch() bool {
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	w := c.watching
	c.watching = false
	return w
}

var errClientGone = errors.New("h1server: the client closed the connection")

func (c *conn) serve() {
	defer c.s.forget(c)
	defer c.nc.Close()
	c.epoll = !c.s.noEpoll && c.watchHangup()
	defer c.unwatchHangup() // before the close
	defer func() {
		if c.watchReq != nil {
			close(c.watchReq) // the watcher ends once its read does
		}
	}()
	c.br = bufio.NewReaderSize(c, 4096)
	c.bw = bufio.NewWriterSize(c.nc, 4096)
	first, watched := true, false
	for {
		// Wait for a request, as long as an idle connection may live: in
		// the watcher's read if the last request started one.
		c.idle.Store(true)
		timeout := c.s.idleTimeout()
		if first {
			timeout = c.s.readHeaderTimeout()
		}
		_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
		c.nextDeadline = deadlineKeep
		if watched {
			r := <-c.watchRes
			if r.n == 0 {
				return // the client left, or stayed idle too long
			}
			c.ahead = c.watchBuf[:r.n]
		} else if _, err := c.br.Peek(1); err != nil {
			return
		}
		c.idle.Store(false)
		if !first { // the first wait's deadline was the read-header one
			c.nextDeadline = deadlineHeader
		}
		first = false
		req, status, err := c.readRequest()
		if err != nil {
			if status != 0 {
				c.writeError(status, err.Error())
			}
			return
		}
		c.nextDeadline = deadlineNone // for a body read from the connection
		if !c.epoll {
			// The goroutine watch reads the connection itself, past
			// Read: its read must not meet the header's deadline.
			_ = c.nc.SetReadDeadline(time.Time{})
			c.nextDeadline = deadlineKeep
		}
		if c.s.afterRead != nil {
			c.s.afterRead(c)
		}
		ok := c.serveRequest(req)
		watched = c.takeWatch()
		if !ok || c.s.isClosing() {
			return
		}
	}
}

// serveRequest runs the handler on req and reports whether the connection
// may serve another request.
func (c *conn) serveRequest(req *request) (keepAlive bool) {
	var ctx context.Context
	var cancel context.CancelFunc
	var cancelCause context.CancelCauseFunc
	if t := c.s.RequestTimeout; t > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), t)
	} else {
		ctx, cancelCause = context.WithCancelCause(context.Background())
	}
	c.watchMu.Lock()
	c.cancel, c.cancelCause = cancel, cancelCause
	if c.gone { // it left before its request ran
		c.cancelRequest()
	}
	c.watchMu.Unlock()
	hr := req.http.WithContext(ctx)
	if c.header == nil {
		c.header = make(http.Header, 16)
	} else {
		clear(c.header)
	}
	w := &response{c: c, req: req, header: c.header, status: http.StatusOK}
	req.body.watchOnEOF = true
	if req.body.done {
		c.startWatch()
	}
	panicked := c.runHandler(w, hr)
	c.watchMu.Lock()
	c.cancel, c.cancelCause = nil, nil
	gone := c.gone
	c.watchMu.Unlock()
	// The answer ends before the context does: what its end sets off
	// (AfterFuncs, children's cancellations) is not the client's wait.
	finished := !panicked && !gone && w.finish()
	if cancel != nil {
		cancel()
	} else {
		cancelCause(context.Canceled)
	}
	if !finished {
		return false
	}
	if !req.keepAlive || w.closeAfter {
		return false
	}
	// What the handler left of the body must go before the next request;
	// a body the client waits to be asked for (Expect: 100-continue) may
	// never come, so its connection cannot serve another.
	if !req.body.done {
		if req.expect {
			return false
		}
		if n, err := io.CopyN(io.Discard, &req.body, maxDiscard+1); err != io.EOF || n > maxDiscard {
			return false
		}
	}
	return true
}

// runHandler calls the handler, turning a panic into a closed connection
// (and a log line, unless it is http.ErrAbortHandler).
func (c *conn) runHandler(w *response, r *http.Request) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			panicked = true
			if v != http.ErrAbortHandler && c.s.Logger != nil {
				c.s.Logger.Error("h1server: handler panic", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			}
		}
	}()
	c.s.Handler.ServeHTTP(w, r)
	return false
}

// writeError answers a request that could not be read, in OpenAI's error
// shape, and the connection closes after it.
func (c *conn) writeError(status int, msg string) {
	m, _ := json.Marshal(msg) // a string always encodes
	body := `{"error":{"message":` + string(m) + `,"type":"invalid_request_error","param":null,"code":"bad_http_request"}}`
	_ = c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c.bw, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
	if c.bw.Flush() != nil {
		return
	}
	// Closing with unread bytes would reset the connection, and the client
	// might lose the answer: stop writing, then take what it still sends
	// for a moment.
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		_ = c.nc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, _ = io.CopyN(io.Discard, c.nc, maxDiscard)
	}
}

// request is a parsed request and what the server needs to know of it.
type request struct {
	http      http.Request // the handler gets a copy with the request's context
	body      body         // in the request: one allocation for both
	chunked   bool
	keepAlive bool
	expect    bool // Expect: 100-continue, not answered yet
	head      bool
	proto11   bool
}

// maxKeptScratch is the largest header buffer a connection keeps.
const maxKeptScratch = 64 << 10

// scratch is what parsing a request reuses from one request to the next.
type scratch struct {
	raw  []byte // the header lines, one after the other
	ends []int  // where each line ends in raw
}

// remoteAddr is the client's address, made into a string once.
func (c *conn) remoteAddr() string {
	if c.remote == "" {
		c.remote = c.nc.RemoteAddr().String()
	}
	return c.remote
}

// readRequest reads a request line and headers. On failure status is the
// answer to send (0: none, the connection just ends).
func (c *conn) readRequest() (*request, int, error) {
	return parseRequest(c.br, c.s.maxHeaderBytes(), c)
}

// parseRequest reads one request's line and headers from br, taking at
// most maxHeader bytes. c (nil in the fuzz test) receives the body's
// Expect: 100-continue.
func parseRequest(br *bufio.Reader, maxHeader int, c *conn) (*request, int, error) {
	left := maxHeader
	var long []byte // a line longer than br's buffer, put together
	readLine := func() ([]byte, error) {
		long = long[:0]
		for {
			part, err := br.ReadSlice('\n')
			left -= len(part)
			if left < 0 {
				return nil, errHeaderTooLarge
			}
			if err == bufio.ErrBufferFull {
				long = append(long, part...)
				continue
			}
			if err != nil {
				return nil, err
			}
			line := part
			if len(long) > 0 {
				long = append(long, part...)
				line = long
			}
			line = line[:len(line)-1]
			if n := len(line); n > 0 && line[n-1] == '\r' {
				line = line[:n-1]
			}
			return line, nil
		}
	}
	line, err := readLine()
	for err == nil && len(line) == 0 { // RFC 9112 2.2: ignore empty lines before a request
		line, err = readLine()
	}
	if err != nil {
		return nil, statusFor(err), err
	}
	method, rest, ok1 := strings.Cut(string(line), " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !h1.ValidToken(method) || target == "" {
		return nil, http.StatusBadRequest, errors.New("malformed request line")
	}
	var proto11 bool
	switch proto {
	case "HTTP/1.1":
		proto11 = true
	case "HTTP/1.0":
	default:
		return nil, http.StatusHTTPVersionNotSupported, fmt.Errorf("unsupported protocol %.20q", proto)
	}
	u, err := url.ParseRequestURI(target)
	if err != nil || (method != http.MethodConnect && u.Host != "" && !strings.HasPrefix(target, "http")) {
		return nil, http.StatusBadRequest, errors.New("malformed request target")
	}
	// The header lines go into one buffer first, so that they become one
	// string, their values share one slice, and the map is made to size:
	// three allocations for all headers instead of two per header.
	sc := &scratch{}
	if c != nil {
		sc = &c.scratch
	}
	raw, ends := sc.raw[:0], sc.ends[:0]
	for {
		line, err := readLine()
		if err != nil {
			return nil, statusFor(err), err
		}
		if len(line) == 0 {
			break
		}
		raw = append(raw, line...)
		ends = append(ends, len(raw))
	}
	if cap(raw) <= maxKeptScratch { // a huge header block is not kept for the next request
		sc.raw, sc.ends = raw, ends
	}
	h := make(http.Header, len(ends))
	if len(ends) > 0 {
		block, values := string(raw), make([]string, len(ends))
		start := 0
		for i, end := range ends {
			key, value, err := h1.ParseField(block[start:end])
			start = end
			if err != nil {
				return nil, http.StatusBadRequest, err
			}
			h1.AddField(h, values, i, key, value)
		}
	}
	r := &request{proto11: proto11, head: method == http.MethodHead}
	hostValues := h["Host"]
	if len(hostValues) > 1 || (proto11 && len(hostValues) == 0) {
		return nil, http.StatusBadRequest, errors.New("missing or repeated Host header")
	}
	host := u.Host
	if host == "" && len(hostValues) == 1 {
		host = hostValues[0]
	}
	// Framing (RFC 9112 6): chunked, or a Content-Length, never both.
	var n int64
	te, cl := h["Transfer-Encoding"], h["Content-Length"]
	switch {
	case len(te) > 0 && len(cl) > 0:
		return nil, http.StatusBadRequest, errors.New("both Transfer-Encoding and Content-Length")
	case len(te) > 0:
		if len(te) != 1 || !strings.EqualFold(strings.TrimSpace(te[0]), "chunked") || !proto11 {
			return nil, http.StatusNotImplemented, errors.New("unsupported Transfer-Encoding")
		}
		r.chunked, n = true, -1
	case len(cl) > 0:
		for _, v := range cl[1:] {
			if v != cl[0] {
				return nil, http.StatusBadRequest, errors.New("conflicting Content-Length headers")
			}
		}
		v, err := strconv.ParseInt(cl[0], 10, 64)
		if err != nil || v < 0 || cl[0][0] == '+' {
			return nil, http.StatusBadRequest, errors.New("invalid Content-Length")
		}
		n = v
	}
	conn := strings.ToLower(strings.Join(h["Connection"], ","))
	r.keepAlive = proto11 && !strings.Contains(conn, "close") || !proto11 && strings.Contains(conn, "keep-alive")
	if ex := h["Expect"]; len(ex) > 0 {
		if len(ex) != 1 || !strings.EqualFold(ex[0], "100-continue") {
			return nil, http.StatusExpectationFailed, errors.New("unsupported Expect header")
		}
		r.expect = proto11 && (n != 0)
	}
	r.body = body{c: c, req: r, r: br, left: n}
	b := &r.body
	switch {
	case r.chunked:
		b.r = httputil.NewChunkedReader(br)
	case n == 0:
		b.done = true
	}
	var rb io.ReadCloser = b
	if b.done {
		rb = http.NoBody
	}
	major, minor := 1, 1
	if !proto11 {
		minor = 0
	}
	r.http = http.Request{
		Method: method, URL: u, Proto: proto, ProtoMajor: major, ProtoMinor: minor,
		Header: h, Body: rb, ContentLength: n, Host: host, RequestURI: target,
		Close: !r.keepAlive,
	}
	if r.chunked {
		r.http.TransferEncoding = []string{"chunked"}
	}
	if c != nil {
		r.http.RemoteAddr = c.remoteAddr()
	}
	return r, 0, nil
}

var errHeaderTooLarge = errors.New("request header too large")

func statusFor(err error) int {
	switch {
	case errors.Is(err, errHeaderTooLarge):
		return http.StatusRequestHeaderFieldsTooLarge
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return 0 // the client left
	default:
		var ne net.Error
		if errors.As(err, &ne) {
			return 0 // a timeout or a reset: nobody to answer
		}
		return http.StatusBadRequest
	}
}

// body is a request body. It answers Expect: 100-continue on its first
// read, and starts the connection's watch when it ends (watchOnEOF).
type body struct {
	c    *conn
	req  *request
	r    io.Reader // the connection's reader, or a chunked reader over it
	left int64     // what is still to come of a Content-Length body; -1 chunked
	done bool      // its end was read
	// watchOnEOF: its end starts c's watch (a flag, not a func: a method
	// value would be made, and allocated, per request).
	watchOnEOF bool
	err        error
}

func (b *body) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.req.expect && b.c != nil {
		b.req.expect = false
		_, _ = b.c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		if err := b.c.bw.Flush(); err != nil {
			b.err = err
			return 0, err
		}
	}
	if b.left >= 0 && int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	if b.left >= 0 {
		b.left -= int64(n)
		switch {
		case b.left == 0:
			// The end comes with the last bytes, so that a handler that
			// reads exactly Content-Length bytes starts the watch too.
			err = io.EOF
		case err == io.EOF:
			err = io.ErrUnexpectedEOF // the connection ended first
		}
	}
	switch {
	case err == io.EOF:
		b.done = true
		if b.watchOnEOF {
			b.c.startWatch()
		}
	case err != nil:
		b.err = err
	}
	return n, err
}

func (b *body) Close() error { return nil }

// response is the handler's http.ResponseWriter. The status line and
// headers go out with the first write or flush; the body is framed by the
// handler's Content-Length, else chunked (HTTP/1.1), else by closing the
// connection (HTTP/1.0).
type response struct {
	c      *conn
	req    *request
	header http.Header

	wroteHeader bool
	status      int
	chunked     bool
	contentLen  int64 // -1: not set
	written     int64
	closeAfter  bool // the connection cannot serve another request
	noBody      bool // HEAD, 1xx, 204, 304
	err         error
	scratch     [20]byte // a chunk's size or a Content-Length
	holding     bool     // framing not decided yet: the body goes to held
	held        []byte   // the body so far, while holding (in conn.heldBuf)
}

// maxHeld is the most of a body without a Content-Length that is held to
// give it one.
const maxHeld = 4096

var (
	_ http.ResponseWriter = (*response)(nil)
	_ http.Flusher        = (*response)(nil)
)

func (w *response) Header() http.Header { return w.header }

func (w *response) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("h1server: invalid WriteHeader code %d", code))
	}
	if code < 200 { // informational answers are not supported: ignore them
		return
	}
	w.wroteHeader, w.status = true, code
	w.noBody = w.req.head || code == http.StatusNoContent || code == http.StatusNotModified
	w.contentLen = -1
	if v := w.header.Get("Content-Length"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			w.contentLen = n
		} else {
			w.header.Del("Content-Length") // not a length: frame it ourselves
		}
	}
	switch {
	case w.noBody:
	case w.contentLen >= 0:
	case w.req.proto11:
		// Framed at the end: with a Content-Length if the whole body
		// comes before the handler returns and fits in maxHeld bytes
		// (as net/http does), else chunked.
		w.holding = true
	default:
		w.closeAfter = true // HTTP/1.0 without a length: the close ends the body
	}
	if !w.req.keepAlive || strings.EqualFold(w.header.Get("Connection"), "close") {
		w.closeAfter = true
	}
	bw := w.c.bw
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(strconv.Itoa(code))
	bw.WriteByte(' ')
	bw.WriteString(http.StatusText(code))
	bw.WriteString("\r\n")
	for k, vs := range w.header {
		if k == "Transfer-Encoding" || k == "Connection" || !h1.ValidToken(k) {
			continue // the server's to set; an invalid name is dropped
		}
		for _, v := range vs {
			if !h1.ValidValue(v) {
				continue
			}
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if _, ok := w.header["Date"]; !ok {
		bw.WriteString("Date: ")
		bw.WriteString(httpDate())
		bw.WriteString("\r\n")
	}
	if !w.holding {
		w.endHeader()
	}
}

// endHeader writes the framing lines and ends the header. The other lines
// were written already: the header is as it was at WriteHeader.
func (w *response) endHeader() {
	bw := w.c.bw
	switch {
	case w.chunked:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case w.holding:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(w.scratch[:0], int64(len(w.held)), 10))
		bw.WriteString("\r\n")
	}
	if w.closeAfter {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
}

// stopHolding sends the header, chunked, and what was held as the first
// chunk: the body is too long to hold, or the handler flushes.
func (w *response) stopHolding() error {
	w.holding, w.chunked = false, true
	w.endHeader()
	held := w.held
	w.held = nil
	if len(held) == 0 {
		return nil
	}
	_, err := w.writeChunk(held)
	return err
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		if _, ok := w.header["Content-Type"]; !ok && len(p) > 0 {
			w.header.Set("Content-Type", http.DetectContentType(p))
		}
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.req.head {
		return len(p), nil // a HEAD answer has no body: writes are dropped, as net/http does
	}
	if w.noBody {
		return 0, http.ErrBodyNotAllowed
	}
	if w.contentLen >= 0 && w.written+int64(len(p)) > w.contentLen {
		return 0, http.ErrContentLength
	}
	if len(p) == 0 {
		return 0, nil
	}
	if w.holding {
		if len(w.held)+len(p) <= maxHeld {
			if w.held == nil {
				if w.c.heldBuf == nil {
					w.c.heldBuf = make([]byte, 0, maxHeld) // never outgrown
				}
				w.held = w.c.heldBuf[:0]
			}
			w.held = append(w.held, p...)
			w.written += int64(len(p))
			return len(p), nil
		}
		if err := w.stopHolding(); err != nil {
			w.err = err
			return 0, err
		}
	}
	if w.chunked {
		n, err := w.writeChunk(p)
		w.written += int64(n)
		return n, err
	}
	n, err := w.c.bw.Write(p)
	w.written += int64(n)
	if err != nil {
		w.err = err
	}
	return n, err
}

// writeChunk writes p as one chunk; the caller counts it in written.
func (w *response) writeChunk(p []byte) (int, error) {
	bw := w.c.bw
	bw.Write(append(strconv.AppendInt(w.scratch[:0], int64(len(p)), 16), '\r', '\n'))
	n, err := bw.Write(p)
	if err == nil {
		_, err = bw.WriteString("\r\n")
	}
	if err != nil {
		w.err = err
	}
	return n, err
}

// FlushError sends what is buffered; http.ResponseController calls it.
func (w *response) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return w.err
	}
	if w.holding {
		if err := w.stopHolding(); err != nil {
			w.err = err
			return err
		}
	}
	if err := w.c.bw.Flush(); err != nil {
		w.err = err
	}
	return w.err
}

func (w *response) Flush() { _ = w.FlushError() }

// finish ends the answer after the handler returned, and reports whether
// it went out whole.
func (w *response) finish() bool {
	if !w.wroteHeader {
		if _, ok := w.header["Content-Length"]; !ok && w.status == http.StatusOK {
			w.header["Content-Length"] = []string{"0"}
		}
		w.WriteHeader(w.status)
	}
	if w.holding && w.err == nil { // the whole body is here: it has a length
		w.endHeader()
		_, w.err = w.c.bw.Write(w.held)
		w.holding, w.held = false, nil
	}
	if w.chunked && w.err == nil {
		_, w.err = w.c.bw.WriteString("0\r\n\r\n")
	}
	if w.contentLen >= 0 && !w.noBody && w.written < w.contentLen {
		w.closeAfter = true // the client waits for bytes that will not come
	}
	if err := w.c.bw.Flush(); err != nil && w.err == nil {
		w.err = err
	}
	return w.err == nil
}

// httpDate is the Date header's value, made once a second.
func httpDate() string {
	now := time.Now().Unix()
	if d := dateCache.Load(); d != nil && d.unix == now {
		return d.text
	}
	d := &cachedDate{unix: now, text: time.Unix(now, 0).UTC().Format(http.TimeFormat)}
	dateCache.Store(d)
	return d.text
}

type cachedDate struct {
	unix int64
	text string
}

var dateCache atomic.Pointer[cachedDate]

// Package h1 is a lean HTTP/1.1 client transport for the gateway's upstream calls: the calling goroutine writes the request and reads the response itself, with no per-connection reader and writer goroutines.
//
// net/http's Transport runs two goroutines per connection and hands every
// request and response between them and the caller over channels. On a
// gateway whose upstream calls are small JSON requests, those hand-offs cost
// more CPU than the bytes: this transport does the same work in the
// caller's goroutine, and reuses net/http's response parser
// (http.ReadResponse), so framing (Content-Length, chunked, close-delimited)
// is the standard library's.
//
// It handles plain http and https (TLS with ALPN http/1.1) requests whose
// body length is known. Everything else (a proxy configured for the URL,
// a body of unknown length, a protocol upgrade) goes to Fallback, a
// *http.Transport in practice.
package h1

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults for zero Transport fields.
const (
	DefaultMaxIdlePerHost = 512
	DefaultIdleTimeout    = 90 * time.Second
	DefaultDialTimeout    = 30 * time.Second
)

// Transport is an http.RoundTripper for HTTP/1.1 upstreams. The zero value
// is not usable: make one with New. It is safe for concurrent use.
type Transport struct {
	// Fallback serves the requests this transport does not (see the package
	// documentation). Required.
	Fallback http.RoundTripper
	// Proxy says which proxy a request should go through, as
	// http.Transport.Proxy does; requests it names a proxy for go to
	// Fallback. Default http.ProxyFromEnvironment.
	Proxy func(*http.Request) (*url.URL, error)
	// DialContext opens connections. Default a net.Dialer with
	// DefaultDialTimeout and 30s keep-alives.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLSConfig is cloned for each https connection (ServerName and ALPN
	// are set by the transport). Default: the system roots, TLS 1.2+.
	TLSConfig *tls.Config
	// MaxIdlePerHost bounds the idle connections kept per host. Default
	// DefaultMaxIdlePerHost.
	MaxIdlePerHost int
	// IdleTimeout closes connections idle for longer. Default
	// DefaultIdleTimeout.
	IdleTimeout time.Duration

	hosts sync.Map // scheme://host:port -> *host
	// byURL finds a request's host without making its key: a lookup by
	// the URL's scheme and host as written, copied on write. It holds at
	// most maxByURL entries (the rest go through hosts).
	byURL atomic.Pointer[map[urlHost]*host]
}

// urlHost is a URL's scheme and host as written.
type urlHost struct{ scheme, host string }

// maxByURL bounds Transport.byURL.
const maxByURL = 256

// host is one scheme://host:port the transport talks to.
type host struct {
	viaProxy bool       // decided once: requests to this host go to Fallback
	mu       sync.Mutex // protects idle
	idle     []*conn    // most recently used last
}

// New returns a Transport that sends what it cannot serve to fallback.
func New(fallback http.RoundTripper) *Transport {
	return &Transport{Fallback: fallback}
}

var _ http.RoundTripper = (*Transport)(nil)

// errNoBytes marks a failure on a reused connection before the server sent
// a byte: the server closed it while idle, so the request is retried once
// on a new connection.
var errNoBytes = errors.New("h1: connection closed before the response")

// RoundTrip sends req and returns the response, whose Body must be read to
// the end or closed: that returns the connection to the idle pool (or
// closes it). Cancelling req's context aborts the call at any point.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.roundTrip(req, time.Time{})
}

// realAfter is AfterFunc on the real clock.
func realAfter(d time.Duration, f func()) interface{ Stop() bool } { return time.AfterFunc(d, f) }

// roundTrip is RoundTrip, bounded by deadline unless it is zero (see
// RoundTripWithin).
func (t *Transport) roundTrip(req *http.Request, deadline time.Time) (*http.Response, error) {
	fallback := func() (*http.Response, error) {
		if deadline.IsZero() {
			return t.Fallback.RoundTrip(req)
		}
		return RoundTripTimer(t.Fallback, req, time.Until(deadline), realAfter)
	}
	if !t.handles(req) {
		return fallback()
	}
	h, err := t.hostOf(req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	if h.viaProxy {
		return fallback()
	}
	defer closeBody(req)
	if err := validHeaders(req); err != nil {
		return nil, err
	}
	for retried := false; ; retried = true {
		c, err := t.get(req.Context(), h, req.URL, deadline)
		if err != nil {
			return nil, err
		}
		resp, err := c.roundTrip(req, deadline)
		if err == nil {
			return resp, nil
		}
		c.close()
		if errors.Is(err, errNoBytes) && c.reused && !retried && replayable(req) {
			if err := rewind(req); err == nil {
				continue
			}
		}
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, errors.Join(ctxErr, err)
		}
		if timedOut(req.Context(), !deadline.IsZero(), err) {
			return nil, fmt.Errorf("%w: %w", ErrHeaderTimeout, err)
		}
		return nil, err
	}
}

// handles reports whether the transport serves req itself.
func (t *Transport) handles(req *http.Request) bool {
	u := req.URL
	if u == nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return false
	}
	if req.Body != nil && req.Body != http.NoBody && req.ContentLength <= 0 {
		return false // unknown length: chunked request bodies are Fallback's
	}
	if req.Header.Get("Upgrade") != "" || req.Method == http.MethodConnect {
		return false
	}
	return true
}

// hostOf returns the host req goes to (one handles accepts).
func (t *Transport) hostOf(req *http.Request) (*host, error) {
	k := urlHost{req.URL.Scheme, req.URL.Host}
	p := t.byURL.Load()
	var known map[urlHost]*host
	if p != nil {
		known = *p
	}
	if h := known[k]; h != nil {
		return h, nil
	}
	h, err := t.host(k.scheme+"://"+canonicalAddr(req.URL), req)
	if err != nil || len(known) >= maxByURL {
		return h, err
	}
	// Copy on write; losing a race only costs a later lookup through hosts.
	next := make(map[urlHost]*host, len(known)+1)
	for k, v := range known {
		next[k] = v
	}
	next[k] = h
	t.byURL.CompareAndSwap(p, &next)
	return h, nil
}

// canonicalAddr is u's host:port, with the scheme's default port.
func canonicalAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// host returns the state of key, deciding on first use whether its
// requests go through a proxy.
func (t *Transport) host(key string, req *http.Request) (*host, error) {
	if h, ok := t.hosts.Load(key); ok {
		return h.(*host), nil
	}
	proxy := t.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	p, err := proxy(req)
	if err != nil {
		return nil, fmt.Errorf("h1: proxy for %s: %w", key, err)
	}
	h, _ := t.hosts.LoadOrStore(key, &host{viaProxy: p != nil})
	return h.(*host), nil
}

// get returns an idle connection of h, or dials a new one, before
// deadline unless it is zero.
func (t *Transport) get(ctx context.Context, h *host, u *url.URL, deadline time.Time) (*conn, error) {
	now := time.Now()
	idleTimeout := positive(t.IdleTimeout, DefaultIdleTimeout)
	h.mu.Lock()
	for n := len(h.idle); n > 0; n = len(h.idle) {
		c := h.idle[n-1]
		h.idle[n-1] = nil
		h.idle = h.idle[:n-1]
		if now.Sub(c.idleSince) < idleTimeout {
			h.mu.Unlock()
			c.reused = true
			return c, nil
		}
		h.mu.Unlock()
		c.close() // too old: the server has likely dropped it
		h.mu.Lock()
	}
	h.mu.Unlock()
	if deadline.IsZero() {
		return t.dial(ctx, h, u)
	}
	dctx, cancel := context.WithDeadline(ctx, deadline) // a dial is rare: the context is cheap enough
	defer cancel()
	c, err := t.dial(dctx, h, u)
	if err != nil && ctx.Err() == nil && dctx.Err() != nil {
		return nil, fmt.Errorf("%w: %w", ErrHeaderTimeout, err)
	}
	return c, err
}

func (t *Transport) dial(ctx context.Context, h *host, u *url.URL) (*conn, error) {
	dial := t.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: DefaultDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	}
	addr := canonicalAddr(u)
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "https" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if t.TLSConfig != nil {
			cfg = t.TLSConfig.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("h1: TLS handshake with %s: %w", addr, err)
		}
		nc = tc
	}
	c := &conn{t: t, h: h, nc: nc}
	if sc, ok := nc.(syscall.Conn); ok { // plain TCP, not TLS
		c.raw, _ = sc.SyscallConn()
	}
	c.bw = bufio.NewWriterSize(connWriter{c}, 4096)
	c.br = bufio.NewReaderSize(countingReader{c}, 4096)
	return c, nil
}

// put returns c to its host's idle pool, or closes it if the pool is full.
func (t *Transport) put(c *conn) {
	c.idleSince = time.Now()
	h := c.h
	h.mu.Lock()
	if len(h.idle) < positive(t.MaxIdlePerHost, DefaultMaxIdlePerHost) {
		h.idle = append(h.idle, c)
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	c.close()
}

// CloseIdleConnections closes every idle connection, and Fallback's.
func (t *Transport) CloseIdleConnections() {
	var idle []*conn
	t.hosts.Range(func(_, v any) bool {
		h := v.(*host)
		h.mu.Lock()
		idle = append(idle, h.idle...)
		h.idle = nil
		h.mu.Unlock()
		return true
	})
	for _, c := range idle {
		c.close()
	}
	if f, ok := t.Fallback.(interface{ CloseIdleConnections() }); ok {
		f.CloseIdleConnections()
	}
}

// conn is one HTTP/1.1 connection, used by one request at a time.
type conn struct {
	t         *Transport
	h         *host // its pool
	nc        net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	reused    bool            // it served a request before this one
	idleSince time.Time       // when it went back to the pool
	read      int64           // bytes read since the current request was written
	raw       syscall.RawConn // nc's, if it is a plain socket (see writeAwait)
	await     bool            // the next write ends a request: writeAwait it
}

func (c *conn) close() { _ = c.nc.Close() }

// connWriter writes to c's connection; the write that ends a request also
// waits for the answer to start (writeAwait), which saves the read that
// would find nothing yet.
type connWriter struct{ c *conn }

func (w connWriter) Write(p []byte) (int, error) {
	c := w.c
	n := 0
	if c.await && c.raw != nil {
		c.await = false
		n = writeAwait(c.raw, p)
		if n == len(p) {
			return n, nil
		}
	}
	m, err := c.nc.Write(p[n:])
	return n + m, err
}

// countingReader reads from c's connection, counting into c.read.
type countingReader struct{ c *conn }

func (r countingReader) Read(p []byte) (int, error) {
	n, err := r.c.nc.Read(p)
	r.c.read += int64(n)
	return n, err
}

// aLongTimeAgo is a deadline that makes every pending and later I/O on a
// connection fail at once.
var aLongTimeAgo = time.Unix(1, 0)

// roundTrip writes req and reads the response headers, before deadline
// unless it is zero. The returned response's body owns the connection
// until it ends.
func (c *conn) roundTrip(req *http.Request, deadline time.Time) (*http.Response, error) {
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !deadline.IsZero() {
		_ = c.nc.SetDeadline(deadline)
	}
	// Cancellation reaches a goroutine blocked in I/O through the deadline.
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(aLongTimeAgo) })
	c.read = 0
	if err := c.writeRequest(req); err != nil {
		stop()
		if c.reused && ctx.Err() == nil && isConnClosed(err) {
			return nil, fmt.Errorf("%w: %w", errNoBytes, err)
		}
		return nil, fmt.Errorf("h1: write request: %w", err)
	}
	resp, err := c.readResponse(req)
	if err != nil {
		stop()
		return nil, err
	}
	// The bound goes on over an error body (see RoundTripWithin).
	bounded := !deadline.IsZero() && resp.StatusCode >= 400
	if !deadline.IsZero() && !bounded {
		c.clearDeadline(ctx)
	}
	resp.Body = &body{rc: resp.Body, c: c, ctx: ctx, stop: stop, bounded: bounded, reuse: !resp.Close && !req.Close}
	return resp, nil
}

// writeRequest writes req's request line, headers and body.
func (c *conn) writeRequest(req *http.Request) error {
	w := c.bw
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	w.WriteString(method)
	w.WriteByte(' ')
	w.WriteString(req.URL.RequestURI())
	w.WriteString(" HTTP/1.1\r\nHost: ")
	hostHeader := req.Host
	if hostHeader == "" {
		hostHeader = req.URL.Host
	}
	w.WriteString(hostHeader)
	w.WriteString("\r\n")
	for name, values := range req.Header {
		if skipHeader(name) {
			continue
		}
		for _, v := range values {
			w.WriteString(name)
			w.WriteString(": ")
			w.WriteString(v)
			w.WriteString("\r\n")
		}
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		w.WriteString("User-Agent: llmgate\r\n")
	}
	if req.Close {
		w.WriteString("Connection: close\r\n")
	}
	if req.ContentLength > 0 {
		w.WriteString("Content-Length: ")
		var num [20]byte
		w.Write(strconv.AppendInt(num[:0], req.ContentLength, 10))
		w.WriteString("\r\n\r\n")
		n, err := io.Copy(w, io.LimitReader(req.Body, req.ContentLength))
		if err != nil {
			return err
		}
		if n != req.ContentLength {
			return fmt.Errorf("h1: request body has %d bytes, ContentLength says %d", n, req.ContentLength)
		}
	} else {
		w.WriteString("\r\n")
	}
	c.await = true
	err := w.Flush()
	c.await = false
	return err
}

// skipHeader names the headers the transport writes itself or never sends.
func skipHeader(name string) bool {
	switch name {
	case "Host", "Content-Length", "Connection", "Transfer-Encoding", "Trailer", "Te", "Keep-Alive", "Proxy-Connection":
		return true
	}
	return false
}

// readResponse reads the response headers, skipping informational (1xx)
// responses.
func (c *conn) readResponse(req *http.Request) (*http.Response, error) {
	if resp, ok := readFastResponse(c.br, req); ok {
		return resp, nil
	}
	for {
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			// Nothing read at all on a connection that served before: the
			// server closed it while it was idle.
			// (ReadResponse reports a clean EOF as io.ErrUnexpectedEOF.)
			if c.reused && c.read == 0 && req.Context().Err() == nil && (isConnClosed(err) || errors.Is(err, io.ErrUnexpectedEOF)) {
				return nil, fmt.Errorf("%w: %w", errNoBytes, err)
			}
			return nil, fmt.Errorf("h1: read response: %w", err)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		return resp, nil
	}
}

// body is a response body that gives its connection back when it ends.
type body struct {
	rc      io.ReadCloser
	c       *conn
	ctx     context.Context // the request's
	stop    func() bool     // stops the cancellation hook; false if it ran
	bounded bool            // the connection's deadline is RoundTripWithin's bound
	reuse   bool            // the connection may serve another request
	mu      sync.Mutex      // protects done
	done    bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.finish(true)
	} else if err != nil {
		b.finish(false)
		if timedOut(b.ctx, b.bounded, err) {
			err = fmt.Errorf("%w: %w", ErrHeaderTimeout, err)
		}
	}
	return n, err
}

// Close ends the body. A body closed before its end closes the
// connection: what is left of it cannot be skipped cheaply.
func (b *body) Close() error {
	b.finish(false)
	return nil
}

// finish releases the connection once: back to the pool if the body was
// read to its end and nothing forbids reuse, closed otherwise.
func (b *body) finish(complete bool) {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return
	}
	b.done = true
	b.mu.Unlock()
	cancelled := !b.stop()
	if complete && b.reuse && !cancelled && b.c.br.Buffered() == 0 {
		if b.bounded {
			_ = b.c.nc.SetDeadline(time.Time{}) // the hook is stopped: nothing else sets one now
		}
		b.c.t.put(b.c)
		return
	}
	b.c.close()
}

// validHeaders refuses header names and values that could split the
// request or smuggle another one (CR, LF, NUL and other controls), as
// net/http does.
func validHeaders(req *http.Request) error {
	if !ValidValue(req.Host) || !ValidValue(req.URL.Host) {
		return errors.New("h1: invalid Host")
	}
	for name, values := range req.Header {
		if !ValidToken(name) {
			return fmt.Errorf("h1: invalid header name %q", name)
		}
		for _, v := range values {
			if !ValidValue(v) {
				return fmt.Errorf("h1: invalid value for header %q", name) // the value may be a secret
			}
		}
	}
	return nil
}

// ValidToken reports whether s is an HTTP token (RFC 9110 5.1): a method
// or a header name.
func ValidToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenByte[s[i]] {
			return false
		}
	}
	return true
}

// tokenByte says which bytes may be in a token (RFC 9110 5.6.2): visible
// ASCII but the delimiters. A table: this runs on every header of every
// request and answer.
var tokenByte = func() (t [256]bool) {
	for c := '!'; c < 0x7f; c++ {
		t[c] = !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c)
	}
	return t
}()

// ValidValue reports whether s, a header value, holds no control
// characters but tab.
func ValidValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// replayable reports whether req's body can be sent again.
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// rewind gives req a fresh copy of its body for another attempt.
func rewind(req *http.Request) error {
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	b, err := req.GetBody()
	if err != nil {
		return err
	}
	req.Body = b
	return nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// isConnClosed reports errors that mean the peer closed the connection.
func isConnClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func positive[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

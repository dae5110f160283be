package testutil

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// DelayProxy is a loopback TCP proxy that delays every byte by half a round
// trip in each direction, so that a client of Addr sees the target as if it
// were RTT away. Delay is added, not bandwidth taken away: bytes sent back
// to back stay back to back, so pipelining still pays. It also can stop
// forwarding (Hold) to stand for a partition.
type DelayProxy struct {
	// Addr is the proxy's host:port; connect there instead of the target.
	Addr   string
	target string
	ln     net.Listener
	oneWay atomic.Int64 // ns each chunk is held in each direction

	mu     sync.Mutex // protects conns, closed, held
	conns  map[net.Conn]struct{}
	closed bool
	held   chan struct{} // non-nil while Hold is in force; closed on Resume
	wg     sync.WaitGroup
}

// StartDelayProxy starts a DelayProxy to target with the given round trip
// and closes it when the test ends.
func StartDelayProxy(tb testing.TB, target string, rtt time.Duration) *DelayProxy {
	tb.Helper()
	p, err := NewDelayProxy(target, rtt)
	if err != nil {
		tb.Fatalf("start delay proxy: %v", err)
	}
	tb.Cleanup(p.Close)
	return p
}

// NewDelayProxy listens on a free loopback port and forwards to target with
// rtt added to every round trip. The caller must call Close.
func NewDelayProxy(target string, rtt time.Duration) (*DelayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &DelayProxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: make(map[net.Conn]struct{})}
	p.SetRTT(rtt)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetRTT changes the added round trip; it applies to bytes read from now on.
func (p *DelayProxy) SetRTT(rtt time.Duration) { p.oneWay.Store(int64(rtt / 2)) }

// RTT returns the added round trip.
func (p *DelayProxy) RTT() time.Duration { return 2 * time.Duration(p.oneWay.Load()) }

// Hold stops forwarding in both directions until Resume: bytes wait in the
// proxy, as behind a partition that heals without losing them.
func (p *DelayProxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

// Resume ends a Hold.
func (p *DelayProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

func (p *DelayProxy) holdChan() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// Close stops the proxy and cuts every connection through it.
func (p *DelayProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// track registers c, or closes it and reports false if the proxy is closed.
func (p *DelayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *DelayProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *DelayProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(client)
			server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
			if err != nil {
				return
			}
			if !p.track(server) {
				return
			}
			defer p.untrack(server)
			done := make(chan struct{}, 2)
			go func() { p.pipe(server, client); done <- struct{}{} }()
			go func() { p.pipe(client, server); done <- struct{}{} }()
			<-done // one side ended: cut both
			_ = client.Close()
			_ = server.Close()
			<-done
		}()
	}
}

// chunk is bytes read at one moment, due for writing at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst, each chunk written one delay after it was read.
func (p *DelayProxy) pipe(dst, src net.Conn) {
	ch := make(chan chunk, 256)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(time.Duration(p.oneWay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for c := range ch {
		if h := p.holdChan(); h != nil {
			<-h
		}
		if d := time.Until(c.due); d > 0 {
			timer.Reset(d)
			<-timer.C
		}
		if _, err := dst.Write(c.b); err != nil {
			_ = src.Close() // the reader above ends; drain it
			for range ch {
			}
			return
		}
	}
}

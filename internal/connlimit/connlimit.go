// Package connlimit bounds the number of open connections a listener hands to a server, answering the ones over the bound with a short 503.
package connlimit

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// rejectTimeout bounds the write of the 503 to a connection over the bound.
const rejectTimeout = time.Second

// Listener wraps a net.Listener: at most Max connections it accepted are
// open at once. One more is answered Reject (unless it is empty) and
// closed, and OnReject is called; Accept goes on with the next.
type Listener struct {
	net.Listener
	// Max is the bound; 0 or less means none.
	Max int
	// Reject is written to a connection over the bound before it is
	// closed: a whole HTTP/1.1 response. Leave it empty over TLS, where
	// plain bytes mean nothing to the client.
	Reject []byte
	// OnReject, when set, is called for each connection turned away.
	OnReject func()

	open atomic.Int64
}

// New returns a Listener over ln with bound max and the response reject.
func New(ln net.Listener, max int, reject []byte, onReject func()) *Listener {
	return &Listener{Listener: ln, Max: max, Reject: reject, OnReject: onReject}
}

// Open returns the number of connections accepted and not yet closed.
func (l *Listener) Open() int64 { return l.open.Load() }

// Accept returns the next connection within the bound.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.Max <= 0 || l.open.Add(1) <= int64(l.Max) {
			if l.Max <= 0 {
				l.open.Add(1)
			}
			return &conn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		if l.OnReject != nil {
			l.OnReject()
		}
		go l.reject(c) // a slow client must not stall Accept
	}
}

func (l *Listener) reject(c net.Conn) {
	if len(l.Reject) > 0 {
		_ = c.SetWriteDeadline(time.Now().Add(rejectTimeout))
		_, _ = c.Write(l.Reject)
	}
	_ = c.Close()
}

// conn gives its slot back when it is closed, once.
type conn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

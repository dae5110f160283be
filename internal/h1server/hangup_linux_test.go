package h1server

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestHangupRegistrations: on Linux every connection is watched through
// epoll while it is open, and forgotten when it closes.
func TestHangupRegistrations(t *testing.T) {
	registered := func() int {
		w := hangupWatch()
		if w == nil {
			t.Fatal("no epoll instance")
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.conns)
	}
	before := registered()
	var c *conn
	s, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := nc.Read(make([]byte, 512)); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	for k := range s.conns {
		c = k
	}
	s.mu.Unlock()
	if c == nil || !c.epoll {
		t.Fatalf("connection not registered with epoll: %+v", c)
	}
	if got := registered(); got != before+1 {
		t.Fatalf("%d registrations while connected, want %d", got, before+1)
	}
	nc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for registered() != before {
		if time.Now().After(deadline) {
			t.Fatalf("%d registrations 10s after the client left, want %d", registered(), before)
		}
		time.Sleep(time.Millisecond) // the connection's goroutine ends on its own time
	}
}

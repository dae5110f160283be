package connlimit

import (
	"bufio"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

const reject = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy"

// TestBound opens Max connections, checks that one more is answered the
// 503 and closed, and that closing one lets the next in.
func TestBound(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var rejected atomic.Int64
	l := New(inner, 2, []byte(reject), func() { rejected.Add(1) })
	defer l.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	dial()
	first := <-accepted
	<-accepted

	over := dial()
	_ = over.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(over), nil)
	if err != nil {
		t.Fatalf("the connection over the bound got no response: %v", err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	if rejected.Load() != 1 || l.Open() != 2 {
		t.Fatalf("rejected %d, open %d; want 1 and 2", rejected.Load(), l.Open())
	}

	first.Close()
	first.Close() // twice: the slot is given back once
	dial()
	select {
	case <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("a closed connection did not free its slot")
	}
	if l.Open() != 2 {
		t.Fatalf("open %d, want 2", l.Open())
	}
}

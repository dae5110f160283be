package provider

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
)

// countingConn counts the writes made on a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestRequestInOneWrite checks that a small request goes out in one write:
// net/http sends the headers on their own, and copies the body through a
// buffer of 32 KiB, unless it knows the body is in memory.
func TestRequestInOneWrite(t *testing.T) {
	u := newUpstream(t, nil, answerOK)
	var writes atomic.Int64
	tr := NewTransport(TransportConfig{})
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{c, &writes}, nil
	}
	c := newClient(t, Config{Transport: tr})
	resp, _, err := c.Do(t.Context(), targetOf(u), chatReq)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if n := writes.Load(); n != 1 {
		t.Fatalf("the request took %d writes, want 1", n)
	}
}

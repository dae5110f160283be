//go:build unix

package h1

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client *net.TCPConn, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s
}

func rawConn(t *testing.T, c *net.TCPConn) syscall.RawConn {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// readNow reads without waiting: EAGAIN if nothing has arrived.
func readNow(rc syscall.RawConn, p []byte) (n int, err error) {
	_ = rc.Control(func(fd uintptr) { n, err = syscall.Read(int(fd), p) })
	return n, err
}

func TestWriteAwaitReturnsOnceTheAnswerIsThere(t *testing.T) {
	c, s := tcpPair(t)
	rc := rawConn(t, c)
	req, answer := []byte("ping\n"), []byte("pong\n")
	go func() {
		buf := make([]byte, len(req))
		if _, err := io.ReadFull(s, buf); err == nil {
			_, _ = s.Write(answer)
		}
	}()
	if n := writeAwait(rc, req); n != len(req) {
		t.Fatalf("writeAwait wrote %d of %d bytes", n, len(req))
	}
	buf := make([]byte, 64)
	n, err := readNow(rc, buf)
	if err != nil || string(buf[:n]) != string(answer) {
		t.Fatalf("read right after writeAwait = %q, %v; want the answer there already", buf[:max(n, 0)], err)
	}
}

func TestWriteAwaitEndsAtTheReadDeadline(t *testing.T) {
	c, s := tcpPair(t)
	rc := rawConn(t, c)
	if err := c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if n := writeAwait(rc, []byte("hello")); n != 5 {
		t.Fatalf("writeAwait wrote %d of 5 bytes", n)
	}
	// The peer got it, and the connection's own read reports the deadline.
	buf := make([]byte, 5)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("peer read %q, %v", buf, err)
	}
	if _, err := c.Read(buf); !errors.Is(err, syscall.ETIMEDOUT) && !isTimeout(err) {
		t.Fatalf("read after the deadline = %v, want a timeout", err)
	}
}

func TestWriteAwaitLeavesFailuresToTheCaller(t *testing.T) {
	t.Run("deadline passed", func(t *testing.T) {
		c, s := tcpPair(t)
		if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
		if n := writeAwait(rawConn(t, c), []byte("x")); n != 0 {
			t.Fatalf("writeAwait = %d, want 0: the caller's Write sends it", n)
		}
		// Nothing was sent: the caller's Write sends it once.
		if _, err := c.Write([]byte("y")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "y" {
			t.Fatalf("peer read %q, %v; want only the caller's write", buf, err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		c, _ := tcpPair(t)
		rc := rawConn(t, c)
		c.Close()
		if n := writeAwait(rc, []byte("x")); n != 0 {
			t.Fatalf("writeAwait on a closed connection = %d, want 0", n)
		}
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

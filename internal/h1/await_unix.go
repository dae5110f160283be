//go:build unix

package h1

import (
	"errors"
	"syscall"
)

// writeAwait writes p to the socket behind rc and then waits, without
// reading, until the socket has something to read (or its read deadline
// passes, or it is closed). It returns how much of p it wrote: when that
// is less than len(p) (the socket's buffer was full, or the write failed),
// the caller writes the rest with the connection's Write, which waits and
// reports errors as usual, and nothing was waited for.
//
// Why: after writing a request, a reader would read at once, find nothing
// (EAGAIN) and only then wait in the runtime's poller; that failed read is
// a system call of its own (1.5 µs on the 2-core VM of BENCHMARKS.md).
// Waiting without reading is only safe inside one RawConn.Read, after the
// write: Read clears the socket's readiness before it calls f, and a reply
// can only make it ready again after the request went out, so no wake-up
// is lost, which a wait on its own could not promise.
func writeAwait(rc syscall.RawConn, p []byte) int {
	n, called := 0, false
	_ = rc.Read(func(fd uintptr) bool {
		if called {
			return true // readable now (or the wait ended): the caller reads
		}
		called = true
		for n < len(p) {
			m, err := syscall.Write(int(fd), p[n:])
			if m > 0 {
				n += m
			}
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil || m <= 0 {
				return true // the caller writes the rest
			}
		}
		return false // wait until readable
	})
	// rc.Read fails before calling f on a closed connection or one whose
	// read deadline has passed: n is 0 then, and the caller's Write tells.
	return n
}

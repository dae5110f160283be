//go:build !unix

package h1

import "syscall"

// writeAwait writes nothing where raw socket writes are not portable: the
// caller's Write does it all.
func writeAwait(rc syscall.RawConn, p []byte) int { return 0 }

//go:build !linux

package h1server

// Without epoll, every connection uses the goroutine watch.
func (c *conn) watchHangup() bool { return false }

func (c *conn) unwatchHangup() {}

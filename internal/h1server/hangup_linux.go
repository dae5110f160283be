//go:build linux

package h1server

import (
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// hangups learns that clients left from one epoll instance for the whole
// process, read by one goroutine. Each connection is registered once, for
// EPOLLRDHUP only and edge-triggered: the kernel wakes the goroutine when
// a client closes or resets its connection, and never for the bytes of a
// request. So a connection's own goroutine reads its requests itself, and
// noticing a client that leaves costs nothing per request (the goroutine
// watch costs two goroutine wake-ups per request).
type hangupWatcher struct {
	epfd   int
	broken atomic.Bool // epoll_wait failed: register nothing more

	mu    sync.Mutex
	conns map[uint64]*conn // by registration ID, the event's payload
	next  uint64
}

var (
	hangupOnce sync.Once
	hangups    *hangupWatcher // nil when epoll cannot be had
)

func hangupWatch() *hangupWatcher {
	hangupOnce.Do(func() {
		fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return
		}
		hangups = &hangupWatcher{epfd: fd, conns: make(map[uint64]*conn)}
		go hangups.loop()
	})
	return hangups
}

// watchHangup registers c and reports whether it worked; if not, c falls
// back to the goroutine watch.
func (c *conn) watchHangup() bool {
	w := hangupWatch()
	if w == nil || w.broken.Load() {
		return false
	}
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	w.mu.Lock()
	w.next++
	id := w.next
	w.conns[id] = c
	w.mu.Unlock()
	// The ID, not the descriptor, identifies the connection: a descriptor
	// is reused as soon as it is closed, and an event may be on its way.
	ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
	var addErr error
	if err := rc.Control(func(fd uintptr) {
		addErr = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev)
	}); err != nil || addErr != nil {
		w.forget(id)
		return false
	}
	c.hangupID, c.rawConn = id, rc
	return true
}

// unwatchHangup removes c's registration; call it before closing c.
func (c *conn) unwatchHangup() {
	if c.hangupID == 0 {
		return
	}
	w := hangups
	w.forget(c.hangupID)
	// After a Close from elsewhere (Server.Close) the descriptor is gone,
	// and with it the registration: Control fails, which is fine.
	_ = c.rawConn.Control(func(fd uintptr) {
		_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, int(fd), nil)
	})
}

func (w *hangupWatcher) forget(id uint64) {
	w.mu.Lock()
	delete(w.conns, id)
	w.mu.Unlock()
}

func (w *hangupWatcher) loop() {
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// Not expected with a valid descriptor and buffer. Connections
			// registered so far no longer learn that their client left;
			// new ones use the goroutine watch.
			w.broken.Store(true)
			return
		}
		for _, ev := range events[:n] {
			// Only EPOLLRDHUP was asked for; EPOLLHUP and EPOLLERR come
			// anyway. Each means the client is gone.
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			w.mu.Lock()
			c := w.conns[id]
			w.mu.Unlock()
			if c != nil {
				c.hangup()
			}
		}
	}
}

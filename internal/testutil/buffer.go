package testutil

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// Buffer is an io.Writer safe for concurrent use (a log sink, a child's
// output) that lets a test wait for text to appear.
type Buffer struct {
	mu      sync.Mutex // protects b, changed
	b       bytes.Buffer
	changed chan struct{} // closed and replaced on every Write; nil until needed
}

// NewBuffer returns an empty Buffer.
func NewBuffer() *Buffer { return &Buffer{} }

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	return n, err
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Snapshot returns what was written so far and a channel closed at the next
// Write, for waits that need more than WaitFor (a pattern, another event).
func (s *Buffer) Snapshot() (string, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.b.String(), s.changed
}

// WaitFor waits until s contains text, failing the test after timeout.
func (s *Buffer) WaitFor(t testing.TB, text string, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		have, changed := s.Snapshot()
		if strings.Contains(have, text) {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %q; have %q", timeout, text, s.String())
		}
	}
}

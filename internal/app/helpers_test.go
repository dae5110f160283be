package app

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is an io.Writer safe for concurrent use that lets a test wait
// for text to appear.
type syncBuffer struct {
	mu      sync.Mutex // protects b, changed
	b       bytes.Buffer
	changed chan struct{} // closed and replaced on every Write
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{changed: make(chan struct{})} }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	close(s.changed)
	s.changed = make(chan struct{})
	return n, err
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until s contains text, failing the test after timeout.
func (s *syncBuffer) waitFor(t *testing.T, text string, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		has := strings.Contains(s.b.String(), text)
		changed := s.changed
		s.mu.Unlock()
		if has {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %q; have %q", timeout, text, s.String())
		}
	}
}

// runTimeout bounds every in-process run.
const runTimeout = 60 * time.Second

// runApp runs the command line in this process and returns its exit status
// and output. env is what Getenv sees.
func runApp(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	out, errOut := newSyncBuffer(), newSyncBuffer()
	a := &App{
		Stdin:   strings.NewReader(""),
		Stdout:  out,
		Stderr:  errOut,
		Getenv:  func(k string) string { return env[k] },
		Environ: os.Environ,
	}
	done := make(chan int, 1)
	go func() { done <- a.Run(args) }()
	select {
	case code = <-done:
	case <-time.After(runTimeout):
		t.Fatalf("llmgate %q did not return within %v; stderr %q", args, runTimeout, errOut.String())
	}
	return code, out.String(), errOut.String()
}

// oneLine fails the test unless s is exactly one non-empty line.
func oneLine(t *testing.T, s string) string {
	t.Helper()
	if !strings.HasSuffix(s, "\n") || strings.Count(s, "\n") != 1 || len(strings.TrimSpace(s)) == 0 {
		t.Fatalf("want exactly one line, got %q", s)
	}
	return strings.TrimSuffix(s, "\n")
}

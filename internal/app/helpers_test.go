package app

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/testutil"
)

// runTimeout bounds every in-process run.
const runTimeout = 60 * time.Second

// runApp runs the command line in this process and returns its exit status
// and output. env is what Getenv sees.
func runApp(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	out, errOut := testutil.NewBuffer(), testutil.NewBuffer()
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

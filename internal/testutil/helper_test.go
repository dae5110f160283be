package testutil

import (
	"os"
	"testing"
	"time"
)

// TestStartHelper runs TestHelperProcess below as a helper process: it must
// get its mode, its extra environment and a client of the parent's Redis,
// and exit cleanly once its body returns.
func TestStartHelper(t *testing.T) {
	r := StartRedis(t)
	child := StartHelper(t, t.Context(), r, "ping", "LLMGATE_TESTUTIL_WORD=hello")
	if line := child.Line(t, 30*time.Second); line != "ping PONG hello" {
		t.Fatalf("helper said %q, want %q", line, "ping PONG hello")
	}
	if err := child.Exited(t, 30*time.Second); err != nil {
		t.Fatalf("helper exited with %v", err)
	}
}

// TestHelperProcess is the body of TestStartHelper's helper process.
func TestHelperProcess(t *testing.T) {
	mode, ctx, c := Helper(t)
	pong, err := c.Do(ctx, c.B().Ping().Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	Say("%s %s %s", mode, pong, os.Getenv("LLMGATE_TESTUTIL_WORD"))
}

package testutil

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// A Redis helper process is the test binary re-executed (StartChild) to run
// its package's TestHelperProcess in one mode, against the parent's Redis:
// a second process taking part in a test, which the test can kill with
// SIGKILL. StartHelper starts one; Helper opens its body.

// Environment of a Redis helper process.
const (
	envHelperMode = "LLMGATE_TEST_HELPER_MODE"
	envHelperAddr = "LLMGATE_TEST_HELPER_REDIS"
)

// HelperLifetime bounds a helper process that nobody kills.
const HelperLifetime = time.Minute

// StartHelper runs the package's TestHelperProcess as a child process in
// mode, with the address of r and env added to its environment.
func StartHelper(tb testing.TB, ctx context.Context, r *Redis, mode string, env ...string) *Child {
	tb.Helper()
	env = append([]string{envHelperMode + "=" + mode, envHelperAddr + "=" + r.Addr}, env...)
	return StartChild(tb, ctx, "TestHelperProcess", env...)
}

// Helper begins a TestHelperProcess. In a normal test run it skips the
// test. In a process started by StartHelper it returns the mode, a context
// that ends after HelperLifetime, and a client of the parent's Redis; both
// end with the test.
func Helper(t *testing.T) (mode string, ctx context.Context, c rueidis.Client) {
	t.Helper()
	mode = os.Getenv(envHelperMode)
	if mode == "" {
		t.Skip("helper process body; runs only when started by another test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), HelperLifetime)
	t.Cleanup(cancel)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv(envHelperAddr)}, DisableCache: true})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(c.Close)
	return mode, ctx, c
}

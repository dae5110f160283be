// Package browser starts headless Chromium for the tests of pages people look at (the dashboard, the sim report).
package browser

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Path finds a Chromium or Chrome binary. Without one the test is skipped,
// unless LLMGATE_REQUIRE_CHROMIUM=1 (scripts/test.sh installs Debian's
// chromium and sets it), which fails it instead.
func Path(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("LLMGATE_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("no chromium on PATH and LLMGATE_REQUIRE_CHROMIUM=1; install it (apt-get install chromium)")
	}
	t.Skip("no chromium on PATH (apt-get install chromium); skipping the browser test")
	return ""
}

// Start starts a headless Chromium that lives until the test ends, and
// returns a context that drives it, bounded by timeout.
func Start(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	bin := Path(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.Headless,
		chromedp.Flag("disable-gpu", true), chromedp.WindowSize(1280, 1000),
		chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	// The first action starts the browser, which lives as long as the
	// context it ran on: that one has no timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	tctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	t.Cleanup(cancelTimeout)
	return tctx
}

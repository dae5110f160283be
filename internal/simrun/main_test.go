package simrun

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/scenario"
	"github.com/llmgate/llmgate/internal/testutil"
)

// llmgateBin is the llmgate binary, built once, that the replicas run.
var llmgateBin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "llmgate-simrun-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	llmgateBin = filepath.Join(dir, "llmgate")
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	build := exec.Command(goBin, "build", "-o", llmgateBin, "github.com/llmgate/llmgate/cmd/llmgate")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// builtin loads a built-in scenario.
func builtin(t *testing.T, name string) *scenario.Scenario {
	t.Helper()
	sc, err := scenario.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// run runs sc with n replicas (on a test Redis when n > 1) and logs the
// table.
func run(t *testing.T, sc *scenario.Scenario, n int) *Result {
	t.Helper()
	if err := sc.Validate(); err != nil {
		t.Fatalf("the test's scenario: %v", err)
	}
	o := Options{Binary: llmgateBin, Replicas: n}
	if n > 1 {
		o.Store = testutil.StartRedis(t).URL()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress strings.Builder
	o.Progress = &progress
	res, err := Run(ctx, sc, o)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_ = res.WriteTable(&b)
	t.Logf("\n%s%s", progress.String(), b.String())
	if len(res.Arms) != 2 {
		t.Fatalf("%d arms; want 2", len(res.Arms))
	}
	return res
}

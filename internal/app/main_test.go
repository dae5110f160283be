//go:build unix

package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/testutil"
)

// llmgateBin is the llmgate binary built once for the tests that need a
// real process (signals, concurrency, process groups).
var llmgateBin string

func TestMain(m *testing.M) {
	// Commands run in this process (runApp) start llmgate lock's reaper
	// from this binary.
	if len(os.Args) > 1 && os.Args[1] == reaperCommand {
		os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	bin, cleanup, err := e2eutil.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	llmgateBin = bin
	return m.Run()
}

// proc is a running llmgate process.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *testutil.Buffer
	started        time.Time
	done           chan struct{} // closed when the process has exited
	code           int           // exit code, valid after done
}

// testTimeout bounds every llmgate process a test starts.
const testTimeout = 60 * time.Second

// startLlmgate starts the llmgate binary with args. It runs in a session of
// its own, without a controlling terminal, as under cron; env is added to
// the test's environment (LLMGATE_STORE is always cleared first).
func startLlmgate(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startLlmgateIn(t, nil, env, args...)
}

// startLlmgateIn is startLlmgate with stdin as llmgate's standard input.
func startLlmgateIn(t *testing.T, stdin io.Reader, env []string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	cmd := exec.CommandContext(ctx, llmgateBin, args...)
	cmd.Env = append(append(os.Environ(), "LLMGATE_STORE="), env...)
	p := &proc{cmd: cmd, stdout: testutil.NewBuffer(), stderr: testutil.NewBuffer(), done: make(chan struct{})}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, p.stdout, p.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.WaitDelay = 5 * time.Second
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start llmgate: %v", err)
	}
	go func() {
		defer cancel()
		_ = cmd.Wait()
		p.code = exitStatus(cmd.ProcessState)
		close(p.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

// wait waits for the process to exit and returns its exit status and how
// long it ran.
func (p *proc) wait(t *testing.T) (int, time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(testTimeout + 10*time.Second):
		t.Fatalf("llmgate did not exit; stderr %q", p.stderr.String())
	}
	return p.code, time.Since(p.started)
}

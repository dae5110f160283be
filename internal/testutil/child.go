package testutil

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// ChildPrefix starts the lines a child process prints for its parent; other
// output (the test framework's) is ignored.
const ChildPrefix = "LLMGATE-CHILD "

// Say prints one protocol line for the parent; call it inside a child.
func Say(format string, a ...any) { fmt.Printf(ChildPrefix+format+"\n", a...) }

// Child is the test binary re-executed as a separate OS process, running
// one test function (its body reads what to do from env). It is killed with
// SIGKILL when the test ends, if it has not exited.
type Child struct {
	Cmd   *exec.Cmd
	Stdin io.WriteCloser
	lines chan string // lines the child printed with ChildPrefix
	wait  chan error  // the child's exit
}

// StartChild runs the current test binary with -test.run=^test$ and env
// added to its environment.
func StartChild(tb testing.TB, ctx context.Context, test string, env ...string) *Child {
	tb.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start child process: %v", err)
	}
	c := &Child{Cmd: cmd, Stdin: stdin, lines: make(chan string, 100), wait: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), ChildPrefix); ok {
				c.lines <- line
			}
		}
		close(c.lines)
		_, _ = io.Copy(io.Discard, out)
		c.wait <- cmd.Wait()
	}()
	tb.Cleanup(c.Kill)
	return c
}

// Line waits up to d for the child's next protocol line.
func (c *Child) Line(tb testing.TB, d time.Duration) string {
	tb.Helper()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			tb.Fatalf("child process exited without the expected line")
		}
		return l
	case <-t.C:
		tb.Fatalf("child process printed nothing within %v", d)
		return ""
	}
}

// Exited waits up to d for the child to exit on its own and returns its
// exit error.
func (c *Child) Exited(tb testing.TB, d time.Duration) error {
	tb.Helper()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-c.wait:
		c.wait <- err // for Kill, at cleanup
		return err
	case <-t.C:
		tb.Fatalf("child process did not exit within %v", d)
		return nil
	}
}

// Kill sends SIGKILL and waits until the process is gone.
func (c *Child) Kill() {
	_ = c.Cmd.Process.Kill()
	for range c.lines {
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case err := <-c.wait:
		c.wait <- err
	case <-t.C:
	}
}

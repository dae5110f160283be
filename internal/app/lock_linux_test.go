package app

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/llmgate/llmgate/internal/testutil"
)

// processGone reports whether pid has exited (a zombie counts: it no longer
// runs, its parent just has not reaped it).
func processGone(pid int) bool {
	running, _ := procStat(pid)
	return !running
}

// startGroup starts llmgate lock with CMD = sh -c script, where script
// starts a background child, writes "$$ $!" to "$1" and prints "ready". It
// returns once CMD is ready, with the PIDs of sh and its child and the
// process group they run in.
func startGroup(t *testing.T, r *testutil.Redis, key, script string, flags ...string) (p *proc, sh, child, pgid int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pids")
	args := append([]string{"lock", "--store", r.URL(), "--key", key}, flags...)
	p = startLlmgate(t, nil, append(args, "--", "sh", "-c", script, "sh", pidFile)...)
	p.stdout.WaitFor(t, "ready\n", 30*time.Second)
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(string(data), &sh, &child); err != nil {
		t.Fatalf("pid file %q: %v", data, err)
	}
	// Leave nothing behind if the test fails.
	t.Cleanup(func() {
		_ = syscall.Kill(sh, syscall.SIGKILL)
		_ = syscall.Kill(child, syscall.SIGKILL)
	})
	pgid, err = syscall.Getpgid(sh)
	if err != nil {
		t.Fatal(err)
	}
	return p, sh, child, pgid
}

// TestLockStopsProcessGroup: what CMD started in the background is stopped
// with it when the lock is lost, or when llmgate passes on SIGTERM.
func TestLockStopsProcessGroup(t *testing.T) {
	r := testutil.StartRedis(t)
	_, b := locker(t, r)
	script := `sleep 300 & echo $$ $! > "$1"; echo ready; wait`
	for _, tc := range []struct {
		name string
		stop func(t *testing.T, p *proc, key string)
		want int
	}{
		{"lock lost", func(t *testing.T, p *proc, key string) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := r.Do(ctx, "DEL", b.Key(key)); err != nil {
				t.Fatal(err)
			}
		}, 75},
		{"SIGTERM", func(t *testing.T, p *proc, key string) {
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}, 128 + int(syscall.SIGTERM)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "group-" + strings.ReplaceAll(tc.name, " ", "-")
			p, _, child, pgid := startGroup(t, r, key, script, "--ttl", "600ms")
			tc.stop(t, p, key)
			if code, _ := p.wait(t); code != tc.want {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.want, p.stderr.String())
			}
			waitUntil(t, 10*time.Second, "CMD's background child is gone", func() bool { return processGone(child) })
			waitUntil(t, 10*time.Second, "CMD's process group is empty", func() bool { return len(groupMembers(pgid)) == 0 })
		})
	}
}

// TestLockKilledStopsProcessGroup kills llmgate with SIGKILL while CMD runs:
// CMD and what it started in the background must stop too, since nothing
// renews the lock any more and the next holder may start at any time.
func TestLockKilledStopsProcessGroup(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, tc := range []struct {
		name   string
		script string
		grace  string
		before func(t *testing.T, p *proc) // what happens before the SIGKILL
	}{
		// --grace far above the bound below: SIGTERM did it, not SIGKILL.
		{"SIGTERM stops them", `sleep 300 & echo $$ $! > "$1"; echo ready; wait`, "1m", nil},
		{"SIGKILL after --grace", `trap '' TERM; sleep 300 & echo $$ $! > "$1"; echo ready; wait`, "300ms", nil},
		// The SIGHUP llmgate passes on reaches the whole process group: it
		// must not disarm what stops the group later.
		{"after a forwarded SIGHUP", `trap '' HUP; sleep 300 & trap 'echo got HUP' HUP; echo $$ $! > "$1"; echo ready; ` + idle, "1m",
			func(t *testing.T, p *proc) {
				if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
					t.Fatal(err)
				}
				p.stdout.WaitFor(t, "got HUP\n", 30*time.Second)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A key of its own: a killed llmgate leaves its lock to expire.
			key := "killed-" + strings.ReplaceAll(tc.name, " ", "-")
			p, sh, child, pgid := startGroup(t, r, key, tc.script, "--grace", tc.grace)
			if tc.before != nil {
				tc.before(t, p)
			}
			if err := p.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			if code, _ := p.wait(t); code != 128+int(syscall.SIGKILL) {
				t.Fatalf("exit %d, want 137; stderr %q", code, p.stderr.String())
			}
			waitUntil(t, 10*time.Second, "CMD is gone", func() bool { return processGone(sh) })
			waitUntil(t, 10*time.Second, "CMD's background child is gone", func() bool { return processGone(child) })
			waitUntil(t, 10*time.Second, "CMD's process group is empty", func() bool { return len(groupMembers(pgid)) == 0 })
			if s := p.stderr.String(); s != "" {
				t.Errorf("unexpected stderr %q", s)
			}
		})
	}
}

// openPTY returns the master side of a new pseudo-terminal and the path of
// its slave side.
func openPTY(t *testing.T) (*os.File, string) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	conn, err := m.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ioErr error
	if err := conn.Control(func(fd uintptr) {
		if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr != nil {
			return
		}
		n, ioErr = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
	}); err != nil {
		t.Fatal(err)
	}
	if ioErr != nil {
		t.Skipf("cannot set up a pseudo-terminal: %v", ioErr)
	}
	return m, fmt.Sprintf("/dev/pts/%d", n)
}

// startInTerminal starts llmgate as the foreground process of a new
// terminal session, as when a person types the command. Everything written
// on the terminal is collected in the returned buffer; the channel is
// closed once all of it is, after the session's last process has closed
// the terminal.
func startInTerminal(t *testing.T, args ...string) (*proc, *os.File, <-chan struct{}) {
	t.Helper()
	master, slavePath := openPTY(t)
	slave, err := os.OpenFile(slavePath, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("open %s: %v", slavePath, err)
	}
	defer slave.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	cmd := exec.CommandContext(ctx, llmgateBin, args...)
	cmd.Env = append(os.Environ(), "LLMGATE_STORE=")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	p := &proc{cmd: cmd, stdout: testutil.NewBuffer(), stderr: testutil.NewBuffer(), done: make(chan struct{}), started: time.Now()}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		defer cancel()
		_ = cmd.Wait()
		p.code = exitStatus(cmd.ProcessState)
		close(p.done)
	}()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			_, _ = p.stdout.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p, master, drained
}

// TestLockInteractiveTerminal: in the foreground of a terminal CMD can read
// the terminal (it is not put in a background process group, where reading
// would stop it with SIGTTIN), and Ctrl-C reaches it once.
func TestLockInteractiveTerminal(t *testing.T) {
	r := testutil.StartRedis(t)
	t.Run("read", func(t *testing.T) {
		script := `printf 'name? '; read name; echo "hello $name"; exit 3`
		p, master, _ := startInTerminal(t, "lock", "--store", r.URL(), "--key", "tty", "--", "sh", "-c", script)
		p.stdout.WaitFor(t, "name? ", 30*time.Second)
		if _, err := master.Write([]byte("bob\n")); err != nil {
			t.Fatal(err)
		}
		p.stdout.WaitFor(t, "hello bob", 30*time.Second)
		if code, _ := p.wait(t); code != 3 {
			t.Fatalf("exit %d, want 3; terminal %q", code, p.stdout.String())
		}
		assertFree(t, r, "tty")
	})
	t.Run("ctrl-c", func(t *testing.T) {
		script := `trap 'echo "got INT"; exit 4' INT; echo ready; ` + idle
		p, master, drained := startInTerminal(t, "lock", "--store", r.URL(), "--key", "tty", "--", "sh", "-c", script)
		p.stdout.WaitFor(t, "ready", 30*time.Second)
		if _, err := master.Write([]byte{3}); err != nil { // ^C: SIGINT to the foreground group
			t.Fatal(err)
		}
		if code, _ := p.wait(t); code != 4 {
			t.Fatalf("exit %d, want 4; terminal %q", code, p.stdout.String())
		}
		select { // everything CMD wrote has been read from the terminal
		case <-drained:
		case <-time.After(30 * time.Second):
			t.Fatal("the terminal did not close after llmgate exited")
		}
		if n := strings.Count(p.stdout.String(), "got INT"); n != 1 {
			t.Errorf("CMD saw SIGINT %d times, want once (llmgate must not forward the terminal's own)", n)
		}
		assertFree(t, r, "tty")
	})
}

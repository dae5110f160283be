package app

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...; comm may contain spaces, so look after the ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || strings.HasPrefix(s[i+1:], " Z") || strings.HasPrefix(s[i+1:], " X")
}

// TestLockLostKillsProcessGroup: what CMD started in the background is
// signalled with it when the lock is lost.
func TestLockLostKillsProcessGroup(t *testing.T) {
	r := testutil.StartRedis(t)
	_, b := locker(t, r)
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := `sleep 30 & echo $! > "$1"; echo ready; wait`
	p := startLlmgate(t, nil, "lock", "--store", r.URL(), "--key", "group", "--ttl", "600ms", "--", "sh", "-c", script, "sh", pidFile)
	p.stdout.WaitFor(t, "ready\n", 30*time.Second)
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("pid file %q: %v", data, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.Do(ctx, "DEL", b.Key("group")); err != nil {
		t.Fatal(err)
	}
	if code, _ := p.wait(t); code != 75 {
		t.Fatalf("exit %d, want 75; stderr %q", code, p.stderr.String())
	}
	waitUntil(t, 10*time.Second, "CMD's background child is gone", func() bool { return processGone(pid) })
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
// on the terminal is collected in the returned buffer.
func startInTerminal(t *testing.T, args ...string) (*proc, *os.File) {
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
	go func() {
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
	return p, master
}

// TestLockInteractiveTerminal: in the foreground of a terminal CMD can read
// the terminal (it is not put in a background process group, where reading
// would stop it with SIGTTIN), and Ctrl-C reaches it once.
func TestLockInteractiveTerminal(t *testing.T) {
	r := testutil.StartRedis(t)
	t.Run("read", func(t *testing.T) {
		script := `printf 'name? '; read name; echo "hello $name"; exit 3`
		p, master := startInTerminal(t, "lock", "--store", r.URL(), "--key", "tty", "--", "sh", "-c", script)
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
		p, master := startInTerminal(t, "lock", "--store", r.URL(), "--key", "tty", "--", "sh", "-c", script)
		p.stdout.WaitFor(t, "ready", 30*time.Second)
		if _, err := master.Write([]byte{3}); err != nil { // ^C: SIGINT to the foreground group
			t.Fatal(err)
		}
		if code, _ := p.wait(t); code != 4 {
			t.Fatalf("exit %d, want 4; terminal %q", code, p.stdout.String())
		}
		if n := strings.Count(p.stdout.String(), "got INT"); n != 1 {
			t.Errorf("CMD saw SIGINT %d times, want once (llmgate must not forward the terminal's own)", n)
		}
		assertFree(t, r, "tty")
	})
}

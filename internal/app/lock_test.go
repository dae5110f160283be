//go:build unix

package app

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/redis"
)

// locker returns a Locker on r, as another process would use it.
func locker(t *testing.T, r *testutil.Redis) (*lock.Locker, *redis.Backend) {
	t.Helper()
	b := redis.New(r.Client(t), redis.Config{})
	return lock.New(b), b
}

// hold takes key on r for the rest of the test, as another process.
func hold(t *testing.T, r *testutil.Redis, key string) *lock.Lease {
	t.Helper()
	l, _ := locker(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lease, err := l.TryAcquire(ctx, key, lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatalf("hold %q: %v", key, err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	return lease
}

// assertFree fails the test unless key can be taken at once (llmgate
// released it).
func assertFree(t *testing.T, r *testutil.Redis, key string) {
	t.Helper()
	l, _ := locker(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lease, err := l.TryAcquire(ctx, key, lock.Options{})
	if err != nil {
		t.Fatalf("%q was not released: %v", key, err)
	}
	_ = lease.Release(ctx)
}

// waitUntil polls cond, a fact about another process or the store that
// nothing can notify us of, until it holds or timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	e2eutil.WaitUntil(t, timeout, what, cond)
}

// idle is a CMD body that runs until a signal stops it. It polls in short
// sleeps rather than one long one so that no child outlives the shell (a
// signal that lands while sh forks its child can be lost by that child),
// and keeps the shell's "Terminated" notices off stderr.
const idle = "while :; do sleep 0.05; done 2>/dev/null"

func TestLockExitStatusPassthrough(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, tc := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 7", 7},
		{"exit 255", 255},
		{"kill -TERM $$", 128 + int(syscall.SIGTERM)},
		{"kill -KILL $$", 128 + int(syscall.SIGKILL)},
	} {
		t.Run(tc.script, func(t *testing.T) {
			p := startLlmgate(t, nil, "lock", "--store", r.URL(), "--key", "exit", "--", "sh", "-c", tc.script)
			code, _ := p.wait(t)
			if code != tc.want {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.want, p.stderr.String())
			}
			if s := p.stderr.String(); s != "" {
				t.Errorf("unexpected stderr %q", s)
			}
			assertFree(t, r, "exit")
		})
	}
}

func TestLockEnvironment(t *testing.T) {
	r := testutil.StartRedis(t)
	script := `printf '%s\n%s\n%s\n' "$LLMGATE_LOCK_KEY" "$LLMGATE_LOCK_FENCE" "$LLMGATE_LOCK_TOKEN"`
	var lastFence uint64
	for i := range 2 {
		code, stdout, stderr := runApp(t, nil, "lock", "--store", r.URL(), "--key", "env-key", "--", "sh", "-c", script)
		if code != 0 || stderr != "" {
			t.Fatalf("run %d: exit %d, stderr %q", i, code, stderr)
		}
		lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
		if len(lines) != 3 {
			t.Fatalf("run %d: CMD printed %q", i, stdout)
		}
		if lines[0] != "env-key" {
			t.Errorf("LLMGATE_LOCK_KEY = %q", lines[0])
		}
		fence, err := strconv.ParseUint(lines[1], 10, 64)
		if err != nil || fence == 0 {
			t.Errorf("LLMGATE_LOCK_FENCE = %q is not a positive integer", lines[1])
		}
		if fence <= lastFence {
			t.Errorf("fence %d did not increase after %d", fence, lastFence)
		}
		lastFence = fence
		if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(lines[2]) {
			t.Errorf("LLMGATE_LOCK_TOKEN = %q is not 32 hex characters", lines[2])
		}
	}
	assertFree(t, r, "env-key")
}

func TestLockStoreFromEnvironment(t *testing.T) {
	r := testutil.StartRedis(t)
	code, stdout, stderr := runApp(t, map[string]string{"LLMGATE_STORE": r.URL()}, "lock", "--key", "k", "--", "echo", "ran")
	if code != 0 || stdout != "ran\n" || stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// --store wins over LLMGATE_STORE.
	code, _, stderr = runApp(t, map[string]string{"LLMGATE_STORE": "memory"}, "lock", "--store", r.URL(), "--key", "k", "--", "true")
	if code != 0 {
		t.Fatalf("--store with LLMGATE_STORE=memory: exit %d, stderr %q", code, stderr)
	}
}

func TestLockVerbose(t *testing.T) {
	r := testutil.StartRedis(t)
	code, _, stderr := runApp(t, nil, "lock", "-v", "--store", r.URL(), "--key", "verbose", "--wait", "1s", "--", "true")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{`waiting up to 1s for "verbose"`, `acquired "verbose" (fence `, `released "verbose"`} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q: %q", want, stderr)
		}
	}
}

// TestLockMutualExclusion runs several llmgate processes on one key at once:
// their critical sections must never interleave, and fences must increase
// in the order the sections ran.
func TestLockMutualExclusion(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "log")
			script := `echo "start $LLMGATE_LOCK_FENCE" >> "$1"; sleep 0.05; echo "end $LLMGATE_LOCK_FENCE" >> "$1"`
			args := []string{"lock", "--store", r.URL(), "--key", "mutex", "--wait", "30s"}
			if fair {
				args = append(args, "--fair")
			}
			args = append(args, "--", "sh", "-c", script, "sh", file)
			const n = 5
			procs := make([]*proc, n)
			for i := range procs {
				procs[i] = startLlmgate(t, nil, args...)
			}
			for i, p := range procs {
				if code, _ := p.wait(t); code != 0 {
					t.Fatalf("process %d: exit %d, stderr %q", i, code, p.stderr.String())
				}
			}
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
			if len(lines) != 2*n {
				t.Fatalf("want %d lines, got:\n%s", 2*n, data)
			}
			var last uint64
			for i := 0; i < len(lines); i += 2 {
				start, end := lines[i], lines[i+1]
				f, err := strconv.ParseUint(strings.TrimPrefix(start, "start "), 10, 64)
				if !strings.HasPrefix(start, "start ") || err != nil || end != "end "+strconv.FormatUint(f, 10) {
					t.Fatalf("critical sections interleaved at line %d:\n%s", i+1, data)
				}
				if f <= last {
					t.Fatalf("fence %d after %d:\n%s", f, last, data)
				}
				last = f
			}
		})
	}
}

func TestLockNotObtained(t *testing.T) {
	r := testutil.StartRedis(t)
	hold(t, r, "busy")
	marker := filepath.Join(t.TempDir(), "ran")
	for _, tc := range []struct {
		wait    string
		min     time.Duration
		message string
	}{
		{"200ms", 200 * time.Millisecond, `llmgate lock: "busy" is held by another process; not obtained within 200ms`},
		{"0", 0, `llmgate lock: "busy" is held by another process; not obtained (--wait 0 tries once)`},
	} {
		t.Run("wait="+tc.wait, func(t *testing.T) {
			p := startLlmgate(t, nil, "lock", "--store", r.URL(), "--key", "busy", "--wait", tc.wait, "--", "touch", marker)
			code, took := p.wait(t)
			if code != 75 {
				t.Fatalf("exit %d, want 75; stderr %q", code, p.stderr.String())
			}
			if got := oneLine(t, p.stderr.String()); got != tc.message {
				t.Errorf("stderr %q, want %q", got, tc.message)
			}
			// Roughly the wait: not before it, and not much after it
			// (process start-up and the race detector included).
			if took < tc.min || took > tc.min+5*time.Second {
				t.Errorf("gave up after %v with --wait %s", took, tc.wait)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("CMD ran without the lock")
			}
		})
	}
}

// TestLockLost deletes the lock from outside while CMD runs: the watchdog's
// next renewal finds it gone, CMD gets SIGTERM, llmgate exits 75.
func TestLockLost(t *testing.T) {
	r := testutil.StartRedis(t)
	_, b := locker(t, r)
	script := `trap 'echo got TERM; exit 1' TERM; echo ready; ` + idle
	p := startLlmgate(t, nil, "lock", "--store", r.URL(), "--key", "lost", "--ttl", "600ms", "--", "sh", "-c", script)
	p.stdout.WaitFor(t, "ready\n", 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if reply, err := r.Do(ctx, "DEL", b.Key("lost")); err != nil || reply != ":1" {
		t.Fatalf("DEL %s: %q, %v", b.Key("lost"), reply, err)
	}
	deleted := time.Now()
	code, _ := p.wait(t)
	took := time.Since(deleted)
	if code != 75 {
		t.Fatalf("exit %d, want 75; stderr %q", code, p.stderr.String())
	}
	if !strings.Contains(p.stdout.String(), "got TERM") {
		t.Errorf("CMD did not get SIGTERM; stdout %q", p.stdout.String())
	}
	line := oneLine(t, p.stderr.String())
	if !strings.HasPrefix(line, `llmgate lock: lost "lost" while sh was running (`) || !strings.HasSuffix(line, "; sending SIGTERM") {
		t.Errorf("stderr %q", line)
	}
	// The renewal period is 200ms; allow for scheduling and the race detector.
	if took > 3*time.Second {
		t.Errorf("loss noticed %v after the DEL; want about one renewal period (200ms)", took)
	}
}

// TestLockLostFoundAtRelease deletes the lock while CMD runs, between two
// renewals, and lets CMD finish before the watchdog notices: the release
// finds the lock gone, and llmgate exits 75 even though CMD succeeded,
// because CMD may have overlapped another holder.
func TestLockLostFoundAtRelease(t *testing.T) {
	r := testutil.StartRedis(t)
	_, b := locker(t, r)
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinW.Close()
	// --ttl 1m: the next renewal is 20s away.
	p := startLlmgateIn(t, stdinR, nil, "lock", "--store", r.URL(), "--key", "late", "--ttl", "1m", "--", "sh", "-c", "echo ready; read line; exit 0")
	stdinR.Close()
	p.stdout.WaitFor(t, "ready\n", 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.Do(ctx, "DEL", b.Key("late")); err != nil {
		t.Fatal(err)
	}
	if _, err := stdinW.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	code, _ := p.wait(t)
	if code != 75 {
		t.Fatalf("exit %d, want 75; stderr %q", code, p.stderr.String())
	}
	want := `llmgate lock: lost "late" while sh was running (the store no longer has it: it expired or was deleted); it exited with status 0`
	if got := oneLine(t, p.stderr.String()); got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
}

// TestLockStoreDown stops Redis while CMD runs: the lease cannot be renewed,
// so it is lost when its validity runs out, and CMD is stopped.
func TestLockStoreDown(t *testing.T) {
	r := testutil.StartRedis(t)
	script := `trap 'echo got TERM; exit 1' TERM; echo ready; ` + idle
	p := startLlmgate(t, nil, "lock", "--store", r.URL(), "--key", "down", "--ttl", "600ms", "--", "sh", "-c", script)
	p.stdout.WaitFor(t, "ready\n", 30*time.Second)
	r.Stop()
	code, _ := p.wait(t)
	if code != 75 {
		t.Fatalf("exit %d, want 75; stderr %q", code, p.stderr.String())
	}
	line := oneLine(t, p.stderr.String())
	if !strings.Contains(line, `lost "down" while sh was running (not confirmed before its validity ran out`) || !strings.HasSuffix(line, "; sending SIGTERM") {
		t.Errorf("stderr %q", line)
	}
	if !strings.Contains(p.stdout.String(), "got TERM") {
		t.Errorf("CMD did not get SIGTERM; stdout %q", p.stdout.String())
	}
}

// TestLockLostGrace: a CMD that ignores SIGTERM is killed after --grace.
func TestLockLostGrace(t *testing.T) {
	r := testutil.StartRedis(t)
	_, b := locker(t, r)
	script := `trap 'echo ignoring TERM' TERM; echo ready; ` + idle
	p := startLlmgate(t, nil, "lock", "--store", r.URL(), "--key", "stubborn", "--ttl", "600ms", "--grace", "300ms", "--", "sh", "-c", script)
	p.stdout.WaitFor(t, "ready\n", 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.Do(ctx, "DEL", b.Key("stubborn")); err != nil {
		t.Fatal(err)
	}
	code, _ := p.wait(t)
	if code != 75 {
		t.Fatalf("exit %d, want 75; stderr %q", code, p.stderr.String())
	}
	stderr := p.stderr.String()
	if !strings.Contains(stderr, "sending SIGTERM") || !strings.Contains(stderr, "sh did not exit within --grace 300ms; sending SIGKILL") {
		t.Errorf("stderr %q", stderr)
	}
	if !strings.Contains(p.stdout.String(), "ignoring TERM") {
		t.Errorf("CMD did not get SIGTERM first; stdout %q", p.stdout.String())
	}
}

// TestLockForwardsSignals sends llmgate a signal while CMD runs: CMD gets
// it, llmgate reports CMD's status and releases the lock.
func TestLockForwardsSignals(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, tc := range []struct {
		name   string
		sig    syscall.Signal
		script string
		want   int
		stdout string
	}{
		{"trapped SIGTERM", syscall.SIGTERM, `trap 'echo got TERM; exit 5' TERM; echo ready; ` + idle, 5, "got TERM"},
		{"trapped SIGHUP", syscall.SIGHUP, `trap 'echo got HUP; exit 6' HUP; echo ready; ` + idle, 6, "got HUP"},
		{"SIGINT kills CMD", syscall.SIGINT, `echo ready; ` + idle, 128 + int(syscall.SIGINT), ""},
		{"SIGTERM kills CMD", syscall.SIGTERM, `echo ready; ` + idle, 128 + int(syscall.SIGTERM), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startLlmgate(t, nil, "lock", "--store", r.URL(), "--key", "fwd", "--", "sh", "-c", tc.script)
			p.stdout.WaitFor(t, "ready\n", 30*time.Second)
			if err := p.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			code, _ := p.wait(t)
			if code != tc.want {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.want, p.stderr.String())
			}
			if !strings.Contains(p.stdout.String(), tc.stdout) {
				t.Errorf("stdout %q lacks %q", p.stdout.String(), tc.stdout)
			}
			if s := p.stderr.String(); s != "" {
				t.Errorf("unexpected stderr %q", s)
			}
			assertFree(t, r, "fwd")
		})
	}
}

// TestLockSignalWhileWaiting: SIGINT or SIGTERM abandons the wait, exits
// 128+N, never runs CMD and leaves no waiter behind in the store.
func TestLockSignalWhileWaiting(t *testing.T) {
	r := testutil.StartRedis(t)
	_, b := locker(t, r)
	hold(t, r, "queue")
	for _, tc := range []struct {
		sig  syscall.Signal
		name string
		fair bool
	}{
		{syscall.SIGINT, "SIGINT", false},
		{syscall.SIGTERM, "SIGTERM", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "ran")
			args := []string{"lock", "--store", r.URL(), "--key", "queue", "--wait", "30s"}
			if tc.fair {
				args = append(args, "--fair")
			}
			p := startLlmgate(t, nil, append(args, "--", "touch", marker)...)
			waiters := func() int {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				n, err := b.Waiters(ctx, "queue")
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			waitUntil(t, 30*time.Second, "llmgate queues for the lock", func() bool { return waiters() == 1 })
			if err := p.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			signalled := time.Now()
			code, _ := p.wait(t)
			if want := 128 + int(tc.sig); code != want {
				t.Fatalf("exit %d, want %d; stderr %q", code, want, p.stderr.String())
			}
			if took := time.Since(signalled); took > 5*time.Second {
				t.Errorf("took %v to give up after %s", took, tc.name)
			}
			want := fmt.Sprintf(`llmgate lock: interrupted by %s while waiting for "queue"; CMD not run`, tc.name)
			if got := oneLine(t, p.stderr.String()); got != want {
				t.Errorf("stderr %q, want %q", got, want)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("CMD ran")
			}
			waitUntil(t, 10*time.Second, "the abandoned waiter leaves the queue", func() bool { return waiters() == 0 })
		})
	}
}

func TestLockUsageErrors(t *testing.T) {
	r := testutil.StartRedis(t)
	free, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	unreachable := fmt.Sprintf("redis://127.0.0.1:%d", free)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string // in the one line on stderr
	}{
		{"memory", nil, []string{"--store", "memory", "--key", "k", "--", "true"},
			"llmgate lock: --store memory cannot coordinate separate processes; use redis://host:port"},
		{"memory from env", map[string]string{"LLMGATE_STORE": "memory"}, []string{"--key", "k", "--", "true"},
			"llmgate lock: --store memory (from LLMGATE_STORE) cannot coordinate separate processes; use redis://host:port"},
		{"no store", nil, []string{"--key", "k", "--", "true"}, "--store is required"},
		{"bad scheme", nil, []string{"--store", "http://127.0.0.1:1", "--key", "k", "--", "true"}, "--store: bad store URL"},
		{"no scheme", nil, []string{"--store", "127.0.0.1:6379", "--key", "k", "--", "true"}, "--store: bad store URL"},
		{"unreachable", nil, []string{"--store", unreachable, "--key", "k", "--", "true"}, "--store: cannot connect to " + unreachable},
		{"missing CMD", nil, []string{"--store", r.URL(), "--key", "k"}, "missing CMD"},
		{"missing CMD after --", nil, []string{"--store", r.URL(), "--key", "k", "--"}, "missing CMD"},
		{"missing key", nil, []string{"--store", r.URL(), "--", "true"}, "--key is required"},
		{"empty key", nil, []string{"--store", r.URL(), "--key", "", "--", "true"}, "--key is required"},
		{"bad ttl", nil, []string{"--store", r.URL(), "--key", "k", "--ttl", "10", "--", "true"}, `invalid value "10" for flag --ttl`},
		{"bad wait", nil, []string{"--store", r.URL(), "--key", "k", "--wait", "soon", "--", "true"}, `invalid value "soon" for flag --wait`},
		{"bad grace", nil, []string{"--store", r.URL(), "--key", "k", "--grace", "x", "--", "true"}, `invalid value "x" for flag --grace`},
		{"ttl below minimum", nil, []string{"--store", r.URL(), "--key", "k", "--ttl", "5ms", "--", "true"}, "--ttl 5ms is below the minimum 10ms"},
		{"negative wait", nil, []string{"--store", r.URL(), "--key", "k", "--wait", "-1s", "--", "true"}, "--wait -1s is negative"},
		{"negative grace", nil, []string{"--store", r.URL(), "--key", "k", "--grace", "-1s", "--", "true"}, "--grace -1s is negative"},
		{"unknown flag", nil, []string{"--store", r.URL(), "--key", "k", "--nope", "--", "true"}, "flag provided but not defined: --nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, stdout, stderr := runApp(t, tc.env, append([]string{"lock"}, tc.args...)...)
			if code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if line := oneLine(t, stderr); !strings.Contains(line, tc.want) || !strings.HasPrefix(line, "llmgate lock: ") {
				t.Errorf("stderr %q, want it to contain %q", line, tc.want)
			}
			if stdout != "" {
				t.Errorf("stdout %q", stdout)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %v to fail", took)
			}
		})
	}
}

func TestLockCommandNotRunnable(t *testing.T) {
	r := testutil.StartRedis(t)
	dir := t.TempDir()
	notExec := filepath.Join(dir, "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cmd  string
		want int
	}{
		{"llmgate-no-such-command", 127},
		{filepath.Join(dir, "missing"), 127},
		{notExec, 126},
	} {
		code, _, stderr := runApp(t, nil, "lock", "--store", r.URL(), "--key", "k", "--", tc.cmd)
		if code != tc.want || !strings.Contains(oneLine(t, stderr), "cannot run CMD") {
			t.Errorf("%s: exit %d, want %d; stderr %q", tc.cmd, code, tc.want, stderr)
		}
	}
	assertFree(t, r, "k")
}

// TestLockNeverPrintsPassword passes a password in the store URL, in every
// way that fails or succeeds, and checks that it never reaches stderr.
func TestLockNeverPrintsPassword(t *testing.T) {
	r := testutil.StartRedis(t)
	free, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		store string
		want  int
	}{
		{"unreachable", fmt.Sprintf("redis://:s3cret@127.0.0.1:%d", free), 2},
		{"unreachable with user", fmt.Sprintf("redis://admin:s3cret@127.0.0.1:%d", free), 2},
		{"unparsable", "redis://:s3cret@[::1", 2},
		{"bad port", "redis://:s3cret@127.0.0.1:port", 2},
		{"bad db", "redis://:s3cret@127.0.0.1:1/x/y", 2},
		// A server without a password accepts any (the default user is
		// nopass): the lock works, and -v output must not show it either.
		{"server without auth", "redis://:s3cret@" + r.Addr, 0},
		// Wrong password for an existing user.
		{"wrong user", "redis://nobody:s3cret@" + r.Addr, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, viaEnv := range []bool{false, true} {
				args := []string{"lock", "-v", "--key", "pw", "--", "true"}
				env := map[string]string{}
				if viaEnv {
					env["LLMGATE_STORE"] = tc.store
				} else {
					args = append([]string{"lock", "--store", tc.store}, args[1:]...)
				}
				code, stdout, stderr := runApp(t, env, args...)
				if code != tc.want {
					t.Errorf("env=%v: exit %d, want %d; stderr %q", viaEnv, code, tc.want, stderr)
				}
				if strings.Contains(stderr+stdout, "s3cret") {
					t.Errorf("env=%v: password printed: %q", viaEnv, stderr)
				}
				if tc.want == 2 {
					oneLine(t, stderr)
				}
			}
		})
	}
}

// TestLockConcurrentInProcess runs several lock commands inside one process,
// as tests and embedders do: each must release its lock.
func TestLockConcurrentInProcess(t *testing.T) {
	r := testutil.StartRedis(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &App{Stdin: strings.NewReader(""), Stdout: testutil.NewBuffer(), Stderr: testutil.NewBuffer(), Getenv: func(string) string { return "" }}
			if code := a.Run([]string{"lock", "--store", r.URL(), "--key", "inproc", "--wait", "30s", "--", "true"}); code != 0 {
				errs <- fmt.Errorf("run %d: exit %d, stderr %q", i, code, a.Stderr.(*testutil.Buffer).String())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assertFree(t, r, "inproc")
}

// TestLockReaperRefuses runs the reaper by hand: it acts only as the leader
// of a process group of its own, as llmgate lock starts it, so that it can
// never signal its caller's group.
func TestLockReaperRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		attr *syscall.SysProcAttr
	}{
		{"in its caller's group", []string{"1s"}, nil},
		{"no grace", nil, &syscall.SysProcAttr{Setpgid: true}},
		{"bad grace", []string{"soon"}, &syscall.SysProcAttr{Setpgid: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, llmgateBin, append([]string{reaperCommand}, tc.args...)...)
			stdout, stderr := testutil.NewBuffer(), testutil.NewBuffer()
			cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = stdout, stderr, tc.attr
			_ = cmd.Run()
			if code := exitStatus(cmd.ProcessState); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if got, want := oneLine(t, stderr.String()), "llmgate: __lock-reaper is internal to llmgate lock"; got != want {
				t.Errorf("stderr %q, want %q", got, want)
			}
			if stdout.String() != "" {
				t.Errorf("stdout %q: it went on as a reaper", stdout.String())
			}
		})
	}
}

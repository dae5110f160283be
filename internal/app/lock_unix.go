//go:build unix

package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/redis"
)

// storeTimeout bounds a single TryAcquire (--wait 0) and the final Release.
const storeTimeout = 10 * time.Second

// forwarded are the signals llmgate lock catches: while waiting they abandon
// the wait, while CMD runs they are passed on to it.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// lockRun is the state of one 'llmgate lock' run.
type lockRun struct {
	a    *App
	c    lockConfig
	name string // CMD's name, for messages
}

func (r *lockRun) errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintf(r.a.Stderr, "llmgate lock: %s\n", redactSecret(msg, r.c.store))
}

func (r *lockRun) infof(format string, args ...any) {
	if r.c.verbose {
		r.errorf(format, args...)
	}
}

// runLock acquires c.key, runs c.argv while holding it and returns the exit
// status.
func (a *App) runLock(c lockConfig) int {
	r := &lockRun{a: a, c: c, name: c.argv[0]}

	// Find CMD before touching the store: a typo never takes the lock.
	path, err := exec.LookPath(c.argv[0])
	if err != nil {
		r.errorf("cannot run CMD: %v", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return exitNotFound
		}
		return exitNoExec
	}

	client, err := storeurl.OpenRedis(c.store)
	if err != nil {
		r.errorf("--store: %s", strings.TrimPrefix(err.Error(), "storeurl: "))
		return exitUsage
	}
	defer client.Close()
	backend := redis.New(client, redis.Config{})
	defer backend.Close() // before the client: it ends the wake-up subscription
	locker := lock.New(backend)

	// Catch signals from here on; signals that were ignored when llmgate
	// started stay ignored, for llmgate and CMD alike (nohup, '&' in scripts).
	sigs := make(chan os.Signal, 8)
	for _, s := range forwarded {
		if !signal.Ignored(s) {
			signal.Notify(sigs, s)
		}
	}
	defer signal.Stop(sigs)

	lease, status := r.acquire(locker, sigs)
	if lease == nil {
		return status
	}
	return r.run(path, lease, sigs)
}

// acquire takes the lock, waiting up to --wait. A signal abandons the wait.
// It returns the lease, or nil and the exit status.
func (r *lockRun) acquire(locker *lock.Locker, sigs <-chan os.Signal) (*lock.Lease, int) {
	c := r.c
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		lease *lock.Lease
		err   error
	}
	done := make(chan result, 1)
	opts := lock.Options{TTL: c.ttl, Fair: c.fair}
	if c.wait > 0 {
		r.infof("waiting up to %v for %q", c.wait, c.key)
	}
	go func() {
		var res result
		if c.wait > 0 {
			wctx, wcancel := context.WithTimeout(ctx, c.wait)
			res.lease, res.err = locker.Acquire(wctx, c.key, opts)
			wcancel()
		} else {
			tctx, tcancel := context.WithTimeout(ctx, storeTimeout)
			res.lease, res.err = locker.TryAcquire(tctx, c.key, opts)
			tcancel()
		}
		done <- res
	}()

	var interrupted os.Signal
	for {
		select {
		case s := <-sigs:
			if interrupted == nil {
				interrupted = s
				cancel()
			}
		case res := <-done:
			switch {
			case interrupted != nil:
				if res.lease != nil {
					// Granted just as the signal came: give it back.
					_ = res.lease.Release(context.Background())
				}
				r.errorf("interrupted by %s while waiting for %q; CMD not run", sigName(interrupted), c.key)
				return nil, 128 + sigNum(interrupted)
			case res.err == nil:
				return res.lease, exitOK
			case errors.Is(res.err, lock.ErrNotObtained) && c.wait > 0:
				r.errorf("%q is held by another process; not obtained within %v", c.key, c.wait)
				return nil, exitTempFail
			case errors.Is(res.err, lock.ErrNotObtained):
				r.errorf("%q is held by another process; not obtained (--wait 0 tries once)", c.key)
				return nil, exitTempFail
			case errors.Is(res.err, lock.ErrInvalidOptions):
				r.errorf("%v", res.err)
				return nil, exitUsage
			default:
				r.errorf("cannot acquire %q: %v", c.key, res.err)
				return nil, exitTempFail
			}
		}
	}
}

// run starts CMD under lease, watches both, and returns the exit status.
func (r *lockRun) run(path string, lease *lock.Lease, sigs <-chan os.Signal) int {
	c := r.c
	lease.Keepalive()
	r.infof("acquired %q (fence %d)", c.key, lease.Fence)

	cmd := exec.Command(path, c.argv[1:]...)
	cmd.Args[0] = c.argv[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r.a.Stdin, r.a.Stdout, r.a.Stderr
	cmd.Env = append(r.a.Environ(),
		"LLMGATE_LOCK_KEY="+c.key,
		"LLMGATE_LOCK_TOKEN="+lease.Token,
		fmt.Sprintf("LLMGATE_LOCK_FENCE=%d", lease.Fence),
	)
	// Only matters when stdio are not files (tests): do not wait forever for
	// a background grandchild that keeps a pipe open.
	cmd.WaitDelay = time.Second

	// CMD never ran if it fails to start: whether the lease survived does
	// not matter then.
	giveBack := func() {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		_ = lease.Release(ctx)
		cancel()
	}

	// In the foreground of a terminal, CMD stays in llmgate's process group
	// so that it can read the terminal and job control (Ctrl-C, Ctrl-Z)
	// works as without llmgate; the terminal then signals CMD itself.
	// Otherwise (cron, services, scripts without a terminal) CMD joins the
	// process group of a reaper, and signals go to the whole group, so that
	// nothing CMD started outlives a lost lock, or llmgate's death.
	interactive := foregroundOfTerminal()
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	var rp *reaper
	if interactive {
		// Only CMD itself, and only on Linux: its group is shared with
		// whatever else the terminal's job runs.
		setDeathSignal(cmd.SysProcAttr)
		// The death signal is tied to the OS thread that starts CMD.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	} else {
		var err error
		if rp, err = startReaper(c.grace); err != nil {
			giveBack()
			r.errorf("cannot run CMD: cannot start the process that stops it if llmgate dies: %v", err)
			return exitNoExec
		}
		cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Pgid = true, rp.pgid()
	}

	if err := cmd.Start(); err != nil {
		if rp != nil {
			rp.stop()
		}
		giveBack()
		r.errorf("cannot run CMD: %v", err)
		if errors.Is(err, fs.ErrNotExist) {
			return exitNotFound
		}
		return exitNoExec
	}
	signalCMD := func(s syscall.Signal) {
		if interactive {
			_ = cmd.Process.Signal(s)
		} else {
			_ = syscall.Kill(-rp.pgid(), s) // the whole group, the reaper included
		}
	}

	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait() // only I/O copy errors, with stdio that are not files
		close(exited)
	}()

	leaseDone := lease.Done()
	var kill <-chan time.Time
	lost := false
	for running := true; running; {
		select {
		case <-exited:
			running = false
		case s := <-sigs:
			if interactive && (s == syscall.SIGINT || s == syscall.SIGQUIT) {
				continue // the terminal sent it to CMD as well
			}
			signalCMD(s.(syscall.Signal))
		case <-leaseDone:
			leaseDone = nil
			lost = true
			r.errorf("lost %q while %s was running (%s); sending SIGTERM", c.key, r.name, lostReason(lease.Err(), c.key))
			signalCMD(syscall.SIGTERM)
			t := time.NewTimer(c.grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			r.errorf("%s did not exit within --grace %v; sending SIGKILL", r.name, c.grace)
			signalCMD(syscall.SIGKILL)
		}
	}
	if rp != nil {
		rp.stop()
	}
	status := exitStatus(cmd.ProcessState)
	if lost {
		return exitTempFail
	}
	return r.releaseAfter(lease, status)
}

// releaseAfter releases lease once CMD exited with status and returns
// llmgate's exit status.
func (r *lockRun) releaseAfter(lease *lock.Lease, status int) int {
	c := r.c
	if err := lease.Err(); errors.Is(err, lock.ErrLost) {
		// Lost at about the moment CMD exited: it may have overlapped
		// another holder, which is what exit status 75 reports.
		r.errorf("lost %q while %s was running (%s); it exited with status %d", c.key, r.name, lostReason(err, c.key), status)
		return exitTempFail
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	err := lease.Release(ctx)
	switch {
	case err == nil:
		r.infof("released %q", c.key)
	case errors.Is(err, lock.ErrNotHeld):
		r.errorf("lost %q while %s was running (%s); it exited with status %d", c.key, r.name, lostReason(err, c.key), status)
		return exitTempFail
	default:
		r.errorf("could not release %q: %v; it frees itself within --ttl %v", c.key, err, c.ttl)
	}
	return status
}

// lostReason says why a lease was lost, without repeating the key.
func lostReason(err error, key string) string {
	switch {
	case err == nil:
		return "reason unknown"
	case errors.Is(err, lock.ErrNotHeld):
		return "the store no longer has it: it expired or was deleted"
	}
	return strings.TrimPrefix(err.Error(), fmt.Sprintf("%s: %q: ", lock.ErrLost, key))
}

// exitStatus is the status a shell would report for ps: the exit code, or
// 128+N for death by signal N.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return exitNoExec
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// foregroundOfTerminal reports whether llmgate has a controlling terminal
// and its process group is that terminal's foreground group.
func foregroundOfTerminal() bool {
	tty, err := os.OpenFile("/dev/tty", os.O_RDONLY|syscall.O_NOCTTY, 0)
	if err != nil {
		return false // no controlling terminal: cron, services, setsid
	}
	defer tty.Close()
	conn, err := tty.SyscallConn()
	if err != nil {
		return false
	}
	fg := -1
	_ = conn.Control(func(fd uintptr) {
		if p, err := unix.IoctlGetInt(int(fd), unix.TIOCGPGRP); err == nil {
			fg = p
		}
	})
	return fg == syscall.Getpgrp()
}

func sigNum(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return 0
}

func sigName(s os.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	}
	return s.String()
}

//go:build unix

package app

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// reaperStartTimeout bounds the wait for a new reaper to be ready.
const reaperStartTimeout = 10 * time.Second

// reaper is a second llmgate process that stops CMD's process group if
// llmgate dies, even by SIGKILL: CMD's children would otherwise carry on
// without the lock. It leads the process group that CMD joins, so the
// group's ID cannot be reused by unrelated processes while it watches.
// It learns of llmgate's death from its standard input: a pipe whose write
// end only llmgate holds, so the kernel closes it when llmgate dies.
type reaper struct {
	cmd   *exec.Cmd
	alive *os.File // the write end of the reaper's standard input
}

// startReaper starts a reaper that gives CMD grace between SIGTERM and
// SIGKILL, and returns once it is ready.
func startReaper(grace time.Duration) (*reaper, error) {
	self, err := selfPath()
	if err != nil {
		return nil, err
	}
	aliveR, aliveW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		aliveR.Close()
		aliveW.Close()
		return nil, err
	}
	defer readyR.Close()
	cmd := exec.Command(self, reaperCommand, grace.String())
	cmd.Args[0] = "llmgate"
	// No standard error: the reaper must not keep llmgate's output open
	// after llmgate died.
	cmd.Stdin, cmd.Stdout = aliveR, readyW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	aliveR.Close()
	readyW.Close()
	if err != nil {
		aliveW.Close()
		return nil, err
	}
	// Signals sent to CMD's group reach the reaper too. Start CMD only once
	// the reaper ignores them, or an early one would kill it.
	_ = readyR.SetReadDeadline(time.Now().Add(reaperStartTimeout))
	if _, err := io.ReadFull(readyR, make([]byte, 1)); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		aliveW.Close()
		return nil, fmt.Errorf("it did not get ready: %w", err)
	}
	return &reaper{cmd: cmd, alive: aliveW}, nil
}

// pgid is the process group CMD joins.
func (rp *reaper) pgid() int { return rp.cmd.Process.Pid }

// stop tells the reaper that CMD has exited and llmgate carries on. What
// CMD left running is left alone, as without the reaper.
func (rp *reaper) stop() {
	// Fails if the reaper was killed with CMD's group (SIGKILL after --grace).
	_, _ = rp.alive.Write([]byte{'.'})
	rp.alive.Close()
	// Reaped without waiting: nothing depends on its exit.
	go func() { _ = rp.cmd.Wait() }()
}

// lockReaper is 'llmgate __lock-reaper GRACE', started by llmgate lock (see
// reaper). It waits until llmgate says it is done (one byte on standard
// input) or dies (end of file), and then sends its process group SIGTERM,
// and SIGKILL once the group is empty or GRACE has passed.
func (a *App) lockReaper(args []string) int {
	var grace time.Duration
	var err error
	if len(args) == 1 {
		grace, err = time.ParseDuration(args[0])
	}
	// Only ever signal a group this process leads, never its caller's.
	if len(args) != 1 || err != nil || syscall.Getpgrp() != os.Getpid() {
		fmt.Fprintln(a.Stderr, "llmgate: "+reaperCommand+" is internal to llmgate lock")
		return exitUsage
	}
	// The signals llmgate passes on to CMD's group are for CMD.
	signal.Ignore(forwarded...)
	if _, err := a.Stdout.Write([]byte{'.'}); err != nil {
		return exitOK // llmgate is gone before CMD started
	}
	if _, err := io.ReadFull(a.Stdin, make([]byte, 1)); err == nil {
		return exitOK
	}
	pgid := os.Getpid()
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	for deadline := time.Now().Add(grace); othersInGroup(pgid) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	// Also when the group looks empty: a process that forked while the
	// group was read may have been missed. This ends the reaper too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return exitOK
}

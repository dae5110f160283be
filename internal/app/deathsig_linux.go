package app

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// setDeathSignal asks the kernel to send CMD SIGTERM if llmgate dies first
// (even by SIGKILL): the lock is no longer renewed then, so CMD must stop.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGTERM }

// selfPath is the llmgate binary to run the reaper from. /proc/self/exe
// still works if the file was replaced or removed since llmgate started.
func selfPath() (string, error) { return "/proc/self/exe", nil }

// othersInGroup reports whether a process other than this one still runs
// in process group pgid. kill(-pgid, 0) cannot tell: it counts this one.
func othersInGroup(pgid int) bool {
	self := os.Getpid()
	for _, pid := range groupMembers(pgid) {
		if pid != self {
			return true
		}
	}
	return false
}

// groupMembers lists the processes of group pgid that still run.
func groupMembers(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if running, pgrp := procStat(pid); running && pgrp == pgid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// procStat reads /proc/PID/stat: whether pid still runs (a zombie does not:
// it has exited, its parent just has not reaped it), and its process group.
func procStat(pid int) (running bool, pgrp int) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false, 0
	}
	// pid (comm) state ppid pgrp ...; comm may contain spaces and
	// parentheses, so look after the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return false, 0
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 3 || fields[0] == "Z" || fields[0] == "X" {
		return false, 0
	}
	pgrp, err = strconv.Atoi(fields[2])
	return err == nil, pgrp
}

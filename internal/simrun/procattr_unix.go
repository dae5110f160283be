//go:build unix && !linux

package simrun

import "syscall"

// childAttr puts a replica in a process group of its own (a Ctrl-C in the
// terminal reaches llmgate sim, which stops the replicas in order). Only
// Linux can also kill it when llmgate sim dies; stopReplicas stops the
// replicas on every normal exit.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

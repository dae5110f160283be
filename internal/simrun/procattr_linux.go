package simrun

import "syscall"

// childAttr puts a replica in a process group of its own (a Ctrl-C in the
// terminal reaches llmgate sim, which stops the replicas in order) and
// asks the kernel to kill it if llmgate sim dies first, even by SIGKILL,
// so that none is left behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

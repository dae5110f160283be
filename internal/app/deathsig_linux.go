package app

import "syscall"

// setDeathSignal asks the kernel to send CMD SIGTERM if llmgate dies first
// (even by SIGKILL): the lock is no longer renewed then, so CMD must stop.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGTERM }

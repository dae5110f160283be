package e2eutil

import "syscall"

// setDeathSignal asks the kernel to send the replica SIGTERM if the test
// binary dies first (even by SIGKILL): no replica outlives a crashed test.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGTERM }

package simrun

import "syscall"

// setDeathSignal asks the kernel to stop a replica if sim
// dies first (even by SIGKILL), so none is left behind.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

package localredis

import "syscall"

// setDeathSignal asks the kernel to kill a started redis-server if the
// parent dies first (even by SIGKILL), so none is left behind.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

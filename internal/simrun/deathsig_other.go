//go:build !linux

package simrun

import "syscall"

// setDeathSignal does nothing: only Linux can signal a child when its
// parent dies; stopReplicas stops them on every normal exit.
func setDeathSignal(*syscall.SysProcAttr) {}

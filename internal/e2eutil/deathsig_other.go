//go:build unix && !linux

package e2eutil

import "syscall"

// setDeathSignal does nothing: only Linux can signal a child when its
// parent dies.
func setDeathSignal(*syscall.SysProcAttr) {}

//go:build unix && !linux

package app

import "syscall"

// setDeathSignal does nothing: only Linux can signal a child when its
// parent dies.
func setDeathSignal(*syscall.SysProcAttr) {}

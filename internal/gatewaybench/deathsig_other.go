//go:build !linux

package gatewaybench

import "syscall"

// setDeathSignal does nothing: only Linux can signal a child when its
// parent dies; stop kills the server on every normal exit.
func setDeathSignal(*syscall.SysProcAttr) {}

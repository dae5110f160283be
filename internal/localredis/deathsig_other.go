//go:build !linux

package localredis

import "syscall"

// setDeathSignal does nothing: only Linux can signal a child when its
// parent dies; Stop kills the server on every normal exit.
func setDeathSignal(*syscall.SysProcAttr) {}

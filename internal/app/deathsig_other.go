//go:build unix && !linux

package app

import (
	"os"
	"syscall"
)

// setDeathSignal does nothing: only Linux can signal a child when its
// parent dies.
func setDeathSignal(*syscall.SysProcAttr) {}

// selfPath is the llmgate binary to run the reaper from.
func selfPath() (string, error) { return os.Executable() }

// othersInGroup cannot tell without /proc, so the reaper always waits the
// whole grace before its SIGKILL.
func othersInGroup(int) bool { return true }

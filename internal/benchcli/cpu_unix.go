//go:build unix

package benchcli

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time (user + system) this process has used.
func ProcessCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

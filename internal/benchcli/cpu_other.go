//go:build !unix

package benchcli

import "time"

// ProcessCPU is not available here: callers report no CPU figure.
func ProcessCPU() (time.Duration, bool) { return 0, false }

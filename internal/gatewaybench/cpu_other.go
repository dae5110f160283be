//go:build !unix

package gatewaybench

import "time"

// processCPU is not available here: CPU per request is left at 0.
func processCPU() (time.Duration, bool) { return 0, false }

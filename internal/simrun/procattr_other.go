//go:build !unix

package simrun

import "syscall"

// childAttr is the default: stopReplicas stops the replicas on every
// normal exit.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

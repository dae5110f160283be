//go:build !unix

package app

import "fmt"

// runLock needs Unix process groups and signals.
func (a *App) runLock(lockConfig) int {
	fmt.Fprintln(a.Stderr, "llmgate lock: not supported on this operating system (it needs Unix process groups)")
	return exitUsage
}

// lockReaper serves llmgate lock, so it is not supported either.
func (a *App) lockReaper([]string) int { return a.runLock(lockConfig{}) }

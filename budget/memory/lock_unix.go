//go:build unix

package memory

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockPath opens (creating) the lock file at path and takes an exclusive,
// non-blocking flock on it. The kernel drops the lock when the process
// exits, however it exits.
func lockPath(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("budget/memory: open lock file %s: %w", path, err)
	}
	for range 100 { // EINTR retries, bounded
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked by another process (or another Backend in this one); only one may use the state file", ErrInUse, path)
		}
		return nil, fmt.Errorf("budget/memory: lock %s: %w", path, err)
	}
	return f, nil
}

// unlockFile releases the lock taken by lockPath.
func unlockFile(f *os.File) {
	if f == nil {
		return
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	_ = f.Close()
}

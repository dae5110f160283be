//go:build !unix

package memory

import (
	"fmt"
	"os"
)

// lockPath opens (creating) the lock file at path. Outside Unix it takes no
// lock: keeping the state file to one process is up to the operator.
func lockPath(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("budget/memory: open lock file %s: %w", path, err)
	}
	return f, nil
}

// unlockFile closes the file opened by lockPath.
func unlockFile(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}

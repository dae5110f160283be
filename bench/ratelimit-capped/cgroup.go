package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// maxShares is cpu.shares's largest value: a group with it gets its
// quota however many other processes want the CPU.
const maxShares = 262144

// errNoCgroup explains what capping needs.
var errNoCgroup = errors.New("capping needs a writable cgroup v1 cpu controller (Linux, as root); --cpu 0 runs uncapped")

// cgroup is a cgroup v1 cpu cgroup this command made.
type cgroup struct{ dir string }

// checkCgroups reports whether root is a cgroup v1 cpu controller this
// process may make cgroups in.
func checkCgroups(root string) error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("%w: this is %s", errNoCgroup, runtime.GOOS)
	}
	if _, err := os.Stat(filepath.Join(root, "cpu.cfs_quota_us")); err != nil {
		return fmt.Errorf("%w: %s has no cpu.cfs_quota_us (cgroup v2 is not supported)", errNoCgroup, root)
	}
	probe, err := os.MkdirTemp(root, "llmgate-capped-probe-")
	if err != nil {
		return fmt.Errorf("%w: %w", errNoCgroup, err)
	}
	return os.Remove(probe)
}

// newCgroup makes a cgroup under root with the highest weight and, if
// quota > 0, at most quota of CPU time every period.
func newCgroup(root, name string, quota, period time.Duration) (*cgroup, error) {
	g := &cgroup{dir: filepath.Join(root, name)}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, err
	}
	err := writeFile(filepath.Join(g.dir, "cpu.shares"), maxShares)
	if err == nil && quota > 0 {
		err = writeFile(filepath.Join(g.dir, "cpu.cfs_period_us"), period.Microseconds())
		if err == nil {
			err = writeFile(filepath.Join(g.dir, "cpu.cfs_quota_us"), quota.Microseconds())
		}
	}
	if err != nil {
		return nil, errors.Join(err, g.remove())
	}
	return g, nil
}

// add moves process pid, every thread of it, into g.
func (g *cgroup) add(pid int) error {
	return writeFile(filepath.Join(g.dir, "cgroup.procs"), pid)
}

// remove removes g. The kernel refuses while a process is in it; a killed
// server leaves it once its exit is reaped, which Stop waits for.
func (g *cgroup) remove() error {
	if err := os.Remove(g.dir); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("cannot remove cgroup %s: %w", g.dir, err)
	}
	return nil
}

// ownCgroup returns the directory of this process's cgroup under root
// (the cpu controller's line of /proc/self/cgroup).
func ownCgroup(root string) (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && hasController(parts[1], "cpu") {
			return filepath.Join(root, parts[2]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%w: /proc/self/cgroup names no cpu controller", errNoCgroup)
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

func writeFile[T int | int64](path string, v T) error {
	return os.WriteFile(path, []byte(strconv.FormatInt(int64(v), 10)), 0o644)
}

package e2eutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// bin is the llmgate binary Build made.
var bin string

// Build compiles cmd/llmgate into a temporary directory (with -race when
// this test binary has it), for Launch and the replicas to run, and
// returns its path and the function that removes it. Call it from
// TestMain, before the tests run.
func Build() (path string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "llmgate-e2e-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	path = filepath.Join(dir, "llmgate")
	args := []string{"build", "-o", path}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/llmgate/llmgate/cmd/llmgate")
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	if out, err := exec.Command(goBin, args...).CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	bin = path
	return path, cleanup, nil
}

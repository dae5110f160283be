//go:build unix

package e2etopo

import (
	"fmt"
	"os"
	"testing"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	_, cleanup, err := e2eutil.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	return testutil.Main(m)
}

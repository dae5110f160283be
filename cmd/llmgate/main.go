// Command llmgate is the llmgate command line: the OpenAI-compatible gateway (serve), a distributed flock for scripts and cron jobs (lock), benchmarks (bench), a simulated provider (mock) and a configuration check (check-config).
//
// main stays thin on purpose: it installs no signal handling of its own,
// because each subcommand needs its own (llmgate lock forwards SIGINT and
// SIGTERM to the command it runs instead of stopping). See internal/app.
package main

import (
	"os"

	"github.com/llmgate/llmgate/internal/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

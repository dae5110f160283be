// Package app wires configuration, stores and servers into the llmgate commands.
package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/llmgate/llmgate/internal/gatewaybench"
	"github.com/llmgate/llmgate/internal/lockbench"
	"github.com/llmgate/llmgate/internal/ratebench"
)

// Exit statuses shared by the subcommands. A command that runs a child
// (llmgate lock) otherwise exits with the child's status.
const (
	exitOK       = 0
	exitUsage    = 2  // bad flags or arguments, unusable --store
	exitTempFail = 75 // EX_TEMPFAIL: lock not obtained, or lost; try again later
	exitNoExec   = 126
	exitNotFound = 127
)

const usageText = `llmgate coordinates processes that call LLM APIs: distributed locks, rate
limits and budgets shared through one store.

Usage:
  llmgate <command> [arguments]

Commands:
  serve         run the OpenAI-compatible gateway
  check-config  validate a gateway configuration file and explain it
  lock          run a command while holding a distributed lock (flock across machines)
  bench         measure the coordination store and the gateway ('llmgate bench --help')
  mock          run the built-in simulated OpenAI-compatible provider
  sim           run the "many nodes, one quota" experiment with and without llmgate
  version       print the llmgate and Go versions
  help          show help for a command

Run 'llmgate help <command>' or 'llmgate <command> --help' for details.
`

const benchUsageText = `Usage:
  llmgate bench lock [flags]        measure lock throughput, hand-off latency and fairness
  llmgate bench ratelimit [flags]   measure rate-limit decisions per second, latency and accuracy
  llmgate bench gateway [flags]     measure the gateway's added latency and throughput against
                                    direct calls and a bare reverse proxy

Run 'llmgate bench <name> --help' for its flags.
`

// App is one invocation of the llmgate command line: where it reads and
// writes, and what environment it sees. Main fills it from the process.
type App struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads llmgate's own settings (LLMGATE_STORE).
	Getenv func(string) string
	// Environ is the environment handed to commands that llmgate runs.
	Environ func() []string
}

// Main runs the llmgate command line with args (without the program name)
// and returns the process exit status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &App{Stdin: stdin, Stdout: stdout, Stderr: stderr, Getenv: os.Getenv, Environ: os.Environ}
	return a.Run(args)
}

// Run dispatches args to a subcommand and returns the exit status. Nil
// fields are taken from the process (os.Stdin, os.Getenv, ...).
func (a *App) Run(args []string) int {
	if a.Stdin == nil {
		a.Stdin = os.Stdin
	}
	if a.Stdout == nil {
		a.Stdout = os.Stdout
	}
	if a.Stderr == nil {
		a.Stderr = os.Stderr
	}
	if a.Getenv == nil {
		a.Getenv = os.Getenv
	}
	if a.Environ == nil {
		a.Environ = os.Environ
	}
	if len(args) == 0 {
		fmt.Fprint(a.Stderr, usageText)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "-help", "--help":
		return a.help(rest)
	case "version", "-version", "--version":
		return a.version(rest)
	case "lock":
		return a.lock(rest)
	case reaperCommand:
		return a.lockReaper(rest)
	case "bench":
		return a.bench(rest)
	case "mock":
		return a.mock(rest)
	case "sim":
		return a.sim(rest)
	case "serve":
		return a.serve(rest)
	case "check-config":
		return a.checkConfig(rest)
	default:
		fmt.Fprintf(a.Stderr, "llmgate: unknown command %q; run 'llmgate help' for the list\n", cmd)
		return exitUsage
	}
}

func (a *App) help(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(a.Stdout, usageText)
		return exitOK
	}
	switch args[0] {
	case "lock":
		fmt.Fprint(a.Stdout, lockUsageText)
	case "bench":
		fmt.Fprint(a.Stdout, benchUsageText)
	case "mock":
		fmt.Fprint(a.Stdout, mockUsageText)
	case "sim":
		fmt.Fprint(a.Stdout, simUsageText)
	case "version":
		fmt.Fprintln(a.Stdout, "Usage: llmgate version\n\nPrints the llmgate module version, VCS revision when known, and the Go version it was built with.")
	case "serve":
		fmt.Fprint(a.Stdout, serveUsageText)
	case "check-config":
		fmt.Fprint(a.Stdout, checkConfigUsageText)
	case "help":
		fmt.Fprint(a.Stdout, usageText)
	default:
		fmt.Fprintf(a.Stderr, "llmgate help: unknown command %q; run 'llmgate help' for the list\n", args[0])
		return exitUsage
	}
	return exitOK
}

func (a *App) version(args []string) int {
	if len(args) > 0 {
		fmt.Fprintf(a.Stderr, "llmgate version: takes no arguments, got %q\n", args[0])
		return exitUsage
	}
	fmt.Fprintln(a.Stdout, versionString())
	return exitOK
}

// versionString is "llmgate VERSION[ (REV[, modified])] GOVERSION GOOS/GOARCH".
func versionString() string {
	v, rev, modified := "(unknown)", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		if v == "" {
			v = "(devel)"
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if modified {
			rev += ", modified"
		}
		v += " (" + rev + ")"
	}
	return fmt.Sprintf("llmgate %s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func (a *App) bench(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(a.Stderr, benchUsageText)
		return exitUsage
	}
	var run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(a.Stdout, benchUsageText)
		return exitOK
	case "lock":
		run = lockbench.Main
	case "ratelimit":
		run = ratebench.Main
	case "gateway":
		run = func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
			return gatewaybench.Main(ctx, args, stdout, stderr, a.benchGatewayFactory)
		}
	default:
		fmt.Fprintf(a.Stderr, "llmgate bench: unknown benchmark %q; run 'llmgate bench --help' for the list\n", args[0])
		return exitUsage
	}
	// A benchmark has no child to forward signals to: the first SIGINT or
	// SIGTERM cancels it, and it reports what it measured so far.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, args[1:], a.Stdout, a.Stderr)
}

package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/llmgate/llmgate/internal/scenario"
	"github.com/llmgate/llmgate/internal/simrun"
)

const simUsageText = `Usage:
  llmgate sim [SCENARIO|FILE] [flags]
  llmgate sim --list
  llmgate sim --show SCENARIO

Runs the "many nodes, one quota" experiment on this machine: a simulated
provider with a real quota and latency, the same client workload twice,
straight to the provider and through N llmgate replicas (separate
processes; for N > 1 on a Redis store), and prints what each arm measured.
SCENARIO is a built-in (see --list; default burst), FILE a scenario in
YAML (start from 'llmgate sim --show burst > my.yaml'). See docs/sim.md.

Flags:
  --replicas N     gateway replicas (default: the scenario's)
  --store URL      Redis for N > 1 (default: start redis-server on a free
                   loopback port)
  --duration D     bound each arm to D, at most 60s (default: the scenario's)
  --seed S         seed of the workload (default: the scenario's)
  --report FILE    also write a self-contained HTML report with charts
  --json           print the result as JSON instead of a table
  --list           list the built-in scenarios
  --show NAME      print a built-in scenario's YAML
`

// simArgs is the parsed command line of llmgate sim.
type simArgs struct {
	target   string
	replicas int
	store    string
	duration time.Duration
	seed     uint64
	report   string
	json     bool
	list     bool
	show     string
}

func parseSimArgs(args []string) (simArgs, error) {
	var c simArgs
	fs := flag.NewFlagSet("llmgate sim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.IntVar(&c.replicas, "replicas", 0, "")
	fs.StringVar(&c.store, "store", "", "")
	fs.Var(durationFlag{&c.duration}, "duration", "")
	fs.Uint64Var(&c.seed, "seed", 0, "")
	fs.StringVar(&c.report, "report", "", "")
	fs.BoolVar(&c.json, "json", false, "")
	fs.BoolVar(&c.list, "list", false, "")
	fs.StringVar(&c.show, "show", "", "")
	// Flags may come before and after the scenario.
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return c, errHelp
			}
			return c, fmt.Errorf("%s; see 'llmgate sim --help'", twoDashes(err.Error()))
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if c.target != "" {
			return c, fmt.Errorf("unexpected argument %q; llmgate sim runs one scenario", args[0])
		}
		c.target, args = args[0], args[1:]
	}
	switch {
	case c.replicas < 0 || c.replicas > scenario.MaxReplicas:
		return c, fmt.Errorf("--replicas is %d; use 1 to %d", c.replicas, scenario.MaxReplicas)
	case c.duration < 0 || c.duration > scenario.MaxDuration:
		return c, fmt.Errorf("--duration is %v; use a duration up to %v", c.duration, scenario.MaxDuration)
	case c.list && (c.show != "" || c.target != ""):
		return c, errors.New("--list takes no scenario")
	}
	if c.target == "" {
		c.target = "burst"
	}
	return c, nil
}

// loadScenario reads target as a file when it names one (or looks like a
// path), else as a built-in.
func loadScenario(target string) (*scenario.Scenario, error) {
	looksLikeFile := strings.ContainsRune(target, filepath.Separator) || strings.HasSuffix(target, ".yaml") || strings.HasSuffix(target, ".yml")
	if st, err := os.Stat(target); err == nil && !st.IsDir() {
		looksLikeFile = true
	}
	if !looksLikeFile {
		return scenario.Load(target)
	}
	f, err := os.Open(target)
	if err != nil {
		return nil, fmt.Errorf("scenario file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, scenario.MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("scenario file %s: %w", target, err)
	}
	return scenario.Parse(target, data)
}

func (a *App) sim(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return a.runSim(ctx, args)
}

func (a *App) runSim(ctx context.Context, args []string) int {
	c, err := parseSimArgs(args)
	if errors.Is(err, errHelp) {
		fmt.Fprint(a.Stdout, simUsageText)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate sim: %v\n", err)
		return exitUsage
	}
	if c.list {
		for _, b := range scenario.List() {
			fmt.Fprintf(a.Stdout, "%-14s %s\n", b.Name, b.Description)
		}
		return exitOK
	}
	if c.show != "" {
		src, err := scenario.Source(c.show)
		if err != nil {
			fmt.Fprintf(a.Stderr, "llmgate sim: %v\n", err)
			return exitUsage
		}
		_, _ = a.Stdout.Write(src)
		return exitOK
	}
	sc, err := loadScenario(c.target)
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate sim: %v\n", err)
		return exitUsage
	}
	bin, err := os.Executable()
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate sim: cannot find the llmgate binary to start the replicas: %v\n", err)
		return exitFailure
	}
	res, err := simrun.Run(ctx, sc, simrun.Options{
		Binary: bin, Replicas: c.replicas, Store: c.store, Duration: c.duration, Seed: c.seed,
		Environ: a.Environ(), Progress: a.Stderr, Live: isTerminal(a.Stderr),
	})
	if err != nil && res == nil {
		fmt.Fprintf(a.Stderr, "llmgate sim: %v\n", err)
		return exitFailure
	}
	if c.report != "" {
		if werr := writeReport(c.report, res); werr != nil {
			fmt.Fprintf(a.Stderr, "llmgate sim: %v\n", werr)
			return exitFailure
		}
		fmt.Fprintf(a.Stderr, "llmgate sim: report written to %s\n", c.report)
	}
	if c.json {
		_ = res.WriteJSON(a.Stdout)
	} else {
		_ = res.WriteTable(a.Stdout)
	}
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate sim: stopped early: %v\n", err)
		return exitFailure
	}
	return exitOK
}

func writeReport(path string, res *simrun.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := simrun.WriteReport(f, res); err != nil {
		f.Close()
		return fmt.Errorf("report %s: %w", path, err)
	}
	return f.Close()
}

// isTerminal reports whether w is a character device (a terminal), where a
// progress line can be redrawn.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

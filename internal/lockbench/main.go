package lockbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmgate/llmgate/internal/benchcli"
	"github.com/llmgate/llmgate/internal/storeurl"
)

// Exit codes of Main.
const (
	ExitOK         = benchcli.ExitOK
	ExitFail       = benchcli.ExitFail // the run failed, or saw violations
	ExitUsage      = benchcli.ExitUsage
	usageSynopsis  = "usage: llmgate bench lock --store URL [--algo NAME] [--workers N] [--duration D] [--fair] [--cs D] [--keys N] [--ttl D] [--json]"
	defaultAlgoArg = "llmgate"
)

// Main runs `llmgate bench lock`; args are those after "lock". It prints
// one JSON object with --json, a table otherwise, and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return MainWith(ctx, args, stdout, stderr)
}

// MainWith is Main with more algorithms selectable by --algo besides the
// built-in ones (bench/peers passes other libraries' locks).
func MainWith(ctx context.Context, args []string, stdout, stderr io.Writer, extra ...Algo) int {
	algos := append(Builtin(), extra...)
	c := benchcli.New("llmgate bench lock", usageSynopsis,
		"Measures a distributed lock: critical sections/s, hand-off latency, waits, fairness, overlaps.", stdout, stderr)
	c.More = func(w io.Writer) {
		fmt.Fprintln(w, "\nalgorithms:")
		for _, a := range algos {
			fmt.Fprintf(w, "  %-12s %s\n", a.Name, a.Summary)
		}
	}
	fs := c.Flags
	var (
		cfg      = Config{}
		algoName string
	)
	fs.StringVar(&cfg.Store, "store", "", "store URL: redis://[user:password@]host:port[/db], or memory (llmgate only)")
	fs.StringVar(&algoName, "algo", defaultAlgoArg, "lock algorithm: "+algoNames(algos))
	fs.IntVar(&cfg.Workers, "workers", DefaultWorkers, "concurrent workers, each with its own store client")
	fs.DurationVar(&cfg.Duration, "duration", DefaultDuration, "how long to run")
	fs.Int64Var(&cfg.MaxOps, "max-ops", DefaultMaxOps, "stop after this many acquisitions in all")
	fs.BoolVar(&cfg.Fair, "fair", false, "FIFO fairness across all waiters (algorithms that have it)")
	fs.DurationVar(&cfg.CS, "cs", 0, "busy-wait this long inside each critical section (0, 100us, ...)")
	fs.IntVar(&cfg.Keys, "keys", 1, "number of keys; worker w uses key w%keys (keys = workers: uncontended)")
	fs.DurationVar(&cfg.TTL, "ttl", DefaultTTL, "lease TTL")
	fs.BoolVar(&cfg.SharedClient, "shared-client", false, "all workers share one store client")
	fs.IntVar(&cfg.Pings, "ping", DefaultPings, "PINGs timed before and after the run (0: none)")
	fs.IntVar(&cfg.PingEvery, "ping-every", 0, "worker 0 also times a PING after every `N`th cycle (0: never)")
	fs.BoolVar(&cfg.Warmup, "warmup", true, "each worker takes and releases a key of its own once before the clock starts (connects, subscribes); false: count a cold start")
	jsonOut, cpuProfile := c.JSON(), c.CPUProfile()

	if code, ok := c.Parse(args); !ok {
		return code
	}
	if cfg.Store == "" {
		return c.Bad("--store is required, e.g. --store redis://127.0.0.1:6379")
	}
	if !storeurl.IsMemory(cfg.Store) {
		if _, err := storeurl.RedisOption(cfg.Store); err != nil {
			return c.Bad("%v", err)
		}
	}
	found := false
	for _, a := range algos {
		if a.Name == algoName {
			cfg.Algo, found = a, true
		}
	}
	if !found {
		return c.Bad("unknown --algo %q; choose one of %s", algoName, algoNames(algos))
	}
	if err := cfg.Validate(); err != nil {
		return c.Bad("%s", strings.TrimPrefix(err.Error(), ErrConfig.Error()+": "))
	}

	stop, err := benchcli.StartCPUProfile(*cpuProfile)
	if err != nil {
		return c.Fail(err)
	}
	defer stop()

	res, err := Run(ctx, cfg)
	if err != nil {
		return c.Fail(err)
	}
	if *jsonOut {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return c.Fail(err)
		}
	} else {
		printTable(stdout, res)
	}
	if res.Interrupted {
		fmt.Fprintln(stderr, "llmgate bench lock: interrupted; the figures cover the time until then")
	}
	if res.Violations > 0 {
		fmt.Fprintf(stderr, "llmgate bench lock: FAIL: %d acquisitions overlapped another holder's critical section\n", res.Violations)
		return ExitFail
	}
	return ExitOK
}

func algoNames(algos []Algo) string {
	names := make([]string, len(algos))
	for i, a := range algos {
		names[i] = a.Name
	}
	return strings.Join(names, ", ")
}

func printTable(w io.Writer, r *Result) {
	fmt.Fprintf(w, "algo %s on %s: %d workers, %d key(s), fair=%v, cs=%v, ttl=%gs, %.2fs\n",
		r.Algo, r.Store, r.Workers, r.Keys, r.Fair, time.Duration(r.CSUs*1000), r.TTLS, r.DurationS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	pings := func(x, unit float64) string {
		if unit <= 0 || x <= 0 {
			return ""
		}
		return fmt.Sprintf("(%.2f PINGs)", x/unit)
	}
	fmt.Fprintf(tw, "critical sections/s\t%.0f\t(%d in all; %.1fus per cycle per worker)\n", r.OpsPerSec, r.Acquisitions, r.CycleUs)
	if r.PingDuringP50Us > 0 {
		fmt.Fprintf(tw, "PING p50\t%.1fus\t(before %.1f, after %.1f; in the loop %.1f)\n", r.PingP50Us, r.PingBeforeP50Us, r.PingAfterP50Us, r.PingDuringP50Us)
	} else {
		fmt.Fprintf(tw, "PING p50\t%.1fus\t(before %.1f, after %.1f)\n", r.PingP50Us, r.PingBeforeP50Us, r.PingAfterP50Us)
	}
	if r.Keys == r.Workers {
		// Uncontended: Lock + release is the cost of one pair.
		fmt.Fprintf(tw, "acquire+release p50\t%.1fus\t%s\n", r.PairP50Us, pings(r.PairP50Us, unitOf(r)))
	}
	fmt.Fprintf(tw, "hand-off p50 / p99\t%.1f / %.1fus\t%s (%d hand-offs)\n", r.HandoffP50Us, r.HandoffP99Us, pings(r.HandoffP50Us, r.PingP50Us), r.Handoffs)
	fmt.Fprintf(tw, "wait p50 / p99 / max\t%.1f / %.1f / %.1fus\t\n", r.WaitP50Us, r.WaitP99Us, r.WaitMaxUs)
	fmt.Fprintf(tw, "release p50 / p99\t%.1f / %.1fus\t\n", r.ReleaseP50Us, r.ReleaseP99Us)
	fmt.Fprintf(tw, "Jain fairness\t%.4f\t(per worker %d..%d)\n", r.Jain, r.PerWorkerMin, r.PerWorkerMax)
	fmt.Fprintf(tw, "self-reacquire\t%.1f%%\t\n", r.SelfReacqPct)
	fmt.Fprintf(tw, "violations\t%d\t\n", r.Violations)
	fmt.Fprintf(tw, "errors (lock / release)\t%d / %d\t%s\n", r.LockErrors, r.ReleaseErrors, r.FirstError)
	tw.Flush()
}

// unitOf is the PING that pair_pings is measured against.
func unitOf(r *Result) float64 {
	if r.PingDuringP50Us > 0 {
		return r.PingDuringP50Us
	}
	return r.PingP50Us
}

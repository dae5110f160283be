package ratebench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/llmgate/llmgate/internal/benchcli"
	"github.com/llmgate/llmgate/internal/storeurl"
)

// Exit codes of Main.
const (
	ExitOK    = benchcli.ExitOK
	ExitFail  = benchcli.ExitFail // the run failed, or an accuracy run admitted more than the ideal
	ExitUsage = benchcli.ExitUsage
)

const usageSynopsis = "usage: llmgate bench ratelimit --store URL [--workers N] [--duration D] [--limits 1|2|3] [--settle] [--local] [--json]\n" +
	"       llmgate bench ratelimit --store CLUSTER_URL --single URL [--deployments N] [--tenants N] [--tenant-limits PCT] [--single-sharded] [--reps N] [--workers N] [--duration D] [--limits 1|2|3] [--settle] [--local] [--json]\n" +
	"       llmgate bench ratelimit --store URL --accuracy [--procs N] [--workers N] [--rate R] [--burst B] [--duration D] [--algo llmgate|gcra] [--wait] [--local] [--json]"

// hidden flags are left out of the usage text: they are how Main talks to
// the worker processes it starts itself.
var hidden = map[string]bool{childFlag: true, "key": true}

// Main runs `llmgate bench ratelimit`; args are those after "ratelimit". It
// prints one JSON object with --json, a table otherwise, and returns the
// exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := benchcli.New("llmgate bench ratelimit", usageSynopsis,
		"Measures the rate limiter: decisions/s and latency over a request's limits against a GCRA\n"+
			"baseline in the same run; (--single) a Redis Cluster against one master, the limits spread over\n"+
			"many deployments' groups, with each master's CPU per decision; or (--accuracy) how close\n"+
			"processes sharing one limit get to the ideal.", stdout, stderr)
	c.Hidden = hidden
	fs := c.Flags
	var (
		cfg      = Config{}
		acc      = AccuracyConfig{}
		shards   = ShardConfig{}
		accuracy bool
		child    bool
		key      string
	)
	fs.StringVar(&cfg.Store, "store", "", "store URL: redis://[user:password@]host:port[/db]")
	fs.IntVar(&cfg.Workers, "workers", DefaultWorkers, "concurrent workers, each with its own client (with --accuracy: per process, default 1)")
	fs.DurationVar(&cfg.Duration, "duration", DefaultDuration, "how long to run (each algorithm)")
	fs.IntVar(&cfg.Limits, "limits", DefaultLimits, "limits per decision: 1 deployment RPM, 2 + deployment TPM, 3 + tenant RPM")
	fs.BoolVar(&cfg.Settle, "settle", false, "also Settle every admitted request (a request's whole store traffic)")
	fs.BoolVar(&cfg.Baseline, "baseline", true, "also measure the GCRA baseline (redis_rate's algorithm, one limit) in the same run")
	fs.BoolVar(&cfg.SharedClient, "shared-client", false, "all workers share one client (one gateway replica) instead of one each")
	fs.BoolVar(&cfg.Local, "local", false, "llmgate with a local quota (ratelimit.WithLocalQuota): the workers share one Limiter, as in one gateway replica; with --accuracy, one per process")
	fs.IntVar(&cfg.Pings, "ping", DefaultPings, "PINGs timed before and after the run (0: none)")
	fs.Int64Var(&cfg.MaxOps, "max-ops", DefaultMaxOps, "stop after this many decisions per algorithm")
	fs.DurationVar(&cfg.Hold, "hold", 0, "reservation hold (default ratelimit.DefaultHold)")
	fs.StringVar(&shards.Single, "single", "", "compare --store, a Redis Cluster, with this one master: the same requests on each in turn")
	fs.IntVar(&shards.Deployments, "deployments", DefaultDeployments, "with --single: deployments the requests go to in turn, each a group of its own")
	fs.IntVar(&shards.Tenants, "tenants", DefaultTenants, "with --single and --limits 3: tenants the requests come from in turn, each a group of its own")
	fs.IntVar(&shards.TenantLimitsPct, "tenant-limits", DefaultTenantLimitsPct, "with --single and --limits 3: percentage of the tenants with a limit of their own; the others' requests charge their deployment's limits only")
	fs.BoolVar(&shards.SingleSharded, "single-sharded", false, "with --single: a group per deployment and per tenant on the one master too, as on the Cluster (default: one group, as the gateway on one master)")
	fs.IntVar(&shards.Reps, "reps", DefaultReps, "with --single: repetitions, each store once per repetition, alternately")
	fs.BoolVar(&accuracy, "accuracy", false, "accuracy mode: several processes share one limit; prints admitted, ideal, over")
	fs.IntVar(&acc.Procs, "procs", 4, "with --accuracy: worker processes")
	fs.Int64Var(&acc.Rate, "rate", 1000, "with --accuracy: the limit, per second")
	fs.Int64Var(&acc.Burst, "burst", 0, "with --accuracy: the bucket size (0: the rate, one second's worth)")
	fs.StringVar(&acc.Algo, "algo", AlgoLlmgate, "with --accuracy: "+AlgoLlmgate+" or "+AlgoGCRA)
	fs.BoolVar(&acc.Wait, "wait", false, "with --accuracy: Wait in the queue instead of Allow (llmgate)")
	jsonOut, cpuProfile := c.JSON(), c.CPUProfile()
	fs.BoolVar(&child, childFlag, false, "run as a worker process of an accuracy run")
	fs.StringVar(&key, "key", "", "the limit's key, for a worker process")

	if code, ok := c.Parse(args); !ok {
		return code
	}
	if cfg.Store == "" {
		return c.Bad("--store is required, e.g. --store redis://127.0.0.1:6379")
	}
	if _, err := storeurl.RedisOption(cfg.Store); err != nil {
		return c.Bad("%s", strings.TrimPrefix(err.Error(), "storeurl: "))
	}
	set := c.Given()
	acc.Store, acc.Duration, acc.Workers, acc.Local = cfg.Store, cfg.Duration, cfg.Workers, cfg.Local
	if (accuracy || child) && !set["workers"] {
		acc.Workers = 1
	}

	if child {
		if err := runChild(ctx, acc, key, os.Stdin, stdout); err != nil {
			fmt.Fprintf(stderr, "llmgate bench ratelimit (worker): %v\n", err)
			return ExitFail
		}
		return ExitOK
	}
	if !set["single"] {
		for _, f := range []string{"deployments", "tenants", "tenant-limits", "single-sharded", "reps"} {
			if set[f] {
				return c.Bad("--%s applies to --single only", f)
			}
		}
	} else {
		for _, f := range []string{"baseline", "ping"} {
			if set[f] {
				return c.Bad("--%s does not apply to --single", f)
			}
		}
	}
	if accuracy {
		for _, f := range []string{"limits", "settle", "shared-client", "max-ops", "hold", "ping", "single"} {
			if set[f] {
				return c.Bad("--%s does not apply to --accuracy", f)
			}
		}
		if err := acc.Validate(); err != nil {
			return c.Bad("%s", strings.TrimPrefix(err.Error(), ErrConfig.Error()+": "))
		}
	} else {
		for _, f := range []string{"procs", "rate", "burst", "algo", "wait"} {
			if set[f] {
				return c.Bad("--%s applies to --accuracy only", f)
			}
		}
		shards.Config = cfg
		if err := cfg.Validate(); err != nil {
			return c.Bad("%s", strings.TrimPrefix(err.Error(), ErrConfig.Error()+": "))
		}
		if set["single"] {
			if err := shards.Validate(); err != nil {
				return c.Bad("%s", strings.TrimPrefix(err.Error(), ErrConfig.Error()+": "))
			}
		}
	}

	stop, err := benchcli.StartCPUProfile(*cpuProfile)
	if err != nil {
		return c.Fail(err)
	}
	defer stop()

	var out any
	code := ExitOK
	if accuracy {
		res, err := Accuracy(ctx, acc, stderr)
		if err != nil {
			return c.Fail(err)
		}
		out = res
		if res.Over > 0 {
			fmt.Fprintf(stderr, "llmgate bench ratelimit: FAIL: %d admissions above the ideal %.2f\n", res.Over, res.Ideal)
			code = ExitFail
		}
		if !*jsonOut {
			printAccuracy(stdout, res)
		}
	} else if set["single"] {
		res, err := RunShards(ctx, shards)
		if err != nil {
			return c.Fail(err)
		}
		out = res
		if res.Interrupted {
			fmt.Fprintln(stderr, "llmgate bench ratelimit: interrupted; the figures cover the repetitions until then")
		}
		if !*jsonOut {
			printShards(stdout, res)
		}
	} else {
		res, err := Run(ctx, cfg)
		if err != nil {
			return c.Fail(err)
		}
		out = res
		if res.Interrupted {
			fmt.Fprintln(stderr, "llmgate bench ratelimit: interrupted; the figures cover the time until then")
		}
		if !*jsonOut {
			printResult(stdout, res)
		}
	}
	if *jsonOut {
		if err := json.NewEncoder(stdout).Encode(out); err != nil {
			return c.Fail(err)
		}
	}
	return code
}

func printResult(w io.Writer, r *Result) {
	fmt.Fprintf(w, "rate limiter on %s: %d workers (shared client %v), %d limits per decision, settle %v, local quota %v, %.2fs\n",
		r.Store, r.Workers, r.SharedClient, r.Limits, r.Settle, r.Local, r.DurationS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(p *Phase) {
		fmt.Fprintf(tw, "%s (%d limits)\t%.0f decisions/s\tp50 %.1fus\tp99 %.1fus\t%.2f round trips\t%.1f cmds, %.1fus in the server\t(%d admitted, %d denied, %d errors)\n",
			p.Algo, p.Limits, p.DecisionsPerSec, p.P50Us, p.P99Us, p.RoundTripsPerDecision, p.ServerCommandsPerDecision, p.ServerUsPerDecision, p.Admitted, p.Denied, p.Errors)
	}
	row(&r.Phase)
	if r.Baseline != nil {
		row(r.Baseline)
	}
	fmt.Fprintf(tw, "PING p50\t%.1fus\t\n", r.PingP50Us)
	if r.Baseline != nil {
		fmt.Fprintf(tw, "ratio\t%.3f\t(llmgate with %d limits / GCRA with 1)\n", r.RatioVsBaseline, r.Limits)
	}
	tw.Flush()
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
}

func printAccuracy(w io.Writer, r *AccuracyResult) {
	mode := "Allow"
	if r.Wait {
		mode = "Wait"
	}
	if r.Local {
		mode += ", local quota"
	}
	fmt.Fprintf(w, "accuracy of %s (%s) on %s: %d processes x %d workers, %d/s, burst %d, %.2fs\n",
		r.Algo, mode, r.Store, r.Procs, r.Workers, r.Rate, r.Burst, r.DurationS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "admitted\t%d\t(per process %v)\n", r.Admitted, r.PerProcess)
	fmt.Fprintf(tw, "ideal\t%.2f\t(burst + rate x duration)\n", r.Ideal)
	fmt.Fprintf(tw, "accuracy\t%.2f%%\t\n", r.AccuracyPct)
	if r.Owed > 0 {
		fmt.Fprintf(tw, "owed\t%.2f\t(handed out by the last refusal; admitted %.2f%% of it)\n", r.Owed, r.OwedPct)
	}
	fmt.Fprintf(tw, "over\t%d\t\n", r.Over)
	fmt.Fprintf(tw, "attempts / errors\t%d / %d\t%s\n", r.Attempts, r.Errors, r.FirstError)
	tw.Flush()
}

func printShards(w io.Writer, r *ShardResult) {
	fmt.Fprintf(w, "rate limiter on a Cluster of %d masters (%s) against one master (%s): %d workers (shared client %v), %d deployments, %d tenants (%d with limits), %d limits per decision, one master's limits in %s, settle %v, local quota %v, %.2fs a phase\n",
		r.Masters, r.Cluster, r.Single, r.Workers, r.SharedClient, r.Deployments, r.Tenants, r.TenantLimits, r.Limits, layout(r.SingleSharded), r.Settle, r.Local, r.DurationS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "rep\tone master decisions/s\tCluster decisions/s\tratio\tone master: CPU us/decision\tCluster: CPU us/decision per master\tcapacity ratio\tbusiest master's share\tbusiest master's CPU: one master / Cluster\tclient CPU: one master / Cluster\t\n")
	for i, rep := range r.Reps {
		perMaster := ""
		for j, m := range rep.Cluster.Masters {
			if j > 0 {
				perMaster += " / "
			}
			perMaster += fmt.Sprintf("%.1f", cpuPerDecision(m, rep.Cluster))
		}
		single := 0.0
		if len(rep.Single.Masters) > 0 {
			single = cpuPerDecision(rep.Single.Masters[0], rep.Single)
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.3f\t%.1f\t%s\t%.3f\t%.3f\t%s / %s\t%s / %s\t\n", i+1, rep.Single.DecisionsPerSec, rep.Cluster.DecisionsPerSec, rep.Ratio,
			single, perMaster, rep.CapacityRatio, rep.BusiestShare, busiestCPU(rep.Single), busiestCPU(rep.Cluster), cores(rep.Single.ClientCPUSec, rep.Single), cores(rep.Cluster.ClientCPUSec, rep.Cluster))
	}
	fmt.Fprintf(tw, "median\t%.0f\t%.0f\t%.3f\t\t\t%.3f\t%.3f\t\t\t\n", r.SingleDecisionsPerSec, r.ClusterDecisionsPerSec, r.Ratio, r.CapacityRatio, r.BusiestShare)
	tw.Flush()
	fmt.Fprintln(w, "capacity ratio: decisions per CPU-second of the busiest master, Cluster over one master (what a core per master would give)")
	fmt.Fprintln(w, "CPU in % of a core over the phase: the busiest master's (INFO cpu), the benchmark process's own")
}

func layout(sharded bool) string {
	if sharded {
		return "a group per deployment and tenant"
	}
	return "one group"
}

// busiestCPU is the busiest master's CPU use during ph, in % of a core.
func busiestCPU(ph Phase) string {
	if len(ph.Masters) == 0 {
		return "-"
	}
	return cores(ph.Masters[0].CPUSec, ph)
}

// cores formats sec of CPU time over ph's duration in % of a core.
func cores(sec float64, ph Phase) string {
	if ph.DurationS <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*sec/ph.DurationS)
}

// cpuPerDecision is m's CPU time per decision of ph, in µs.
func cpuPerDecision(m MasterLoad, ph Phase) float64 {
	if ph.Decisions == 0 {
		return 0
	}
	return m.CPUSec * 1e6 / float64(ph.Decisions)
}

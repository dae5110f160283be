// Command ratelimit-capped runs `llmgate bench ratelimit --single` against throw-away servers on loopback, one master and a 3+3 Redis Cluster, each redis-server capped at the same share of a core, so that the masters and not the benchmark limit the rate.
//
// Each server runs in a cgroup of its own (cgroup v1 cpu controller:
// Linux, and root or a delegated hierarchy) with a CFS quota of --cpu
// percent of one core. The benchmark gets no quota but the highest weight,
// so other work on the machine does not starve it. On a machine with fewer
// cores than masters this emulates a core per master: every master is
// saturated at the same small share, and the Cluster's rate over the one
// master's is what three cores would give over one.
//
//	go run ./bench/ratelimit-capped --cpu 15 -- --deployments 256 --tenants 64 \
//	    --workers 64 --shared-client --duration 3s --reps 5
//
// The arguments after -- go to `llmgate bench ratelimit`, which gets
// --store and --single from here. The one master has a replica, as each of
// the Cluster's masters has; replicas are capped the same. Servers and
// cgroups are removed on exit, Ctrl-C included (not after kill -9).
package main

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

	"github.com/llmgate/llmgate/internal/ratebench"
	"github.com/llmgate/llmgate/internal/testutil"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the command's flags.
type options struct {
	cpuPct     float64       // each server's share of a core, in percent; 0 caps nothing
	period     time.Duration // the CFS quota's period
	cgroupRoot string        // the cgroup v1 cpu controller's directory
	bench      []string      // arguments for `llmgate bench ratelimit`
	// ready, if set, is called once every server runs, before the
	// benchmark (for tests).
	ready func(*topology)
}

func parse(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("ratelimit-capped", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.Float64Var(&o.cpuPct, "cpu", 15, "each redis-server's share of one core, in percent (0: not capped)")
	fs.DurationVar(&o.period, "period", 100*time.Millisecond, "the period of the CPU quota")
	fs.StringVar(&o.cgroupRoot, "cgroup", "/sys/fs/cgroup/cpu", "the cgroup v1 cpu controller's directory")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ratelimit-capped [--cpu PERCENT] [--period D] [--cgroup DIR] [-- BENCH_RATELIMIT_ARGS...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.bench = fs.Args()
	switch {
	case o.cpuPct < 0 || o.cpuPct > 100:
		return o, fmt.Errorf("--cpu must be a percentage from 0 to 100, got %v", o.cpuPct)
	case o.period < time.Millisecond || o.period > time.Second:
		return o, fmt.Errorf("--period must be between 1ms and 1s, got %v", o.period)
	case o.cpuPct > 0 && o.quota() < time.Millisecond:
		return o, fmt.Errorf("--cpu %v%% of --period %v is under the kernel's smallest quota, 1ms: raise either", o.cpuPct, o.period)
	}
	for _, a := range o.bench {
		if a == "--store" || a == "--single" || strings.HasPrefix(a, "--store=") || strings.HasPrefix(a, "--single=") {
			return o, fmt.Errorf("%s is set here: the benchmark runs against the servers this command starts", a)
		}
	}
	return o, nil
}

// quota is each server's CPU time per period.
func (o options) quota() time.Duration {
	return time.Duration(float64(o.period) * o.cpuPct / 100)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return ratebench.ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit-capped: %v\n", err)
		return ratebench.ExitUsage
	}
	return runWith(ctx, o, stdout, stderr)
}

// runWith starts the servers, runs the benchmark against them and stops
// them; it returns the benchmark's exit code.
func runWith(ctx context.Context, o options, stdout, stderr io.Writer) int {
	tp, err := start(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit-capped: %v\n", err)
		return ratebench.ExitFail
	}
	defer func() {
		if err := tp.stop(); err != nil {
			fmt.Fprintf(stderr, "ratelimit-capped: %v\n", err)
		}
	}()
	if o.cpuPct > 0 {
		fmt.Fprintf(stderr, "ratelimit-capped: every redis-server capped at %v%% of a core (%v every %v)\n", o.cpuPct, o.quota(), o.period)
	}
	if o.ready != nil {
		o.ready(tp)
	}
	return ratebench.Main(ctx, append(o.bench, "--store", tp.cluster.URL(), "--single", tp.single.URL()), stdout, stderr)
}

// topology is the servers of a run and their cgroups.
type topology struct {
	dir     string
	single  *testutil.Redis
	replica *testutil.Redis // the one master's
	cluster *testutil.Cluster
	groups  []*cgroup // a server's each, then the benchmark's
	client  *cgroup   // the benchmark's, or nil
	home    string    // the benchmark's cgroup before, to go back to
}

// start starts the servers and, when capping, puts each in its cgroup and
// this process in one of full weight.
func start(ctx context.Context, o options) (_ *topology, err error) {
	if o.cpuPct > 0 {
		if err := checkCgroups(o.cgroupRoot); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "llmgate-capped-")
	if err != nil {
		return nil, err
	}
	tp := &topology{dir: dir}
	defer func() {
		if err != nil {
			err = errors.Join(err, tp.stop())
		}
	}()
	for _, d := range []string{"single", "replica"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return tp, err
		}
	}
	if tp.single, err = testutil.NewRedisArgs(filepath.Join(dir, "single"), "--repl-diskless-sync-delay", "0"); err != nil {
		return tp, err
	}
	if tp.replica, err = testutil.NewRedisArgs(filepath.Join(dir, "replica"), "--replicaof", "127.0.0.1", fmt.Sprint(tp.single.Port)); err != nil {
		return tp, err
	}
	if tp.cluster, err = testutil.NewCluster3(filepath.Join(dir, "cluster")); err != nil {
		return tp, err
	}
	if err := waitSynced(ctx, tp.replica); err != nil {
		return tp, err
	}
	if o.cpuPct == 0 {
		return tp, nil
	}
	prefix := fmt.Sprintf("llmgate-capped-%d-", os.Getpid())
	servers := append([]*testutil.Redis{tp.single, tp.replica}, tp.cluster.Nodes...)
	for i, r := range servers {
		g, err := newCgroup(o.cgroupRoot, prefix+fmt.Sprint(i), o.quota(), o.period)
		if err != nil {
			return tp, err
		}
		tp.groups = append(tp.groups, g)
		if err := g.add(r.Pid()); err != nil {
			return tp, err
		}
	}
	if tp.home, err = ownCgroup(o.cgroupRoot); err != nil {
		return tp, err
	}
	if tp.client, err = newCgroup(o.cgroupRoot, prefix+"bench", 0, 0); err != nil {
		return tp, err
	}
	tp.groups = append(tp.groups, tp.client)
	return tp, tp.client.add(os.Getpid())
}

// waitSynced waits until r's link to its master is up.
func waitSynced(ctx context.Context, r *testutil.Redis) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		m, err := r.Command(ctx, "INFO", "replication")
		if err == nil {
			if s, _ := m.ToString(); strings.Contains(s, "master_link_status:up") {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the one master's replica did not sync: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond): // an external process: nothing to wait on
		}
	}
}

// stop stops every server, brings this process back to its cgroup and
// removes the cgroups and the servers' directory.
func (tp *topology) stop() error {
	var errs []error
	if tp.client != nil && tp.home != "" {
		errs = append(errs, writeFile(filepath.Join(tp.home, "cgroup.procs"), os.Getpid()))
	}
	for _, r := range []*testutil.Redis{tp.single, tp.replica} {
		if r != nil {
			r.Stop()
		}
	}
	if tp.cluster != nil {
		tp.cluster.Stop()
	}
	for _, g := range tp.groups {
		errs = append(errs, g.remove())
	}
	errs = append(errs, os.RemoveAll(tp.dir))
	return errors.Join(errs...)
}

package gatewaybench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/llmgate/llmgate/internal/benchcli"
	"github.com/llmgate/llmgate/internal/localredis"
	"github.com/llmgate/llmgate/internal/storeurl"
)

// Exit codes of Main.
const (
	ExitOK    = benchcli.ExitOK
	ExitFail  = benchcli.ExitFail // the run failed, or requests failed (the figures are flagged)
	ExitUsage = benchcli.ExitUsage
)

const usageSynopsis = "usage: llmgate bench gateway [--duration D] [--reps N] [--concurrency 1,16,64] [--variants direct,proxy,memory,redis,redis-strict]\n" +
	"                             [--redis ADDR] [--stream=false] [--cpuprofile FILE] [--mutexprofile FILE] [--memprofile FILE] [--profile-variant V] [--json] [--out FILE]"

// Main runs `llmgate bench gateway`; args are those after "gateway".
// factory builds the llmgate variants. It prints a table, or one JSON
// object with --json, and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, factory GatewayFactory) int {
	c := benchcli.New("llmgate bench gateway", usageSynopsis,
		"Measures what llmgate adds to a chat completion against the simulated provider (no latency, no\n"+
			"limits), all in this process on loopback: direct calls, a bare reverse proxy, and llmgate on the\n"+
			"memory and Redis stores, interleaved. Reports added latency, throughput ratios and stream time\n"+
			"to first event, with the issue's targets. Profile labels: part=client|provider|proxy|gateway.", stdout, stderr)
	fs := c.Flags
	var (
		cfg         = Config{Factory: factory}
		concurrency = joinInts(DefaultConcurrency)
		variants    = strings.Join(DefaultVariants, ",")
		outPath     string
		cpuProfile  string
		mutexProf   string
		memProf     string
	)
	fs.DurationVar(&cfg.Duration, "duration", DefaultDuration, "how long each cell runs (each variant at each concurrency)")
	fs.IntVar(&cfg.Reps, "reps", DefaultReps, "interleaved repetitions; medians are reported")
	fs.StringVar(&concurrency, "concurrency", concurrency, "closed-loop `workers` of the cells, comma-separated")
	fs.StringVar(&variants, "variants", variants, "what to measure, comma-separated: direct (required), proxy (httputil.ReverseProxy), floor (net/http's server and llmgate's upstream transport relaying bytes, nothing else), memory and redis (llmgate on that store, as llmgate serve runs it), redis-strict (on Redis with ratelimit.local_quota off)")
	fs.StringVar(&cfg.Redis, "redis", "", "Redis for the redis variant: host:port or a redis:// URL (default: start a throw-away redis-server from PATH)")
	fs.BoolVar(&cfg.Stream, "stream", true, "also run streamed requests at concurrency 1 and report the time to the first event")
	fs.Int64Var(&cfg.MaxRequests, "max-requests", DefaultMaxRequests, "stop a cell after this many requests")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "after the repetitions, run --profile-variant at the highest concurrency once more and write its CPU profile to `file`")
	fs.StringVar(&mutexProf, "mutexprofile", "", "like --cpuprofile, with the mutex contention profile written to `file` (both may be given)")
	fs.StringVar(&memProf, "memprofile", "", "like --cpuprofile, with the allocation profiles after and before the run written to `file` and file.base (go tool pprof -sample_index=alloc_space -base file.base)")
	fs.StringVar(&cfg.ProfileVariant, "profile-variant", VariantMemory, "the variant --cpuprofile, --mutexprofile and --memprofile profile")
	jsonOut := c.JSON()
	fs.StringVar(&outPath, "out", "", "also write the JSON object to `file` (the table still goes to stdout)")

	if code, ok := c.Parse(args); !ok {
		return code
	}
	set := c.Given()
	var err error
	if cfg.Concurrency, err = parseInts(concurrency); err != nil {
		return c.Bad("--concurrency: %v", err)
	}
	cfg.Variants = splitList(variants)
	// Zero means "the default" in a Config; on the command line it is a
	// mistake.
	switch {
	case cfg.Duration <= 0:
		return c.Bad("--duration must be positive, got %v", cfg.Duration)
	case cfg.Reps < 1:
		return c.Bad("--reps must be at least 1, got %d", cfg.Reps)
	case cfg.MaxRequests < 1:
		return c.Bad("--max-requests must be at least 1, got %d", cfg.MaxRequests)
	}
	if cfg.Redis != "" {
		if !slices.ContainsFunc(cfg.Variants, onRedis) {
			return c.Bad("--redis is given but no redis variant is in --variants")
		}
		if !strings.Contains(cfg.Redis, "://") {
			cfg.Redis = "redis://" + cfg.Redis
		}
		if _, err := storeurl.RedisOption(cfg.Redis); err != nil {
			return c.Bad("--redis: %s", strings.TrimPrefix(err.Error(), "storeurl: "))
		}
	}
	if set["profile-variant"] && cpuProfile == "" && mutexProf == "" && memProf == "" {
		return c.Bad("--profile-variant applies with --cpuprofile, --mutexprofile or --memprofile only")
	}
	// Checked before a redis-server is started for nothing.
	check := cfg
	if check.Redis == "" {
		check.Redis = "redis://127.0.0.1:6379" // stands in for the one started below
	}
	if cpuProfile != "" || mutexProf != "" || memProf != "" {
		check.Profile = io.Discard
	}
	if err := check.Validate(); err != nil {
		return c.Bad("%s", strings.TrimPrefix(err.Error(), ErrConfig.Error()+": "))
	}

	if slices.ContainsFunc(cfg.Variants, onRedis) && cfg.Redis == "" {
		bin, err := localredis.Path()
		switch {
		case err != nil && set["variants"]:
			return c.Bad("the redis variants need --redis ADDR or redis-server on PATH: %v", err)
		case err != nil:
			// Not asked for by name: measure the rest.
			fmt.Fprintln(stderr, "llmgate bench gateway: no redis-server on PATH and no --redis: skipping the redis variants")
			cfg.Variants = slices.DeleteFunc(cfg.Variants, onRedis)
		default:
			r, err := localredis.Start(ctx, bin)
			if err != nil {
				return c.Fail(fmt.Errorf("%w: %w", ErrSetup, err))
			}
			defer r.Stop()
			cfg.Redis = r.URL
			fmt.Fprintf(stderr, "llmgate bench gateway: started %s on %s for the redis variant\n", bin, r.URL)
		}
	}

	for _, p := range []struct {
		path string
		w    *io.Writer
	}{{cpuProfile, &cfg.Profile}, {mutexProf, &cfg.MutexProfile}, {memProf, &cfg.MemProfile}, {memBase(memProf), &cfg.MemProfileBase}} {
		if p.path == "" {
			continue
		}
		f, err := os.Create(p.path)
		if err != nil {
			return c.Fail(err)
		}
		defer f.Close()
		*p.w = f
	}

	var out *os.File
	if outPath != "" {
		// Created before the run: a path that cannot be written fails
		// now, not after minutes of measuring.
		if out, err = os.Create(outPath); err != nil {
			return c.Fail(err)
		}
		defer out.Close()
	}
	res, err := Run(ctx, cfg, stderr)
	if err != nil {
		return c.Fail(err)
	}
	if out != nil {
		if err := json.NewEncoder(out).Encode(res); err != nil {
			return c.Fail(err)
		}
		if err := out.Close(); err != nil {
			return c.Fail(err)
		}
	}
	if *jsonOut {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return c.Fail(err)
		}
	} else {
		PrintResult(stdout, res)
	}
	if res.Interrupted {
		fmt.Fprintln(stderr, "llmgate bench gateway: interrupted; the figures cover the cells completed until then")
	}
	if res.Flagged {
		fmt.Fprintf(stderr, "llmgate bench gateway: FLAGGED: %d requests failed (%s); the figures are suspect (first: %s)\n", res.Errors, errorsByVariant(res), firstError(res))
		return ExitFail
	}
	return ExitOK
}

// errorsByVariant says how many requests failed in each variant that had
// failures ("proxy 1, memory 2"), in the order the variants were measured:
// a reference proxy's rare cut stream is not an llmgate failure.
func errorsByVariant(r *Result) string {
	var order []string
	count := map[string]int64{}
	add := func(variant string, n int64) {
		if n == 0 {
			return
		}
		if _, seen := count[variant]; !seen {
			order = append(order, variant)
		}
		count[variant] += n
	}
	for _, m := range r.Measurements {
		add(m.Variant, m.Errors)
	}
	if p := r.Profiled; p != nil {
		add("profiled "+p.Variant, p.Errors)
	}
	if len(order) == 0 {
		return "in no measured cell"
	}
	parts := make([]string, len(order))
	for i, v := range order {
		parts[i] = fmt.Sprintf("%s %d", v, count[v])
	}
	return strings.Join(parts, ", ")
}

func firstError(r *Result) string {
	for _, m := range r.Measurements {
		if m.FirstError != "" {
			return m.Variant + " " + m.Cell.String() + ": " + m.FirstError
		}
	}
	if r.Profiled != nil && r.Profiled.FirstError != "" {
		return "profiled run: " + r.Profiled.FirstError
	}
	return "none recorded"
}

// parseInts reads a comma-separated list of integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty; give one or more worker counts such as 1,16,64")
	}
	return out, nil
}

// splitList splits a comma-separated list, dropping empty entries and
// spaces.
func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// PrintResult writes r as a table: one line per cell and variant, then the
// targets.
func PrintResult(w io.Writer, r *Result) {
	fmt.Fprintf(w, "llmgate bench gateway: %d reps x %gs per cell, variants %s, GOMAXPROCS %d (%d CPUs), %s, started %s\n",
		r.Reps, r.DurationS, strings.Join(r.Variants, ","), r.GoMaxProcs, r.NumCPU, r.GoVersion, r.StartedAt)
	if len(r.Load1) > 0 {
		fmt.Fprintf(w, "load average (1 min) at each repetition's start and at the end: %v\n", r.Load1)
	}
	fmt.Fprintln(w, "medians over repetitions; +x = variant − direct and x/y ratios taken within each repetition")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cell\tvariant\treq/s\tp50 us\tp99 us\t+p50 us\t+p99 us\tx direct\tx proxy\tttfb us\t+ttfb us\tcpu us/req\t+cpu us/req\tredis cpu us/req\terrors\t")
	dash := func(ok bool, f string, x float64) string {
		if !ok {
			return "-"
		}
		return fmt.Sprintf(f, x)
	}
	for _, s := range r.Summaries {
		direct := s.Variant == VariantDirect
		proxy := "-"
		if s.RatioToProxy != nil {
			proxy = fmt.Sprintf("%.3f", *s.RatioToProxy)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%s\t%d\t\n",
			s.Cell, s.Variant, s.RPS, s.P50Us, s.P99Us,
			dash(!direct, "%+.1f", s.AddedP50Us), dash(!direct, "%+.1f", s.AddedP99Us),
			dash(!direct, "%.3f", s.RatioToDirect), proxy,
			dash(s.Stream, "%.1f", s.TTFBP50Us), dash(s.Stream && !direct, "%+.1f", s.AddedTTFBUs),
			s.CPUUsPerReq, dash(!direct, "%+.1f", s.AddedCPUUsPerReq),
			dash(s.RedisCPUUsPerReq > 0, "%.1f", s.RedisCPUUsPerReq), s.Errors)
	}
	tw.Flush()
	if len(r.Targets) > 0 {
		fmt.Fprintln(w, "\ntargets (ratios to the reference proxy in this run):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, t := range r.Targets {
			got := t.Got
			if got == "" {
				got = "-"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", t.Name, t.Want, got, t.Status)
		}
		tw.Flush()
	}
	if p := r.Profiled; p != nil {
		fmt.Fprintf(w, "\nprofiled run: %s at %s, %.0f req/s, p50 %.1fus, %.1f us CPU/req, %d errors\n",
			p.Variant, p.Cell, p.RPS, p.P50Us, p.CPUUsPerReq, p.Errors)
	}
	if r.Flagged {
		fmt.Fprintf(w, "\nFLAGGED: %d requests failed (%s); first: %s\n", r.Errors, errorsByVariant(r), firstError(r))
	}
}

// memBase is where --memprofile's before-the-run profile goes.
func memBase(path string) string {
	if path == "" {
		return ""
	}
	return path + ".base"
}

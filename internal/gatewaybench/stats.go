package gatewaybench

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/lockbench"
)

// percentile is the nearest-rank p-th percentile of sorted samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	return lockbench.Percentile(sorted, p)
}

// median returns the median of xs (the mean of the middle two for an even
// count); NaN for none. xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// us converts d to microseconds rounded to 0.1.
func us(d time.Duration) float64 { return math.Round(float64(d)/100) / 10 }

func round(x float64, places int) float64 {
	f := math.Pow(10, float64(places))
	return math.Round(x*f) / f
}

// summarize reduces the measurements to one Summary per variant and cell,
// in the order of variants and cells. Differences and ratios to direct and
// to the proxy pair measurements of the same repetition and cell; a
// repetition missing either side is left out of that figure.
func summarize(ms []Measurement, variants []string, cells []Cell) []Summary {
	type key struct {
		v   string
		c   Cell
		rep int
	}
	at := map[key]*Measurement{}
	for i := range ms {
		m := &ms[i]
		at[key{v: m.Variant, c: m.Cell, rep: m.Rep}] = m
	}
	var out []Summary
	for _, c := range cells {
		for _, v := range variants {
			s := Summary{Variant: v, Cell: c}
			var p50, p99, rps, ttfb, cpu, rcpu, addP50, addP99, addTTFB, addCPU, toDirect, toProxy []float64
			for _, m := range ms {
				if m.Variant != v || m.Cell != c {
					continue
				}
				s.Reps++
				s.Errors += m.Errors
				p50, p99, rps = append(p50, m.P50Us), append(p99, m.P99Us), append(rps, m.RPS)
				cpu = append(cpu, m.CPUUsPerReq)
				if c.Stream {
					ttfb = append(ttfb, m.TTFBP50Us)
				}
				if m.RedisCPUUsPerReq > 0 {
					rcpu = append(rcpu, m.RedisCPUUsPerReq)
				}
				if d := at[key{v: VariantDirect, c: c, rep: m.Rep}]; d != nil {
					addP50 = append(addP50, m.P50Us-d.P50Us)
					addP99 = append(addP99, m.P99Us-d.P99Us)
					addCPU = append(addCPU, m.CPUUsPerReq-d.CPUUsPerReq)
					if c.Stream {
						addTTFB = append(addTTFB, m.TTFBP50Us-d.TTFBP50Us)
					}
					if d.RPS > 0 {
						toDirect = append(toDirect, m.RPS/d.RPS)
					}
				}
				if p := at[key{v: VariantProxy, c: c, rep: m.Rep}]; p != nil && p.RPS > 0 {
					toProxy = append(toProxy, m.RPS/p.RPS)
				}
			}
			if s.Reps == 0 {
				continue
			}
			s.P50Us, s.P99Us, s.RPS = round(median(p50), 1), round(median(p99), 1), round(median(rps), 1)
			s.CPUUsPerReq = round(median(cpu), 1)
			if len(ttfb) > 0 {
				s.TTFBP50Us = round(median(ttfb), 1)
			}
			if len(rcpu) > 0 {
				s.RedisCPUUsPerReq = round(median(rcpu), 1)
			}
			if len(addP50) > 0 {
				s.AddedP50Us, s.AddedP99Us = round(median(addP50), 1), round(median(addP99), 1)
				s.AddedCPUUsPerReq = round(median(addCPU), 1)
			}
			if len(addTTFB) > 0 {
				s.AddedTTFBUs = round(median(addTTFB), 1)
			}
			if len(toDirect) > 0 {
				s.RatioToDirect = round(median(toDirect), 3)
			}
			if len(toProxy) > 0 {
				r := round(median(toProxy), 3)
				s.RatioToProxy = &r
			}
			out = append(out, s)
		}
	}
	return out
}

// Targets, as ratios to the reference proxy in the same run: llmgate on
// net/http's server and Transport, doing its own work, should still cost
// no more than a bare reverse proxy on them.
const (
	memoryThroughputVsProxy = 1.1 // memory store: throughput at the top concurrency
	memoryAddedVsProxy      = 1.0 // memory store: added p50 at the lowest
	redisThroughputVsProxy  = 1.0
	redisAddedVsProxy       = 1.0
	maxAddedTTFBUs          = 500.0 // stream time to first event, added, at c=1
)

// targets checks the goals against the summaries: throughput at
// the highest concurrency measured and added latency at the lowest (64 and
// 1 by default), stream TTFB at 1.
func targets(ss []Summary, concurrency []int) []Target {
	if len(concurrency) == 0 {
		return nil
	}
	lo, hi := slices.Min(concurrency), slices.Max(concurrency)
	find := func(v string, c Cell) *Summary {
		for i := range ss {
			if ss[i].Variant == v && ss[i].Cell == c {
				return &ss[i]
			}
		}
		return nil
	}
	var out []Target
	for _, g := range []struct {
		v                   string
		throughput, latency float64
	}{
		{VariantMemory, memoryThroughputVsProxy, memoryAddedVsProxy},
		{VariantRedis, redisThroughputVsProxy, redisAddedVsProxy},
	} {
		t := Target{
			Name: fmt.Sprintf("%s: throughput at c=%d vs proxy", g.v, hi),
			Want: fmt.Sprintf(">= %.1fx", g.throughput), Status: StatusNA,
		}
		if s := find(g.v, Cell{Concurrency: hi}); s != nil && s.RatioToProxy != nil {
			t.Got = fmt.Sprintf("%.2fx", *s.RatioToProxy)
			t.Status = passIf(*s.RatioToProxy >= g.throughput)
		}
		out = append(out, t)

		t = Target{Name: fmt.Sprintf("%s: added p50 at c=%d vs proxy's", g.v, lo), Status: StatusNA}
		if p := find(VariantProxy, Cell{Concurrency: lo}); p != nil {
			limit := g.latency * p.AddedP50Us
			t.Want = fmt.Sprintf("<= %.1fx proxy's %.0fus = %.0fus", g.latency, p.AddedP50Us, limit)
			if s := find(g.v, Cell{Concurrency: lo}); s != nil {
				t.Got = fmt.Sprintf("%.0fus", s.AddedP50Us)
				t.Status = passIf(s.AddedP50Us <= limit)
			}
		} else {
			t.Want = fmt.Sprintf("<= %.1fx the proxy's", g.latency)
		}
		out = append(out, t)

		t = Target{
			Name: fmt.Sprintf("%s: stream TTFB added at c=1", g.v),
			Want: fmt.Sprintf("<= %.0fus", maxAddedTTFBUs), Status: StatusNA,
		}
		if s := find(g.v, Cell{Concurrency: 1, Stream: true}); s != nil {
			t.Got = fmt.Sprintf("%.0fus", s.AddedTTFBUs)
			t.Status = passIf(s.AddedTTFBUs <= maxAddedTTFBUs)
		}
		out = append(out, t)
	}
	return out
}

func passIf(ok bool) string {
	if ok {
		return StatusPass
	}
	return StatusMiss
}

// redisStats is what INFO cpu and INFO commandstats say.
type redisStats struct {
	cpu   time.Duration    // used_cpu_sys + used_cpu_user
	calls map[string]int64 // calls per command, scripts' inner commands included
}

// readRedisStats reads the server's CPU time and command counts; the zero
// value and no error for a nil client.
func readRedisStats(ctx context.Context, c rueidis.Client) (redisStats, error) {
	if c == nil {
		return redisStats{}, nil
	}
	info, err := c.Do(ctx, c.B().Info().Section("cpu", "commandstats").Build()).ToString()
	if err != nil {
		return redisStats{}, err
	}
	cpu, err := parseRedisCPU(info)
	if err != nil {
		return redisStats{}, err
	}
	return redisStats{cpu: cpu, calls: parseCommandStats(info)}, nil
}

// parseRedisCPU sums used_cpu_sys and used_cpu_user (seconds) of an INFO
// cpu reply.
func parseRedisCPU(info string) (time.Duration, error) {
	var total float64
	found := 0
	for line := range strings.Lines(info) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_sys" && name != "used_cpu_user") {
			continue
		}
		x, err := strconv.ParseFloat(val, 64)
		if err != nil || !(x >= 0 && x <= 1e9) { // also NaN
			return 0, fmt.Errorf("gatewaybench: INFO cpu: bad %s %q", name, val)
		}
		total += x
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("gatewaybench: INFO cpu: used_cpu_sys or used_cpu_user missing")
	}
	return time.Duration(total * float64(time.Second)), nil
}

// parseCommandStats returns the calls of every "cmdstat_NAME:calls=N,..."
// line; malformed lines are skipped.
func parseCommandStats(info string) map[string]int64 {
	out := map[string]int64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || !commandName(name[len("cmdstat_"):]) {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if k, v, _ := strings.Cut(f, "="); k == "calls" {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
					out[strings.TrimPrefix(name, "cmdstat_")] = n
				}
			}
		}
	}
	return out
}

// commandName reports whether s looks like a Redis command name as INFO
// prints it ("get", "client|setinfo"): the names become JSON keys.
func commandName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '|' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// callsPerRequest is the commands the server ran between two snapshots,
// per request, rounded to 0.01; the benchmark's own INFO is left out.
func callsPerRequest(before, after map[string]int64, requests int64) map[string]float64 {
	if requests <= 0 {
		return nil
	}
	out := map[string]float64{}
	for name, n := range after {
		if d := n - before[name]; d > 0 && name != "info" {
			out[name] = round(float64(d)/float64(requests), 2)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// load1 returns the one-minute load average (Linux).
func load1() (float64, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	return parseLoad1(string(b))
}

func parseLoad1(s string) (float64, bool) {
	f, _, _ := strings.Cut(s, " ")
	x, err := strconv.ParseFloat(f, 64)
	if err != nil || !(x >= 0) || math.IsInf(x, 0) { // also NaN
		return 0, false
	}
	return x, true
}

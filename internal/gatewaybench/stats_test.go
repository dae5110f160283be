package gatewaybench

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{-2, 7}, 2.5},
		{[]float64{1, 1, 9, 9, 9}, 9},
	} {
		in := slices.Clone(tc.in)
		if got := median(in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
		if !slices.Equal(in, tc.in) {
			t.Errorf("median reordered its input: %v", in)
		}
	}
	if got := median(nil); !math.IsNaN(got) {
		t.Errorf("median(nil) = %v, want NaN", got)
	}
}

func TestPercentileAndUs(t *testing.T) {
	s := []time.Duration{1 * time.Microsecond, 2 * time.Microsecond, 3 * time.Microsecond, 4 * time.Microsecond}
	if p := percentile(s, 50); p != 2*time.Microsecond {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(s, 99); p != 4*time.Microsecond {
		t.Errorf("p99 = %v", p)
	}
	if p := percentile(nil, 50); p != 0 {
		t.Errorf("p50 of nothing = %v", p)
	}
	if got := us(1234567 * time.Nanosecond); got != 1234.6 {
		t.Errorf("us = %v, want 1234.6", got)
	}
}

func TestRotate(t *testing.T) {
	vs := []string{"a", "b", "c"}
	for k, want := range [][]string{{"a", "b", "c"}, {"b", "c", "a"}, {"c", "a", "b"}, {"a", "b", "c"}} {
		if got := rotate(vs, k); !slices.Equal(got, want) {
			t.Errorf("rotate(%d) = %v, want %v", k, got, want)
		}
	}
	if !slices.Equal(vs, []string{"a", "b", "c"}) {
		t.Errorf("rotate changed its input: %v", vs)
	}
	if got := rotate(nil, 2); got != nil {
		t.Errorf("rotate(nil) = %v", got)
	}
}

// meas is a measurement for the summary tests.
func meas(rep int, v string, c Cell, p50, rps float64) Measurement {
	return Measurement{Rep: rep, Variant: v, Cell: c, P50Us: p50, P99Us: 2 * p50, RPS: rps, Requests: 1, CPUUsPerReq: p50 / 10}
}

// TestSummarizePairsWithinRepetitions: differences and ratios are taken
// within each repetition, then the median: a repetition in which every
// variant was slow does not distort the added latency.
func TestSummarizePairsWithinRepetitions(t *testing.T) {
	c1 := Cell{Concurrency: 1}
	ms := []Measurement{
		meas(1, VariantDirect, c1, 100, 1000), meas(1, VariantProxy, c1, 140, 500), meas(1, VariantMemory, c1, 130, 800),
		meas(2, VariantDirect, c1, 300, 400), meas(2, VariantProxy, c1, 350, 200), meas(2, VariantMemory, c1, 320, 300), // a slow repetition
		meas(3, VariantDirect, c1, 110, 900), meas(3, VariantProxy, c1, 160, 450), meas(3, VariantMemory, c1, 150, 720),
	}
	ss := summarize(ms, []string{VariantDirect, VariantProxy, VariantMemory}, []Cell{c1})
	if len(ss) != 3 {
		t.Fatalf("%d summaries: %+v", len(ss), ss)
	}
	d, p, m := ss[0], ss[1], ss[2]
	if d.Variant != VariantDirect || p.Variant != VariantProxy || m.Variant != VariantMemory {
		t.Fatalf("order: %+v", ss)
	}
	if d.P50Us != 110 || d.AddedP50Us != 0 || d.RatioToDirect != 1 || *d.RatioToProxy != 2 {
		t.Errorf("direct: %+v", d)
	}
	// proxy − direct per rep: 40, 50, 50 → 50. Ratios 0.5, 0.5, 0.5.
	if p.AddedP50Us != 50 || p.RatioToDirect != 0.5 || *p.RatioToProxy != 1 {
		t.Errorf("proxy: %+v", p)
	}
	// memory − direct: 30, 20, 40 → 30 (the median of the medians' difference
	// would be 150 − 110 = 40). Ratio to proxy: 1.6, 1.5, 1.6 → 1.6.
	if m.AddedP50Us != 30 || m.P50Us != 150 || *m.RatioToProxy != 1.6 || m.RatioToDirect != 0.8 {
		t.Errorf("memory: %+v", m)
	}
	if m.AddedP99Us != 60 || m.AddedCPUUsPerReq != 3 {
		t.Errorf("memory p99/cpu: %+v", m)
	}
	if m.Reps != 3 {
		t.Errorf("memory reps %d", m.Reps)
	}
}

// TestSummarizeMissingPartner: a repetition without direct (or proxy) in
// a cell is left out of that cell's differences and ratios only.
func TestSummarizeMissingPartner(t *testing.T) {
	c1, s1 := Cell{Concurrency: 1}, Cell{Concurrency: 1, Stream: true}
	ms := []Measurement{
		meas(1, VariantDirect, c1, 100, 1000), meas(1, VariantMemory, c1, 150, 500),
		meas(2, VariantMemory, c1, 900, 100), // its direct was cut
		meas(1, VariantDirect, s1, 200, 300), meas(1, VariantMemory, s1, 260, 200),
	}
	ms[3].TTFBP50Us, ms[4].TTFBP50Us = 80, 130
	ss := summarize(ms, []string{VariantDirect, VariantMemory}, []Cell{c1, s1})
	if len(ss) != 4 {
		t.Fatalf("%d summaries", len(ss))
	}
	m := ss[1]
	if m.Reps != 2 || m.AddedP50Us != 50 || m.RatioToDirect != 0.5 || m.RatioToProxy != nil {
		t.Errorf("memory c=1: %+v", m)
	}
	st := ss[3]
	if !st.Stream || st.TTFBP50Us != 130 || st.AddedTTFBUs != 50 {
		t.Errorf("memory stream: %+v", st)
	}
	if ss[0].AddedTTFBUs != 0 || ss[0].TTFBP50Us != 0 {
		t.Errorf("non-stream cell with TTFB: %+v", ss[0])
	}
}

func TestTargets(t *testing.T) {
	r := func(x float64) *float64 { return &x }
	c1, c64, s1 := Cell{Concurrency: 1}, Cell{Concurrency: 64}, Cell{Concurrency: 1, Stream: true}
	ss := []Summary{
		{Variant: VariantProxy, Cell: c1, AddedP50Us: 400, RatioToProxy: r(1)},
		{Variant: VariantMemory, Cell: c1, AddedP50Us: 400},       // = the proxy's: pass
		{Variant: VariantRedis, Cell: c1, AddedP50Us: 521},        // > 1.3 × 400 = 520: miss
		{Variant: VariantMemory, Cell: c64, RatioToProxy: r(1.3)}, // pass
		{Variant: VariantRedis, Cell: c64, RatioToProxy: r(0.99)}, // miss
		{Variant: VariantMemory, Cell: s1, AddedTTFBUs: 499},      // pass
		// no redis stream cell: n/a
	}
	got := map[string]string{}
	for _, tg := range targets(ss, []int{1, 16, 64}) {
		got[tg.Name] = tg.Status
		if tg.Status != StatusNA && (tg.Want == "" || tg.Got == "") {
			t.Errorf("target without want/got: %+v", tg)
		}
	}
	want := map[string]string{
		"memory: throughput at c=64 vs proxy": StatusPass,
		"memory: added p50 at c=1 vs proxy's": StatusPass,
		"memory: stream TTFB added at c=1":    StatusPass,
		"redis: throughput at c=64 vs proxy":  StatusMiss,
		"redis: added p50 at c=1 vs proxy's":  StatusMiss,
		"redis: stream TTFB added at c=1":     StatusNA,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("targets %v", got)
	}
	// Without the proxy, nothing can be compared to it.
	for _, tg := range targets(ss[1:2], []int{1}) {
		if tg.Status != StatusNA {
			t.Errorf("without a proxy: %+v", tg)
		}
	}
}

func TestParseRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:9.0\r\nused_cpu_user_main_thread:0.2\r\n"
	d, err := parseRedisCPU(info)
	if err != nil || d != 1750*time.Millisecond {
		t.Fatalf("= %v, %v; want 1.75s", d, err)
	}
	for _, bad := range []string{"", "# CPU\r\nused_cpu_sys:1\r\n", "used_cpu_sys:x\r\nused_cpu_user:1\r\n", "used_cpu_sys:-1\r\nused_cpu_user:1\r\n"} {
		if _, err := parseRedisCPU(bad); err == nil {
			t.Errorf("parseRedisCPU(%q) did not fail", bad)
		}
	}
}

func TestCommandStats(t *testing.T) {
	before := parseCommandStats("# Commandstats\r\ncmdstat_evalsha:calls=10,usec=50,usec_per_call=5.00\r\ncmdstat_info:calls=3,usec=9\r\n")
	after := parseCommandStats("# Commandstats\r\ncmdstat_evalsha:calls=30,usec=150\r\ncmdstat_get:calls=40,usec=9\r\n" +
		"cmdstat_info:calls=5,usec=9\r\ncmdstat_bad:calls=x\r\nnot a stat\r\ncmdstat_a b:calls=1\r\ncmdstat_:calls=1\r\n")
	if after["evalsha"] != 30 || after["get"] != 40 || len(after) != 3 {
		t.Fatalf("parsed %v", after)
	}
	got := callsPerRequest(before, after, 20)
	if len(got) != 2 || got["evalsha"] != 1 || got["get"] != 2 {
		t.Errorf("per request %v; want evalsha 1, get 2 and no info", got)
	}
	if callsPerRequest(before, after, 0) != nil || callsPerRequest(after, after, 5) != nil {
		t.Error("per request of nothing is not nil")
	}
}

func FuzzParseCommandStats(f *testing.F) {
	f.Add("cmdstat_evalsha:calls=10,usec=50\r\ncmdstat_get:calls=-1\r\n")
	f.Fuzz(func(t *testing.T, s string) {
		for name, n := range parseCommandStats(s) {
			if n < 0 || !commandName(name) {
				t.Fatalf("%q: %d from %q", name, n, s)
			}
		}
	})
}

func TestParseLoad1(t *testing.T) {
	if x, ok := parseLoad1("2.35 1.80 1.20 3/456 7890\n"); !ok || x != 2.35 {
		t.Errorf("= %v, %v", x, ok)
	}
	for _, bad := range []string{"", "x 1 2", "-1 0 0", "NaN 1 1", "+Inf 1 1"} {
		if _, ok := parseLoad1(bad); ok {
			t.Errorf("parseLoad1(%q) accepted", bad)
		}
	}
}

func TestParseInts(t *testing.T) {
	got, err := parseInts(" 1, 16,,64 ")
	if err != nil || !slices.Equal(got, []int{1, 16, 64}) {
		t.Errorf("= %v, %v", got, err)
	}
	for _, bad := range []string{"", ",", "1,x", "1.5", "99999999999999999999"} {
		if _, err := parseInts(bad); err == nil {
			t.Errorf("parseInts(%q) accepted", bad)
		}
	}
}

func FuzzParseRedisCPU(f *testing.F) {
	f.Add("used_cpu_sys:1.5\r\nused_cpu_user:0.25\r\n")
	f.Add("used_cpu_sys:1e400\nused_cpu_user:NaN\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseRedisCPU(s)
		if err == nil && d < 0 {
			t.Fatalf("negative CPU %v from %q", d, s)
		}
	})
}

func FuzzParseLoad1(f *testing.F) {
	f.Add("0.52 0.58 0.59 1/467 1234")
	f.Add("NaN")
	f.Fuzz(func(t *testing.T, s string) {
		if x, ok := parseLoad1(s); ok && (!(x >= 0) || math.IsInf(x, 0)) {
			t.Fatalf("accepted %v from %q", x, s)
		}
	})
}

func FuzzParseInts(f *testing.F) {
	f.Add("1,16,64")
	f.Add(" , 3,")
	f.Fuzz(func(t *testing.T, s string) {
		ns, err := parseInts(s)
		if err == nil && len(ns) == 0 {
			t.Fatalf("no error and no numbers from %q", s)
		}
		if err == nil && len(ns) > strings.Count(s, ",")+1 {
			t.Fatalf("%d numbers from %q", len(ns), s)
		}
	})
}

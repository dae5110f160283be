package ratebench_test

import (
	"bytes"
	"context"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/ratebench"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestMain lets the test binary stand in for the llmgate binary: an
// accuracy run re-executes "<binary> bench ratelimit <worker flags>".
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "bench" && os.Args[2] == "ratelimit" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := ratebench.Main(ctx, os.Args[3:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := ratebench.Main(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func decode(t *testing.T, out string, fields ...string) map[string]any {
	t.Helper()
	return testutil.JSONObject(t, out, fields...)
}

// TestThroughputSmoke: a short run prints the figures the issue asks for,
// with one round trip per decision for three limits in one slot, and the
// GCRA baseline measured in the same run.
func TestThroughputSmoke(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, tc := range []struct {
		name       string
		args       []string
		roundTrips float64
	}{
		{"3 limits", nil, 1},
		{"1 limit shared client", []string{"--limits", "1", "--shared-client"}, 1},
		{"settle", []string{"--settle"}, 2},
		{"local quota", []string{"--local", "--settle"}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--store", r.URL(), "--workers", "4", "--duration", "300ms", "--ping", "50", "--json"}, tc.args...)
			code, out, errOut := runMain(t, args...)
			if code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, errOut)
			}
			m := decode(t, out, "decisions_per_sec", "p50_us", "p99_us", "ping_p50_us", "round_trips_per_decision", "baseline", "ratio_vs_baseline", "workers")
			if m["decisions"].(float64) < 1 || m["decisions_per_sec"].(float64) <= 0 {
				t.Errorf("no decisions: %s", out)
			}
			if m["errors"].(float64) != 0 || m["denied"].(float64) != 0 {
				t.Errorf("errors or refusals: %s", out)
			}
			if tc.roundTrips < 0 {
				// Local quota: most decisions and settles make no round trip.
				if rt := m["round_trips_per_decision"].(float64); rt <= 0 || rt >= 0.5 {
					t.Errorf("round_trips_per_decision = %v with a local quota, want between 0 and 0.5", rt)
				}
				if m["local_quota"] != true {
					t.Errorf("local_quota not reported: %s", out)
				}
			} else {
				if rt := m["round_trips_per_decision"].(float64); !about(rt, tc.roundTrips) {
					t.Errorf("round_trips_per_decision = %v, want %v", rt, tc.roundTrips)
				}
				if s := m["server_scripts_per_decision"].(float64); !about(s, tc.roundTrips) {
					t.Errorf("server_scripts_per_decision = %v, want %v", s, tc.roundTrips)
				}
			}
			b := m["baseline"].(map[string]any)
			if b["algo"] != "gcra" || b["decisions_per_sec"].(float64) <= 0 || !about(b["round_trips_per_decision"].(float64), 1) {
				t.Errorf("baseline = %v", b)
			}
			if m["ratio_vs_baseline"].(float64) <= 0 {
				t.Errorf("no ratio: %s", out)
			}
		})
	}
	// The table prints too.
	code, out, errOut := runMain(t, "--store", r.URL(), "--workers", "2", "--duration", "100ms", "--ping", "10", "--baseline=false")
	if code != 0 || !strings.Contains(out, "decisions/s") || !strings.Contains(out, "PING p50") {
		t.Fatalf("table run: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestShardsSmoke: a comparison run measures the same requests on one
// master and on a 3-master Cluster, reports each master's load, and the
// Cluster's masters all serve a part of the deployments' groups. As the
// gateway lays them out, a request over a deployment's and a tenant's
// limits is one script on the one master and two on the Cluster.
func TestShardsSmoke(t *testing.T) {
	single, cluster := testutil.StartRedis(t), testutil.StartCluster3(t)
	code, out, errOut := runMain(t, "--store", cluster.URL(), "--single", single.URL(), "--deployments", "64", "--reps", "1",
		"--workers", "4", "--duration", "200ms", "--limits", "3", "--json")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	m := decode(t, out, "reps", "ratio", "capacity_ratio", "cluster_masters", "single_decisions_per_sec", "cluster_decisions_per_sec", "busiest_share")
	if m["cluster_masters"].(float64) != 3 || m["ratio"].(float64) <= 0 || m["capacity_ratio"].(float64) <= 0 {
		t.Fatalf("no comparison: %s", out)
	}
	rep := m["reps"].([]any)[0].(map[string]any)
	if s := m["busiest_share"].(float64); s < 1.0/3 || s > 1 {
		t.Errorf("busiest_share = %v, want between 1/3 and 1", s)
	}
	for store, want := range map[string]struct {
		masters int
		scripts float64
	}{"single": {1, 1}, "cluster": {3, 2}} {
		masters := want.masters
		ph := rep[store].(map[string]any)
		if s := ph["server_scripts_per_decision"].(float64); !about(s, want.scripts) {
			t.Errorf("%s: %v scripts a decision, want %v", store, s, want.scripts)
		}
		if ph["decisions"].(float64) < 1 || ph["errors"].(float64) != 0 || ph["denied"].(float64) != 0 {
			t.Errorf("%s: no decisions, or errors or refusals: %v", store, ph)
		}
		ms := ph["masters"].([]any)
		if len(ms) != masters {
			t.Fatalf("%s: %d masters reported, want %d: %v", store, len(ms), masters, ph)
		}
		for _, x := range ms {
			if ml := x.(map[string]any); ml["scripts"].(float64) < 1 || ml["cpu_sec"].(float64) <= 0 {
				t.Errorf("%s: a master served no script: %v", store, ml)
			}
		}
	}
	// The table prints too.
	code, out, errOut = runMain(t, "--store", cluster.URL(), "--single", single.URL(), "--reps", "1", "--workers", "2", "--duration", "100ms")
	if code != 0 || !strings.Contains(out, "capacity ratio") || !strings.Contains(out, "median") {
		t.Fatalf("table run: exit %d\n%s\n%s", code, out, errOut)
	}
	// --store must be the Cluster.
	if code, _, errOut := runMain(t, "--store", single.URL(), "--single", single.URL(), "--reps", "1", "--duration", "100ms"); code != ratebench.ExitFail || !strings.Contains(errOut, "Cluster") {
		t.Fatalf("a standalone --store: exit %d, %s", code, errOut)
	}
}

// TestAccuracySmoke: worker processes (this binary, re-executed) share one
// limit; the result is never over the ideal, and by its last refusal each
// limiter had admitted nearly all it owed. The accuracy against the ideal
// is the benchmark's figure, not checked here: a busy machine that pauses
// the workers near the end of this one-second run lowers it for any
// algorithm (what flows in while nobody asks is never taken).
func TestAccuracySmoke(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"llmgate allow", nil},
		{"llmgate wait", []string{"--wait", "--workers", "2"}},
		{"llmgate allow, local quota", []string{"--local", "--workers", "2"}},
		{"gcra", []string{"--algo", "gcra"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--store", r.URL(), "--accuracy", "--procs", "2", "--rate", "200", "--duration", "1s", "--json"}, tc.args...)
			code, out, errOut := runMain(t, args...)
			if code != 0 {
				t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			m := decode(t, out, "admitted", "ideal", "over", "accuracy_pct", "owed", "per_process")
			if m["over"].(float64) != 0 {
				t.Fatalf("over = %v: %s", m["over"], out)
			}
			if m["errors"].(float64) != 0 {
				t.Fatalf("errors: %s", out)
			}
			if pct := m["accuracy_pct"].(float64); pct <= 0 || pct > 100 {
				t.Fatalf("accuracy %.2f%%, want at most 100: %s", pct, out)
			}
			// Two processes asking flat out outrun 200/s and are refused
			// within the second, unless the machine is too busy to let
			// them ask that often: then every request was admitted, and
			// there is nothing more to check.
			if m["owed"].(float64) == 0 {
				if m["admitted"] != m["attempts"] {
					t.Fatalf("requests refused, but nothing owed: %s", out)
				}
				t.Logf("nothing was refused: %v attempts in %vs", m["attempts"], m["duration_s"])
			} else if pct := m["owed_pct"].(float64); pct < 97 {
				t.Fatalf("admitted %.2f%% of what was owed by the last refusal, want at least 97%%: %s", pct, out)
			}
			if pp := m["per_process"].([]any); len(pp) != 2 {
				t.Fatalf("per_process = %v", pp)
			}
		})
	}
}

// TestUsage: bad flags exit 2 with a message; --help lists the flags but
// not the hidden worker ones.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--store is required"},
		{[]string{"--store", "memory"}, "inside one process"},
		{[]string{"--store", "redis://x:1", "--workers", "0"}, "--workers"},
		{[]string{"--store", "redis://x:1", "--limits", "4"}, "--limits"},
		{[]string{"--store", "redis://x:1", "--rate", "5"}, "--accuracy only"},
		{[]string{"--store", "redis://x:1", "--accuracy", "--settle"}, "does not apply"},
		{[]string{"--store", "redis://x:1", "--accuracy", "--algo", "x"}, "--algo"},
		{[]string{"--store", "redis://x:1", "--accuracy", "--algo", "gcra", "--wait"}, "--wait"},
		{[]string{"--store", "redis://x:1", "extra"}, "unexpected argument"},
		{[]string{"--store", "redis://x:1", "--deployments", "8"}, "--single only"},
		{[]string{"--store", "redis://x:1", "--tenant-limits", "50"}, "--single only"},
		{[]string{"--store", "redis://x:1", "--single", "redis://y:1", "--tenant-limits", "101"}, "--tenant-limits"},
		{[]string{"--store", "redis://x:1", "--single", "redis://y:1", "--reps", "0"}, "--reps"},
		{[]string{"--store", "redis://x:1", "--single", "memory"}, "--single"},
		{[]string{"--store", "redis://x:1", "--single", "redis://y:1", "--ping", "5"}, "does not apply"},
		{[]string{"--store", "redis://x:1", "--single", "redis://y:1", "--accuracy"}, "does not apply"},
		{[]string{"--nope"}, "not defined"},
	} {
		code, _, errOut := runMain(t, tc.args...)
		if code != ratebench.ExitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, code, errOut, tc.want)
		}
	}
	code, out, _ := runMain(t, "--help")
	if code != 0 || !strings.Contains(out, "--accuracy") || strings.Contains(out, "accuracy-child") {
		t.Fatalf("--help: exit %d\n%s", code, out)
	}
}

// about reports whether a measured per-decision count is want, give or take
// the few calls a run adds at its edges (a script loaded after NOSCRIPT, a
// decision in flight when the counters are read): 1%.
func about(got, want float64) bool { return math.Abs(got-want) <= 0.01*want }

package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/ratebench"
	"github.com/llmgate/llmgate/internal/testutil"
)

const cgroupRoot = "/sys/fs/cgroup/cpu"

// TestCapped: one short comparison on the servers this command starts.
// Where a cgroup can be made, each server runs in its own with the quota
// and the benchmark in one without; the one master then stays within its
// quota. Elsewhere the run is uncapped and the rest is checked alike.
// Afterwards no server answers and no cgroup is left.
func TestCapped(t *testing.T) {
	capped := checkCgroups(cgroupRoot) == nil
	cpu := "10"
	if !capped {
		t.Logf("no writable cgroup v1 cpu controller at %s: running uncapped", cgroupRoot)
		cpu = "0"
	}
	var stderr bytes.Buffer
	o, err := parse([]string{"--cpu", cpu, "--",
		"--deployments", "16", "--tenants", "4", "--limits", "3", "--tenant-limits", "50",
		"--reps", "1", "--workers", "4", "--duration", "300ms", "--json"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	var homeBefore string
	if capped {
		homeBefore = selfCgroup(t)
	}
	var addrs, groups []string
	o.ready = func(tp *topology) {
		servers := append([]*testutil.Redis{tp.single, tp.replica}, tp.cluster.Nodes...)
		for _, r := range servers {
			addrs = append(addrs, r.Addr)
		}
		if !capped {
			if len(tp.groups) != 0 {
				t.Errorf("uncapped, yet %d cgroups", len(tp.groups))
			}
			return
		}
		if len(tp.groups) != len(servers)+1 {
			t.Fatalf("%d cgroups for %d servers and the benchmark", len(tp.groups), len(servers))
		}
		for i, r := range servers {
			g := tp.groups[i].dir
			groups = append(groups, g)
			if q := readInt(t, g, "cpu.cfs_quota_us"); q != 10_000 {
				t.Errorf("%s: quota %d us, want 10000 (10%% of 100ms)", g, q)
			}
			if p := readInt(t, g, "cpu.cfs_period_us"); p != 100_000 {
				t.Errorf("%s: period %d us, want 100000", g, p)
			}
			if procs := readLines(t, g, "cgroup.procs"); !slices.Equal(procs, []string{strconv.Itoa(r.Pid())}) {
				t.Errorf("%s holds %v, want the server %d alone", g, procs, r.Pid())
			}
		}
		bench := tp.client.dir
		groups = append(groups, bench)
		if q := readInt(t, bench, "cpu.cfs_quota_us"); q != -1 {
			t.Errorf("the benchmark's cgroup has a quota: %d", q)
		}
		if got := selfCgroup(t); !strings.HasSuffix(bench, got) || got == "/" {
			t.Errorf("the benchmark runs in %s, want %s", got, bench)
		}
	}
	var stdout bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if code := runWith(ctx, o, &stdout, &stderr); code != ratebench.ExitOK {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	m := testutil.JSONObject(t, stdout.String(), "reps", "cluster_masters", "tenants_with_limits", "busiest_share")
	if m["cluster_masters"].(float64) != 3 || m["tenants_with_limits"].(float64) != 2 {
		t.Errorf("not 3 masters and 2 tenants with limits: %s", stdout.String())
	}
	if s := m["busiest_share"].(float64); s < 1.0/3 || s > 1 {
		t.Errorf("busiest_share %v, want between 1/3 and 1", s)
	}
	rep := m["reps"].([]any)[0].(map[string]any)
	single, cluster := rep["single"].(map[string]any), rep["cluster"].(map[string]any)
	// The one master decides every request in one script (one group); on
	// the Cluster the requests of the tenants with limits take two.
	for name, want := range map[string]struct {
		ph      map[string]any
		scripts float64
	}{"single": {single, 1}, "cluster": {cluster, 1.5}} {
		if got := want.ph["server_scripts_per_decision"].(float64); got < want.scripts*0.97 || got > want.scripts*1.03 {
			t.Errorf("%s: %v scripts a decision, want %v", name, got, want.scripts)
		}
		if want.ph["decisions"].(float64) < 1 || want.ph["errors"].(float64) != 0 || want.ph["client_cpu_sec"].(float64) <= 0 {
			t.Errorf("%s: no decisions, errors, or no client CPU: %v", name, want.ph)
		}
	}
	if capped {
		// 10% of a core over 300ms, give or take the periods at the edges.
		master := single["masters"].([]any)[0].(map[string]any)
		if used := master["cpu_sec"].(float64) / single["duration_s"].(float64); used > 0.2 {
			t.Errorf("the capped master used %.0f%% of a core", 100*used)
		}
		if !strings.Contains(stderr.String(), "capped at 10% of a core") {
			t.Errorf("stderr does not say the servers were capped:\n%s", stderr.String())
		}
	}
	// Everything is gone.
	if len(addrs) != 8 {
		t.Fatalf("%d servers, want 8", len(addrs))
	}
	for _, a := range addrs {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still answers", a)
		}
	}
	for _, g := range groups {
		if _, err := os.Stat(g); !os.IsNotExist(err) {
			t.Errorf("cgroup %s is left: %v", g, err)
		}
	}
	if capped {
		if got := selfCgroup(t); got != homeBefore {
			t.Errorf("the process is in cgroup %s after the run, was in %s", got, homeBefore)
		}
	}
}

// TestUsage: bad flags and an unusable cgroup get a message saying what
// to do, before any server starts.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--cpu", "101"}, ratebench.ExitUsage, "--cpu must be"},
		{[]string{"--cpu", "0.5"}, ratebench.ExitUsage, "smallest quota"},
		{[]string{"--period", "0s"}, ratebench.ExitUsage, "--period"},
		{[]string{"--", "--store", "redis://x:1"}, ratebench.ExitUsage, "--store is set here"},
		{[]string{"--nope"}, ratebench.ExitUsage, "not defined"},
		{[]string{"--cpu", "10", "--cgroup", t.TempDir()}, ratebench.ExitFail, "--cpu 0 runs uncapped"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), tc.args, &stdout, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}

// selfCgroup is this process's cpu cgroup, relative to the controller.
func selfCgroup(t *testing.T) string {
	t.Helper()
	dir, err := ownCgroup("/")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func readLines(t *testing.T, dir, file string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

func readInt(t *testing.T, dir, file string) int64 {
	t.Helper()
	f := readLines(t, dir, file)
	if len(f) != 1 {
		t.Fatalf("%s/%s: %v", dir, file, f)
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

package lockbench_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/lockbench"
	"github.com/llmgate/llmgate/internal/testutil"
)

// runMain runs Main with args and returns its exit code, stdout and stderr.
func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runMainWith(t, nil, args...)
}

func runMainWith(t *testing.T, extra []lockbench.Algo, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := lockbench.MainWith(ctx, args, &stdout, &stderr, extra...)
	return code, stdout.String(), stderr.String()
}

// requiredFields are the JSON fields every run must report: the figures of
// BENCHMARKS.md are read from them.
var requiredFields = []string{
	"workers", "ops_per_sec", "ping_p50_us", "handoff_p50_us", "handoff_p99_us",
	"wait_p50_us", "wait_p99_us", "wait_max_us", "jain", "self_reacquire_pct",
	"violations", "algo", "fair", "cs_us", "duration_s", "store",
}

func decode(t *testing.T, out string) map[string]any {
	t.Helper()
	return testutil.JSONObject(t, out, requiredFields...)
}

func TestMainSmokeRedis(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"llmgate", nil},
		{"llmgate fair cs", []string{"--fair", "--cs", "100us"}},
		{"poll", []string{"--algo", "poll"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--store", r.URL(), "--workers", "4", "--duration", "300ms", "--ping", "50", "--json"}, tc.args...)
			code, out, errOut := runMain(t, args...)
			if code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, errOut)
			}
			m := decode(t, out)
			if v := m["violations"].(float64); v != 0 {
				t.Errorf("violations = %v, want 0", v)
			}
			if w := m["workers"].(float64); w != 4 {
				t.Errorf("workers = %v, want 4", w)
			}
			if n := m["acquisitions"].(float64); n < 1 {
				t.Errorf("no acquisitions: %s", out)
			}
			if p := m["ping_p50_us"].(float64); p <= 0 {
				t.Errorf("ping_p50_us = %v, want > 0", p)
			}
			if j := m["jain"].(float64); j <= 0 || j > 1 {
				t.Errorf("jain = %v, want in (0, 1]", j)
			}
			if e := m["lock_errors"].(float64) + m["release_errors"].(float64); e != 0 {
				t.Errorf("%v errors: %v", e, m["first_error"])
			}
		})
	}
}

func TestMainPingInTheLoop(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, algo := range []string{"llmgate", "poll"} {
		t.Run(algo, func(t *testing.T) {
			code, out, errOut := runMain(t, "--store", r.URL(), "--algo", algo, "--workers", "1",
				"--duration", "200ms", "--ping", "20", "--ping-every", "4", "--json")
			if code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, errOut)
			}
			m := decode(t, out)
			if m["ping_own_client"] != true {
				t.Errorf("ping_own_client = %v, want true (the mutex PINGs on its own client)", m["ping_own_client"])
			}
			if p, _ := m["ping_during_p50_us"].(float64); p <= 0 {
				t.Errorf("ping_during_p50_us = %v, want > 0", m["ping_during_p50_us"])
			}
			if p, _ := m["pair_pings"].(float64); p <= 0 {
				t.Errorf("pair_pings = %v, want > 0", m["pair_pings"])
			}
		})
	}
}

func TestMainHidesPassword(t *testing.T) {
	code, _, errOut := runMain(t, "--store", "redis://u:hunter2@[::1", "--json")
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	if strings.Contains(errOut, "hunter2") {
		t.Errorf("stderr shows the password: %s", errOut)
	}
}

func TestMainTableMemory(t *testing.T) {
	code, out, errOut := runMain(t, "--store", "memory", "--workers", "3", "--duration", "100ms")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	for _, want := range []string{"critical sections/s", "hand-off p50", "Jain fairness", "violations"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestMainUncontendedKeys(t *testing.T) {
	code, out, errOut := runMain(t, "--store", "memory", "--workers", "4", "--keys", "4", "--duration", "100ms", "--json")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	m := decode(t, out)
	// Only each worker's (each key's) first acquisition has another (no)
	// previous holder: one per worker that acquired at all, however few
	// acquisitions a busy machine made (a worker may even start after the
	// deadline). self_reacquire_pct is rounded to 0.01.
	acq, pct := m["acquisitions"].(float64), m["self_reacquire_pct"].(float64)
	if acq < 1 {
		t.Fatalf("%v acquisitions, want some", acq)
	}
	firsts := acq * (100 - pct) / 100
	lo, hi := 1.0, 4.0
	if m["per_worker_min"].(float64) >= 1 {
		lo = 4 // every worker acquired
	}
	if slack := 0.005 * acq / 100; firsts < lo-slack || firsts > hi+slack {
		t.Errorf("one key per worker: self_reacquire_pct = %v over %v acquisitions: %.2f without the same previous holder, want %v to %v (each worker's first)", pct, acq, firsts, lo, hi)
	}
	if h := m["handoffs"].(float64); h != 0 {
		t.Errorf("one key per worker: %v hand-offs, want 0", h)
	}
}

func TestMainMaxOps(t *testing.T) {
	code, out, errOut := runMain(t, "--store", "memory", "--workers", "2", "--duration", "10s", "--max-ops", "100", "--json")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	m := decode(t, out)
	if n := m["acquisitions"].(float64); n != 100 {
		t.Errorf("acquisitions = %v, want 100 (the warm-up acquisitions are not counted)", n)
	}
	if d := m["duration_s"].(float64); d > 5 {
		t.Errorf("--max-ops did not end the run: it took %vs", d)
	}
	if m["warmup"] != true {
		t.Errorf("warmup = %v, want true by default", m["warmup"])
	}
	code, out, errOut = runMain(t, "--store", "memory", "--workers", "2", "--max-ops", "10", "--warmup=false", "--json")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	if m := decode(t, out); m["warmup"] != false || m["acquisitions"].(float64) != 10 {
		t.Errorf("--warmup=false: warmup = %v, acquisitions = %v", m["warmup"], m["acquisitions"])
	}
}

func TestMainBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no store", []string{}, "--store is required"},
		{"unknown flag", []string{"--store", "memory", "--bogus"}, "bogus"},
		{"bad workers", []string{"--store", "memory", "--workers", "0"}, "--workers"},
		{"workers not a number", []string{"--store", "memory", "--workers", "many"}, "workers"},
		{"bad duration", []string{"--store", "memory", "--duration", "soon"}, "duration"},
		{"negative cs", []string{"--store", "memory", "--cs", "-1us"}, "--cs"},
		{"keys above workers", []string{"--store", "memory", "--workers", "2", "--keys", "3"}, "--keys"},
		{"short ttl", []string{"--store", "memory", "--ttl", "1ms"}, "--ttl"},
		{"unknown algo", []string{"--store", "memory", "--algo", "zookeeper"}, "unknown --algo"},
		{"poll on memory", []string{"--store", "memory", "--algo", "poll"}, "needs a Redis store"},
		{"poll is not fair", []string{"--store", "redis://127.0.0.1:1", "--algo", "poll", "--fair"}, "no fair mode"},
		{"bad url", []string{"--store", "http://x"}, "bad store URL"},
		{"stray argument", []string{"--store", "memory", "extra"}, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runMain(t, tt.args...)
			if code != lockbench.ExitUsage {
				t.Errorf("exit %d, want %d; stdout %q", code, lockbench.ExitUsage, out)
			}
			if !strings.Contains(errOut, tt.want) {
				t.Errorf("stderr %q lacks %q", errOut, tt.want)
			}
			if out != "" {
				t.Errorf("stdout not empty: %q", out)
			}
		})
	}
}

func TestMainHelp(t *testing.T) {
	code, out, _ := runMain(t, "--help")
	if code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	for _, want := range []string{"--store", "llmgate", "poll", "--fair"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
}

// noLock is a broken algorithm: every Lock succeeds at once.
type noLock struct{}

func (noLock) Lock(context.Context, string) (func(context.Context) error, error) {
	time.Sleep(10 * time.Microsecond) // let the workers interleave
	return func(context.Context) error { return nil }, nil
}
func (noLock) Close() error { return nil }

func TestMainReportsViolations(t *testing.T) {
	broken := lockbench.Algo{
		Name: "broken", Summary: "no mutual exclusion", Memory: true,
		Open: func(context.Context, lockbench.Setup) (lockbench.Factory, func() error, error) {
			return func(context.Context, int) (lockbench.Mutex, error) { return noLock{}, nil }, nil, nil
		},
	}
	code, out, errOut := runMainWith(t, []lockbench.Algo{broken},
		"--store", "memory", "--algo", "broken", "--workers", "4", "--cs", "200us", "--duration", "200ms", "--json")
	if code != lockbench.ExitFail {
		t.Errorf("exit %d, want %d", code, lockbench.ExitFail)
	}
	m := decode(t, out)
	if v := m["violations"].(float64); v == 0 {
		t.Error("a lock without mutual exclusion reported no violations")
	}
	if !strings.Contains(errOut, "overlapped") {
		t.Errorf("stderr %q does not name the violations", errOut)
	}
}

func TestRunInterrupted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	res, err := lockbench.Run(ctx, lockbench.Config{
		Algo: lockbench.Llmgate(), Store: "memory", Workers: 2, Keys: 1,
		Duration: time.Minute, MaxOps: 1 << 40, TTL: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Interrupted || res.Acquisitions == 0 || res.DurationS > 30 {
		t.Errorf("interrupted run: %+v", res)
	}
}

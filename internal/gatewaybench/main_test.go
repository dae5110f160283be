package gatewaybench

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/internal/testutil"
)

func runMain(t *testing.T, f GatewayFactory, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(testContext(t), args, &stdout, &stderr, f)
	return code, stdout.String(), stderr.String()
}

func TestMainHelp(t *testing.T) {
	code, out, errOut := runMain(t, nil, "--help")
	if code != ExitOK || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, flag := range []string{"--duration", "--reps", "--concurrency", "--variants", "--redis", "--stream", "--cpuprofile", "--json"} {
		if !strings.Contains(out, flag) {
			t.Errorf("help lacks %s:\n%s", flag, out)
		}
	}
}

func TestMainUsageErrors(t *testing.T) {
	f := (&fakeFactory{}).build
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--frobnicate"}, "frobnicate"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"--concurrency", "1,x"}, "--concurrency"},
		{[]string{"--concurrency", "0"}, "between 1 and"},
		{[]string{"--concurrency", "4,4"}, "twice"},
		{[]string{"--duration", "-1s"}, "--duration"},
		{[]string{"--reps", "0"}, "--reps"},
		{[]string{"--max-requests", "0"}, "--max-requests"},
		{[]string{"--variants", "proxy,memory"}, "must include direct"},
		{[]string{"--variants", "direct,nginx"}, "unknown variant"},
		{[]string{"--variants", "direct", "--redis", "127.0.0.1:1"}, "--redis is given"},
		{[]string{"--redis", "http://x"}, "--redis"},
		{[]string{"--profile-variant", "proxy"}, "--cpuprofile"},
		{[]string{"--variants", "direct,proxy", "--mutexprofile", "x.prof"}, "not among --variants"},
		{[]string{"--variants", "direct", "--cpuprofile", "x.prof"}, "not among --variants"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := runMain(t, f, tc.args...)
			if code != ExitUsage || out != "" || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and %q", code, out, errOut, tc.want)
			}
		})
	}
	// An output file that cannot be created fails before any measuring.
	if code, out, errOut := runMain(t, f, "--variants", "direct", "--out", filepath.Join(t.TempDir(), "no", "x.json")); code != ExitFail || out != "" || !strings.Contains(errOut, "x.json") {
		t.Fatalf("bad --out: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Gateway variants without a factory cannot run.
	if code, _, errOut := runMain(t, nil, "--variants", "direct,memory"); code != ExitUsage || !strings.Contains(errOut, "GatewayFactory") {
		t.Fatalf("no factory: exit %d, stderr %q", code, errOut)
	}
}

// TestMainJSON: --json prints one object with every cell, and
// --cpuprofile writes a profile of the chosen variant.
func TestMainJSON(t *testing.T) {
	prof, mutex := filepath.Join(t.TempDir(), "cpu.prof"), filepath.Join(t.TempDir(), "mutex.prof")
	code, out, errOut := runMain(t, (&fakeFactory{}).build, "--duration", "100ms", "--reps", "1", "--concurrency", "1,2",
		"--variants", "direct,proxy,memory", "--json", "--cpuprofile", prof, "--mutexprofile", mutex)
	if code != ExitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	var res Result
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&res); err != nil || dec.More() {
		t.Fatalf("stdout is not one JSON object (%v):\n%s", err, out)
	}
	checkSane(t, &res, []string{VariantDirect, VariantProxy, VariantMemory}, 3)
	if res.Profiled == nil || res.Profiled.Variant != VariantMemory || res.Profiled.Concurrency != 2 || res.Profiled.Requests == 0 {
		t.Errorf("profiled run: %+v", res.Profiled)
	}
	for _, p := range []string{prof, mutex} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("no profile in %s: %v", p, err)
		}
	}
}

// TestMainTable: the table names every variant and the targets, and a run
// with failed requests exits 1.
func TestMainTable(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "result.json")
	code, out, errOut := runMain(t, (&fakeFactory{}).build, "--duration", "50ms", "--reps", "1", "--concurrency", "1",
		"--variants", "direct,proxy,memory", "--out", jsonPath)
	if code != ExitOK && !(code == ExitFail && onlyProxyCut(errOut)) {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := json.Unmarshal(b, &res); err != nil || len(res.Summaries) != 6 {
		t.Errorf("--out: %v, %d summaries:\n%s", err, len(res.Summaries), b)
	}
	for _, s := range []string{"direct", "proxy", "memory", "stream c=1", "targets"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
	// Each memory target gets a verdict; which one depends on the machine's
	// load, so either is accepted here (speed is not asserted in tests).
	if n := strings.Count(out, "PASS") + strings.Count(out, "MISS"); n < 3 {
		t.Errorf("table has %d target verdicts, want at least 3 (the memory targets):\n%s", n, out)
	}
	failing := &fakeFactory{wrap: func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusBadGateway) })
	}}
	code, out, errOut = runMain(t, failing.build, "--duration", "50ms", "--reps", "1", "--concurrency", "1", "--stream=false",
		"--variants", "direct,memory")
	if code != ExitFail || !strings.Contains(errOut, "FLAGGED") || !strings.Contains(out, "FLAGGED") || !strings.Contains(errOut, "status 502") ||
		!strings.Contains(errOut, "requests failed (memory ") {
		t.Fatalf("failing gateway: exit %d, stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// onlyProxyCut reports whether a flagged run's one failure is the rare
// "unexpected EOF" of a stream through httputil.ReverseProxy (see
// checkSane), which every variant of these tests is.
func onlyProxyCut(stderr string) bool {
	return strings.Contains(stderr, "FLAGGED: 1 requests failed (") && strings.Contains(stderr, "unexpected EOF")
}

// TestMainRedis: the redis variant runs on the Redis given with --redis,
// and its server CPU per request is read.
func TestMainRedis(t *testing.T) {
	r := testutil.StartRedis(t)
	f := &fakeFactory{}
	// No streams: the rare cut of a stream by httputil.ReverseProxy (the
	// stand-in for llmgate here, see checkSane) would flag the run.
	code, out, errOut := runMain(t, f.build, "--duration", "100ms", "--reps", "1", "--concurrency", "1",
		"--variants", "direct,redis", "--redis", r.Addr, "--json", "--stream=false")
	if code != ExitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	if len(f.stores) != 1 || f.stores[0] != r.URL() {
		t.Fatalf("factory stores %q, want [%s]", f.stores, r.URL())
	}
	var res Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Redis != r.URL() {
		t.Errorf("result names Redis %q", res.Redis)
	}
}

//go:build unix

package e2eutil

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmgate/llmgate/internal/testutil"
)

// Bounds of the end-to-end tests.
const (
	// replicaLifetime bounds every gateway process a test starts.
	replicaLifetime = 5 * time.Minute
	// ReplicaStartup bounds the wait for a replica to listen and be ready.
	ReplicaStartup = 60 * time.Second
	// ReplicaStop bounds a replica's graceful shutdown at the end of a test.
	ReplicaStop = 20 * time.Second
)

// LogRuntime logs how long the test ran, when it ends.
func LogRuntime(t testing.TB) {
	start := time.Now()
	t.Cleanup(func() { t.Logf("runtime %v", time.Since(start).Round(time.Millisecond)) })
}

// Replica is one 'llmgate serve' process.
type Replica struct {
	Name   string
	Cmd    *exec.Cmd
	Stderr *testutil.Buffer
	Stdout *testutil.Buffer
	URL    string        // http://127.0.0.1:PORT, once ready
	Done   chan struct{} // closed when the process has exited
}

// listeningRE finds the address in serve's "listening" log line.
var listeningRE = regexp.MustCompile(`llmgate gateway listening.*addr=http://(127\.0\.0\.1:[0-9]+)/v1`)

// Launch starts 'llmgate serve' (the binary Build made) with args and env
// added to a clean environment (no LLMGATE_*, OPENAI_API_KEY or
// XDG_STATE_HOME of the test's own). When the test ends the process gets
// SIGTERM (SIGKILL if it does not stop within ReplicaStop), and its output
// is checked for secrets and data races.
func Launch(t testing.TB, name string, env []string, args ...string) *Replica {
	t.Helper()
	if bin == "" {
		t.Fatal("e2eutil.Build was not called (from TestMain)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), replicaLifetime)
	cmd := exec.CommandContext(ctx, bin, append([]string{"serve"}, args...)...)
	// Each test keeps its own state directory: tests run in parallel,
	// and two memory stores must not share a budget file.
	cmd.Env = append(append(cleanEnv(), "XDG_STATE_HOME="+stateHome(t)), env...)
	r := &Replica{Name: name, Cmd: cmd, Stderr: testutil.NewBuffer(), Stdout: testutil.NewBuffer(), Done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.Stdout, r.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	setDeathSignal(cmd.SysProcAttr)
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		defer cancel()
		_ = cmd.Wait()
		close(r.Done)
	}()
	// Registered first so that it runs last, after the process stopped.
	t.Cleanup(func() {
		out := r.Stderr.String() + r.Stdout.String()
		AssertNoSecrets(t, name+" output", out)
		if strings.Contains(out, "WARNING: DATA RACE") {
			t.Errorf("%s: the race detector fired:\n%s", name, out)
		}
	})
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// stateHomes holds each running test's state directory, by test.
var stateHomes sync.Map

// stateHome is t's XDG_STATE_HOME, the same for every replica of t, so
// that a replica restarted in t finds what it wrote.
func stateHome(t testing.TB) string {
	if d, ok := stateHomes.Load(t); ok {
		return d.(string)
	}
	d := t.TempDir()
	stateHomes.Store(t, d)
	t.Cleanup(func() { stateHomes.Delete(t) })
	return d
}

// cleanEnv is the test's environment without the settings that would
// change what a replica does.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "LLMGATE_") || k == "OPENAI_API_KEY" || k == "XDG_STATE_HOME" || strings.HasPrefix(k, "E2E_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// StartReplicas starts n replicas on cfg in parallel and waits until all
// are ready.
func StartReplicas(t testing.TB, n int, cfg GatewayConfig) []*Replica {
	t.Helper()
	rs := make([]*Replica, n)
	for i := range rs {
		rs[i] = LaunchReplica(t, fmt.Sprintf("replica-%c", 'A'+i), cfg)
	}
	for _, r := range rs {
		r.WaitReady(t)
	}
	return rs
}

// LaunchReplica writes cfg to a file and starts 'llmgate serve --config'
// on it; call WaitReady before using it.
func LaunchReplica(t testing.TB, name string, cfg GatewayConfig) *Replica {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(cfg.YAML()), 0o600); err != nil {
		t.Fatal(err)
	}
	return Launch(t, name, Env, "--config", path)
}

// StartReplicasYAML starts n replicas on one configuration file with the
// given content and waits until all are ready.
func StartReplicasYAML(t testing.TB, n int, yaml string) []*Replica {
	t.Helper()
	path := filepath.Join(t.TempDir(), "llmgate.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	rs := make([]*Replica, n)
	for i := range rs {
		rs[i] = Launch(t, fmt.Sprintf("replica-%c", 'A'+i), Env, "--config", path)
	}
	for _, r := range rs {
		r.WaitReady(t)
	}
	return rs
}

// WaitReady waits for the replica's listening line, then polls /readyz
// until it answers 200.
func (r *Replica) WaitReady(t testing.TB) {
	t.Helper()
	deadline := time.NewTimer(ReplicaStartup)
	defer deadline.Stop()
	for r.URL == "" {
		have, changed := r.Stderr.Snapshot()
		m := listeningRE.FindStringSubmatch(have)
		if m != nil {
			r.URL = "http://" + m[1]
			break
		}
		select {
		case <-changed:
		case <-r.Done:
			t.Fatalf("%s exited before listening: %s", r.Name, r.Stderr.String())
		case <-deadline.C:
			t.Fatalf("%s did not listen within %v: %s", r.Name, ReplicaStartup, r.Stderr.String())
		}
	}
	// A health endpoint has nothing to wait on but itself: poll it.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/readyz", nil)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		resp, err := HTTP.Do(req)
		cancel()
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-tick.C:
		case <-r.Done:
			t.Fatalf("%s exited before it was ready: %s", r.Name, r.Stderr.String())
		case <-deadline.C:
			t.Fatalf("%s not ready within %v (last: %v): %s", r.Name, ReplicaStartup, err, r.Stderr.String())
		}
	}
}

// Stop sends SIGTERM and waits for the exit, or kills after ReplicaStop.
// SIGINT follows at once: a second signal skips the drain delay (5s by
// default) and the grace, which a test's end has no use for (requests
// still running are cut and settled).
func (r *Replica) Stop(t testing.TB) {
	select {
	case <-r.Done:
		return
	default:
	}
	_ = r.Cmd.Process.Signal(syscall.SIGTERM)
	_ = r.Cmd.Process.Signal(syscall.SIGINT) // another signal: SIGTERM twice could merge into one
	select {
	case <-r.Done:
	case <-time.After(ReplicaStop):
		t.Errorf("%s did not stop within %v of SIGTERM; killed", r.Name, ReplicaStop)
		_ = r.Cmd.Process.Kill()
		<-r.Done
	}
}

// Kill sends SIGKILL and waits until the process is gone.
func (r *Replica) Kill(t testing.TB) {
	t.Helper()
	if err := r.Cmd.Process.Kill(); err != nil {
		t.Fatalf("kill %s: %v", r.Name, err)
	}
	select {
	case <-r.Done:
	case <-time.After(ReplicaStop):
		t.Fatalf("%s still running %v after SIGKILL", r.Name, ReplicaStop)
	}
}

// Pause stops the replica's process with SIGSTOP, as a stalled VM or a
// debugger would, and returns how to let it run again; the test's cleanup
// lets it run in any case, before the replica is stopped.
func (r *Replica) Pause(t testing.TB) (resume func()) {
	t.Helper()
	pid := r.Cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %s: %v", r.Name, err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT %s: %v", r.Name, err)
			}
		})
	}
	t.Cleanup(resume)
	return resume
}

// HTTP is the HTTP client of the tests: enough idle connections for every
// concurrent client, so a burst does not churn through ports.
var HTTP = &http.Client{Transport: &http.Transport{
	MaxIdleConns:        256,
	MaxIdleConnsPerHost: 128,
	IdleConnTimeout:     30 * time.Second,
}}

// SDK returns an official SDK client for the replica, without retries.
func (r *Replica) SDK(key string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(r.URL+"/v1/"),
		option.WithAPIKey(key),
		option.WithMaxRetries(0),
		option.WithHTTPClient(HTTP),
	)
}

// Post sends a raw JSON request to the replica and returns the response
// with its body read; it fails the test on a transport error (call it
// from the test's goroutine). hdr are header names and values.
func (r *Replica) Post(t testing.TB, ctx context.Context, path, key, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	resp, b, err := r.TryPost(ctx, path, key, body, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// TryPost is Post returning the transport error, for other goroutines.
func (r *Replica) TryPost(ctx context.Context, path, key, body string, hdr ...string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL+path, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := HTTP.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("POST %s%s: %w", r.Name, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("POST %s%s: reading the answer: %w", r.Name, path, err)
	}
	return resp, b, nil
}

// Get sends GET with an optional bearer token and decodes a 200 JSON
// answer into v.
func (r *Replica) Get(ctx context.Context, path, token string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+path, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return json.Unmarshal(b, v)
}

// Metric returns the value of one series of the replica's /metrics, its
// name and labels written as Prometheus prints them (for example
// `llmgate_dedup_total{role="follower"}`); 0 when the series is absent
// (a counter vector shows a label only once it was used).
func (r *Replica) Metric(ctx context.Context, series string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s/metrics: %d", r.Name, resp.StatusCode)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), series+" ")
		if !ok {
			continue
		}
		f, _, _ := strings.Cut(v, " ") // a timestamp may follow
		return strconv.ParseFloat(f, 64)
	}
	return 0, sc.Err()
}

// SumMetric adds up one series over the replicas (call it from the test's
// goroutine).
func SumMetric(t testing.TB, ctx context.Context, reps []*Replica, series string) float64 {
	t.Helper()
	var sum float64
	for _, r := range reps {
		v, err := r.Metric(ctx, series)
		if err != nil {
			t.Fatalf("%s %s: %v", r.Name, series, err)
		}
		sum += v
	}
	return sum
}

// Reply is what a client got for one request.
type Reply struct {
	Status int // 0 on a transport error
	Header http.Header
	Body   []byte
	Err    error
	Done   time.Time
}

// Send posts a chat completion body through r with tenant team-a's key and
// returns what came back; safe from any goroutine.
func Send(ctx context.Context, r *Replica, body string, hdr ...string) Reply {
	resp, b, err := r.TryPost(ctx, "/v1/chat/completions", TenantKey, body, hdr...)
	rep := Reply{Err: err, Body: b, Done: time.Now()}
	if err == nil {
		rep.Status, rep.Header = resp.StatusCode, resp.Header
	}
	return rep
}

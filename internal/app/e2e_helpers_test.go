//go:build unix

package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// Secrets the end-to-end tests hand to the gateway replicas. None of them
// may ever show up in a replica's output.
const (
	e2eProviderKey = "sk-e2e-provider-7f3a9c41d2"
	e2eOtherKey    = "sk-e2e-other-key-88e0b6a3" // a key the provider refuses
	e2eTenantKey   = "sk-e2e-tenant-51b2d8e7f0"
	e2eAdminToken  = "e2e-admin-token-c04e1f93"
	e2eRedisPass   = "e2e-redis-pass-9d7b22c5"
)

// e2eSecrets lists every secret for the log checks.
var e2eSecrets = []string{e2eProviderKey, e2eOtherKey, e2eTenantKey, e2eAdminToken, e2eRedisPass}

// e2eEnv is the environment of every replica: where the configuration's
// *_env settings find the secrets.
var e2eEnv = []string{
	"E2E_PROVIDER_KEY=" + e2eProviderKey,
	"E2E_OTHER_KEY=" + e2eOtherKey,
	"E2E_TENANT_KEY=" + e2eTenantKey,
	"LLMGATE_ADMIN_TOKEN=" + e2eAdminToken,
}

// Bounds of the end-to-end tests.
const (
	// replicaLifetime bounds every gateway process a test starts.
	replicaLifetime = 5 * time.Minute
	// replicaStartup bounds the wait for a replica to listen and be ready.
	replicaStartup = 60 * time.Second
	// replicaStop bounds a replica's graceful shutdown at the end of a test.
	replicaStop = 20 * time.Second
)

// logRuntime logs how long the test ran, when it ends.
func logRuntime(t *testing.T) {
	start := time.Now()
	t.Cleanup(func() { t.Logf("runtime %v", time.Since(start).Round(time.Millisecond)) })
}

// e2eSim is a simulated provider on a loopback HTTP server that records
// when each chat completion request arrived.
type e2eSim struct {
	*sim.Server
	url string // the OpenAI base URL, ending in /v1

	mu       sync.Mutex             // protects arrivals, limited
	arrivals map[string][]time.Time // chat completion requests by model, in arrival order
	limited  map[string][]time.Time // arrival times of the requests it answered 429

	// hideLimits drops the x-ratelimit-* headers of every answer, 429s
	// included, as providers that do not advertise their quota do: the
	// gateway then learns about the quota only from a 429's message.
	hideLimits bool
}

// statusWriter records the status a handler writes.
type statusWriter struct {
	http.ResponseWriter
	status     int
	hideLimits bool
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	if w.hideLimits {
		for k := range w.Header() {
			if strings.HasPrefix(k, "X-Ratelimit-") {
				w.Header().Del(k)
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func newE2ESim(t *testing.T, cfg sim.Config) *e2eSim {
	t.Helper()
	srv, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &e2eSim{Server: srv, arrivals: map[string][]time.Time{}, limited: map[string][]time.Time{}}
	h := srv.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
			h.ServeHTTP(w, r)
			return
		}
		now := time.Now()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(body, &req)
		s.mu.Lock()
		s.arrivals[req.Model] = append(s.arrivals[req.Model], now)
		s.mu.Unlock()
		sw := &statusWriter{ResponseWriter: w, hideLimits: s.hideLimits}
		h.ServeHTTP(sw, r)
		if sw.status == http.StatusTooManyRequests {
			s.mu.Lock()
			s.limited[req.Model] = append(s.limited[req.Model], now)
			s.mu.Unlock()
		}
	}))
	t.Cleanup(hs.Close)
	s.url = hs.URL + "/v1"
	return s
}

// Arrivals returns a copy of the arrival times so far of the chat
// completion requests for model, and those of the ones answered 429.
func (s *e2eSim) Arrivals(model string) (all, limited []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.arrivals[model]...), append([]time.Time(nil), s.limited[model]...)
}

// gatewayConfig is the YAML configuration of the test replicas: one
// provider "sim" (the test's simulated provider, model gpt-4.1, key in
// $E2E_PROVIDER_KEY) and one tenant "team-a" (key in $E2E_TENANT_KEY).
type gatewayConfig struct {
	Store          string
	SimURL         string
	Limits         string // the provider's limits, a YAML flow mapping; "" for none
	MaxWait        string // "" for the default
	RequestTimeout string // "" for the default
	MaxAttempts    int    // 0 for the default
	LogLevel       string // "" for debug
	Budget         string // the tenant's budget, a YAML flow mapping; "" for none
	// Extra is YAML appended at the top level (for example "budget: ...").
	Extra string
	// Models are the models of provider "sim"; default gpt-4.1.
	Models []string
	// BadProvider adds a provider "other" on the same simulated upstream
	// with a key it refuses ($E2E_OTHER_KEY), serving model gpt-4.1-mini.
	BadProvider bool
}

func (c gatewayConfig) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nstore: %q\n", c.Store)
	if c.MaxWait != "" {
		fmt.Fprintf(&b, "max_wait: %s\n", c.MaxWait)
	}
	if c.RequestTimeout != "" {
		fmt.Fprintf(&b, "request_timeout: %s\n", c.RequestTimeout)
	}
	level := c.LogLevel
	if level == "" {
		level = "debug"
	}
	fmt.Fprintf(&b, "log: {level: %s}\n", level)
	b.WriteString("upstream:\n  backoff_base: 10ms\n  backoff_max: 100ms\n")
	if c.MaxAttempts != 0 {
		fmt.Fprintf(&b, "  max_attempts: %d\n", c.MaxAttempts)
	}
	models := "gpt-4.1"
	if len(c.Models) > 0 {
		models = strings.Join(c.Models, ", ")
	}
	fmt.Fprintf(&b, "providers:\n  - name: sim\n    base_url: %s\n    api_key_env: E2E_PROVIDER_KEY\n    models: [%s]\n", c.SimURL, models)
	if c.Limits != "" {
		fmt.Fprintf(&b, "    limits: %s\n", c.Limits)
	}
	if c.BadProvider {
		fmt.Fprintf(&b, "  - name: other\n    base_url: %s\n    api_key_env: E2E_OTHER_KEY\n    models: [gpt-4.1-mini]\n", c.SimURL)
	}
	b.WriteString("tenants:\n  - name: team-a\n    api_key_env: E2E_TENANT_KEY\n")
	if c.Budget != "" {
		fmt.Fprintf(&b, "    budget: %s\n", c.Budget)
	}
	b.WriteString(c.Extra)
	return b.String()
}

// replica is one 'llmgate serve' process.
type replica struct {
	name   string
	cmd    *exec.Cmd
	stderr *testutil.Buffer
	stdout *testutil.Buffer
	url    string        // http://127.0.0.1:PORT, once ready
	done   chan struct{} // closed when the process has exited
}

// gatewayListeningRE finds the address in serve's "listening" log line.
var gatewayListeningRE = regexp.MustCompile(`llmgate gateway listening.*addr=http://(127\.0\.0\.1:[0-9]+)/v1`)

// launchServe starts 'llmgate serve' with args and env added to a clean
// environment (no LLMGATE_*, OPENAI_API_KEY or XDG_STATE_HOME of the test's
// own). When the test ends the process gets SIGTERM (SIGKILL if it does not
// stop within replicaStop), and its output is checked for secrets and data
// races.
func launchServe(t *testing.T, name string, env []string, args ...string) *replica {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), replicaLifetime)
	cmd := exec.CommandContext(ctx, llmgateBin, append([]string{"serve"}, args...)...)
	// Each test keeps its own state directory: tests run in parallel,
	// and two memory stores must not share a budget file.
	cmd.Env = append(append(cleanEnv(), "XDG_STATE_HOME="+stateHome(t)), env...)
	r := &replica{name: name, cmd: cmd, stderr: testutil.NewBuffer(), stdout: testutil.NewBuffer(), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.stdout, r.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	setDeathSignal(cmd.SysProcAttr) // no replica outlives a test binary that crashed
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		defer cancel()
		_ = cmd.Wait()
		close(r.done)
	}()
	// Registered first so that it runs last, after the process stopped.
	t.Cleanup(func() {
		out := r.stderr.String() + r.stdout.String()
		assertNoSecrets(t, name+" output", out)
		if strings.Contains(out, "WARNING: DATA RACE") {
			t.Errorf("%s: the race detector fired:\n%s", name, out)
		}
	})
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stateHomes holds each running test's state directory, by *testing.T.
var stateHomes sync.Map

// stateHome is t's XDG_STATE_HOME, the same for every replica of t, so
// that a replica restarted in t finds what it wrote.
func stateHome(t *testing.T) string {
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

// startReplicas starts n replicas on cfg in parallel and waits until all
// are ready.
func startReplicas(t *testing.T, n int, cfg gatewayConfig) []*replica {
	t.Helper()
	rs := make([]*replica, n)
	for i := range rs {
		rs[i] = launchReplica(t, fmt.Sprintf("replica-%c", 'A'+i), cfg)
	}
	for _, r := range rs {
		r.waitReady(t)
	}
	return rs
}

// launchReplica writes cfg to a file and starts 'llmgate serve --config'
// on it; call waitReady before using it.
func launchReplica(t *testing.T, name string, cfg gatewayConfig) *replica {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(cfg.yaml()), 0o600); err != nil {
		t.Fatal(err)
	}
	return launchServe(t, name, e2eEnv, "--config", path)
}

// waitReady waits for the replica's listening line, then polls /readyz
// until it answers 200.
func (r *replica) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.NewTimer(replicaStartup)
	defer deadline.Stop()
	for r.url == "" {
		have, changed := r.stderr.Snapshot()
		m := gatewayListeningRE.FindStringSubmatch(have)
		if m != nil {
			r.url = "http://" + m[1]
			break
		}
		select {
		case <-changed:
		case <-r.done:
			t.Fatalf("%s exited before listening: %s", r.name, r.stderr.String())
		case <-deadline.C:
			t.Fatalf("%s did not listen within %v: %s", r.name, replicaStartup, r.stderr.String())
		}
	}
	// A health endpoint has nothing to wait on but itself: poll it.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url+"/readyz", nil)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		resp, err := e2eHTTP.Do(req)
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
		case <-r.done:
			t.Fatalf("%s exited before it was ready: %s", r.name, r.stderr.String())
		case <-deadline.C:
			t.Fatalf("%s not ready within %v (last: %v): %s", r.name, replicaStartup, err, r.stderr.String())
		}
	}
}

// stop sends SIGTERM and waits for the exit, or kills after replicaStop.
// SIGINT follows at once: a second signal skips the drain delay (5s by
// default) and the grace, which a test's end has no use for (requests
// still running are cut and settled).
func (r *replica) stop(t *testing.T) {
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	_ = r.cmd.Process.Signal(syscall.SIGINT) // another signal: SIGTERM twice could merge into one
	select {
	case <-r.done:
	case <-time.After(replicaStop):
		t.Errorf("%s did not stop within %v of SIGTERM; killed", r.name, replicaStop)
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// kill sends SIGKILL and waits until the process is gone.
func (r *replica) kill(t *testing.T) {
	t.Helper()
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill %s: %v", r.name, err)
	}
	select {
	case <-r.done:
	case <-time.After(replicaStop):
		t.Fatalf("%s still running %v after SIGKILL", r.name, replicaStop)
	}
}

// assertNoSecrets fails the test if text holds any of the e2e secrets.
func assertNoSecrets(t *testing.T, where, text string) {
	t.Helper()
	for _, s := range e2eSecrets {
		if strings.Contains(text, s) {
			t.Errorf("%s shows the secret %s... (as <SECRET> below):\n%s", where, s[:6], strings.ReplaceAll(text, s, "<SECRET>"))
		}
	}
}

// e2eHTTP is the HTTP client of the tests: enough idle connections for
// every concurrent client, so a burst does not churn through ports.
var e2eHTTP = &http.Client{Transport: &http.Transport{
	MaxIdleConns:        256,
	MaxIdleConnsPerHost: 128,
	IdleConnTimeout:     30 * time.Second,
}}

// sdk returns an official SDK client for the replica, without retries.
func (r *replica) sdk(key string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(r.url+"/v1/"),
		option.WithAPIKey(key),
		option.WithMaxRetries(0),
		option.WithHTTPClient(e2eHTTP),
	)
}

// post sends a raw JSON request to the replica and returns the response
// with its body read; it fails the test on a transport error (call it
// from the test's goroutine).
func (r *replica) post(t *testing.T, ctx context.Context, path, key, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	resp, b, err := r.tryPost(ctx, path, key, body, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// tryPost is post returning the transport error, for other goroutines.
func (r *replica) tryPost(ctx context.Context, path, key, body string, hdr ...string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+path, strings.NewReader(body))
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
	resp, err := e2eHTTP.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("POST %s%s: %w", r.name, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("POST %s%s: reading the answer: %w", r.name, path, err)
	}
	return resp, b, nil
}

// get sends GET with an optional bearer token and decodes a 200 JSON
// answer into v.
func (r *replica) get(ctx context.Context, path, token string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url+path, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e2eHTTP.Do(req)
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

// apiError is the OpenAI error body.
type apiErrorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, b []byte) apiErrorBody {
	t.Helper()
	var e apiErrorBody
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Code == "" {
		t.Fatalf("not an OpenAI error body (%v): %s", err, b)
	}
	return e
}

// sdkError returns the SDK's API error, or nil if err is another kind.
func sdkError(err error) *openai.Error {
	var e *openai.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// chatParams is a short chat completion for gpt-4.1.
func chatParams(prompt string, maxTokens int64) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:    "gpt-4.1",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
	}
	if maxTokens > 0 {
		p.MaxCompletionTokens = openai.Int(maxTokens)
	}
	return p
}

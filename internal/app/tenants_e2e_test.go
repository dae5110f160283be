//go:build unix

package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// propagation is the promise: a change made through the admin API on one
// replica is in force on every replica within a second.
const propagation = time.Second

// adminDo sends an admin API request with the admin token and returns the
// status and body (it fails the test on a transport error).
func adminDo(t *testing.T, ctx context.Context, r *replica, method, path, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e2eutil.AdminToken)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e2eutil.HTTP.Do(req)
	if err != nil {
		t.Fatalf("%s %s%s: %v", method, r.Name, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// authStatus asks r for its models with key: 200 when a tenant has the
// key, 401 when none does (no upstream call, so it measures only
// authentication).
func authStatus(ctx context.Context, r *replica, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/v1/models", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := e2eutil.HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// waitAuth polls authStatus until it is want and returns how long after
// since that was; it fails the test past bound.
func waitAuth(t *testing.T, ctx context.Context, r *replica, key string, want int, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := authStatus(ctx, r, key)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(since)
		if got == want {
			if took > bound {
				t.Errorf("%s: %d after %v, more than %v", r.Name, want, took, bound)
			}
			return took
		}
		if took > bound {
			t.Fatalf("%s: still %d after %v, want %d", r.Name, got, bound, want)
		}
		<-tick.C
	}
}

// chatStatus sends a small chat request with key and returns its status.
func chatStatus(t *testing.T, ctx context.Context, r *replica, key string) (int, string) {
	t.Helper()
	resp, b := r.Post(t, ctx, "/v1/chat/completions", key, `{"model":"gpt-4.1","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	code := ""
	if resp.StatusCode != http.StatusOK {
		code = decodeError(t, b).Error.Code
	}
	return resp.StatusCode, code
}

// roundTrip measures a cheap request to r (the median of 5): the slack a
// time bound over the network allows on a loaded machine.
func roundTrip(t *testing.T, ctx context.Context, r *replica) time.Duration {
	t.Helper()
	var ds []time.Duration
	for range 5 {
		start := time.Now()
		var v any
		if err := r.Get(ctx, "/v1/models", e2eutil.TenantKey, &v); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// waitStatus sends chat requests with key to r until one gets want, and
// returns how long after since that was; it fails the test past bound.
func waitStatus(t *testing.T, ctx context.Context, r *replica, key string, want int, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		got, code := chatStatus(t, ctx, r, key)
		if got == want {
			took := time.Since(since)
			if took > bound {
				t.Errorf("%s: %d after %v, more than %v", r.Name, want, took, bound)
			}
			return took
		}
		if time.Since(since) > bound {
			t.Fatalf("%s: still %d %s after %v, want %d", r.Name, got, code, bound, want)
		}
		<-tick.C
	}
}

// TestTenantsManagedAtRunTime: a tenant and its key created through the
// admin API of one replica work on the other within a second; a raised
// limit changes admissions there; a revoked key gets 401 on every replica
// within a second; the changes are audited, the keys never logged.
func TestTenantsManagedAtRunTime(t *testing.T) {
	e2eutil.LogRuntime(t)
	rds := testutil.StartRedis(t)
	s := newE2ESim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 2, gatewayConfig{Store: rds.URL(), SimURL: s.url, LogLevel: "info"})
	a, b := reps[0], reps[1]
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	bound := propagation + 2*max(roundTrip(t, ctx, a), roundTrip(t, ctx, b))

	// Created on A, in force on B.
	st, body := adminDo(t, ctx, a, http.MethodPost, "/admin/tenants",
		`{"name":"runtime-1","limits":{"rpm":1},"max_wait":"0s","budget":{"period":"month","usd":5}}`)
	created := time.Now()
	if st != http.StatusCreated {
		t.Fatalf("POST /admin/tenants: %d %s", st, body)
	}
	var cr struct {
		KeyID  string `json:"key_id"`
		APIKey string `json:"api_key"`
		Tenant struct {
			Name   string `json:"name"`
			Source string `json:"source"`
		} `json:"tenant"`
	}
	if err := json.Unmarshal(body, &cr); err != nil || cr.APIKey == "" || cr.Tenant.Name != "runtime-1" {
		t.Fatalf("POST /admin/tenants answered %s (%v)", body, err)
	}
	key1 := cr.APIKey
	t.Cleanup(func() {
		for _, r := range reps {
			if out := r.Stderr.String() + r.Stdout.String(); strings.Contains(out, key1) {
				t.Errorf("%s logged a tenant key made by the admin API", r.Name)
			}
		}
	})
	took := waitAuth(t, ctx, b, key1, http.StatusOK, created, bound)
	t.Logf("a new tenant's key worked on the other replica %v after it was created", took.Round(time.Millisecond))

	// Its limit (1 per minute, no wait) holds on both, then raised on B,
	// in force on A.
	if st, code := chatStatus(t, ctx, b, key1); st != http.StatusOK {
		t.Fatalf("the new tenant's first chat request: %d %s", st, code)
	}
	if st, code := chatStatus(t, ctx, a, key1); st != http.StatusTooManyRequests {
		t.Fatalf("second request in the minute with rpm 1: %d %s, want 429", st, code)
	}
	// Raised so far that the tenant's bucket, empty, refills in
	// milliseconds (a raised limit refills at the new rate; the bucket does
	// not start full).
	st, body = adminDo(t, ctx, b, http.MethodPatch, "/admin/tenants/runtime-1", `{"limits":{"rpm":600000}}`)
	raised := time.Now()
	if st != http.StatusOK || !strings.Contains(string(body), `"rpm":600000`) {
		t.Fatalf("PATCH: %d %s", st, body)
	}
	took = waitStatus(t, ctx, a, key1, http.StatusOK, raised, bound)
	t.Logf("a raised limit admitted a request on the other replica %v after the change", took.Round(time.Millisecond))

	// Rotation: a second key, then the first revoked.
	st, body = adminDo(t, ctx, a, http.MethodPost, "/admin/tenants/runtime-1/keys", "")
	added := time.Now()
	var kr struct {
		KeyID  string `json:"key_id"`
		APIKey string `json:"api_key"`
	}
	if st != http.StatusCreated || json.Unmarshal(body, &kr) != nil || kr.APIKey == "" {
		t.Fatalf("POST keys: %d %s", st, body)
	}
	waitAuth(t, ctx, b, kr.APIKey, http.StatusOK, added, bound)
	st, body = adminDo(t, ctx, a, http.MethodDelete, "/admin/tenants/runtime-1/keys/"+cr.KeyID, "")
	revoked := time.Now()
	if st != http.StatusOK {
		t.Fatalf("DELETE key: %d %s", st, body)
	}
	for _, r := range reps {
		took := waitAuth(t, ctx, r, key1, http.StatusUnauthorized, revoked, bound)
		t.Logf("the revoked key got 401 on %s %v after the revocation", r.Name, took.Round(time.Millisecond))
	}
	for _, r := range reps {
		if st, code := chatStatus(t, ctx, r, kr.APIKey); st != http.StatusOK {
			t.Errorf("the rotated-in key on %s: %d %s", r.Name, st, code)
		}
	}

	// The file's tenant is not the API's to change; unknown fields and
	// bad limits are refused in OpenAI's error shape.
	for _, c := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{http.MethodPatch, "/admin/tenants/team-a", `{"limits":{"rpm":5}}`, http.StatusConflict, "tenant_in_config_file"},
		{http.MethodPost, "/admin/tenants", `{"name":"runtime-1"}`, http.StatusConflict, "tenant_exists"},
		{http.MethodPost, "/admin/tenants", `{"name":"x","colour":"red"}`, http.StatusBadRequest, "invalid_request_error"},
		{http.MethodPost, "/admin/tenants", `{"name":"y","models":["no-such-model"]}`, http.StatusBadRequest, "invalid_request_error"},
		{http.MethodPatch, "/admin/tenants/runtime-1", `{"limits":{"rpm":-1}}`, http.StatusBadRequest, "invalid_request_error"},
		{http.MethodDelete, "/admin/tenants/nobody", "", http.StatusNotFound, "unknown_tenant"},
	} {
		st, body := adminDo(t, ctx, b, c.method, c.path, c.body)
		var e apiErrorBody
		_ = json.Unmarshal(body, &e)
		if st != c.status || e.Error.Message == "" || (e.Error.Code != c.code && e.Error.Type != c.code) {
			t.Errorf("%s %s %s: %d %s, want %d %s", c.method, c.path, c.body, st, body, c.status, c.code)
		}
	}

	// Deleted: every key of the tenant is refused everywhere.
	if st, body := adminDo(t, ctx, b, http.MethodDelete, "/admin/tenants/runtime-1", ""); st != http.StatusOK {
		t.Fatalf("DELETE tenant: %d %s", st, body)
	}
	deleted := time.Now()
	for _, r := range reps {
		waitAuth(t, ctx, r, kr.APIKey, http.StatusUnauthorized, deleted, bound)
	}
	if st, _ := chatStatus(t, ctx, a, e2eutil.TenantKey); st != http.StatusOK {
		t.Errorf("the file's tenant: %d", st)
	}

	// Audited: who (the admin token's hash prefix), what; never a key.
	who := tokenHash(e2eutil.AdminToken)[:8]
	for _, want := range []string{"action=tenant.create", "action=tenant.update", "action=key.create", "action=key.revoke"} {
		if !strings.Contains(a.Stderr.String()+b.Stderr.String(), want) {
			t.Errorf("no audit line with %s", want)
		}
	}
	if !strings.Contains(a.Stderr.String(), "admin="+who) {
		t.Errorf("the audit lines do not name the admin %s:\n%s", who, a.Stderr.String())
	}
}

// TestSIGHUPReloadsTenants: SIGHUP puts the file's new tenants in force;
// an invalid file changes nothing, and the log says why.
func TestSIGHUPReloadsTenants(t *testing.T) {
	e2eutil.LogRuntime(t)
	s := newE2ESim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
	cfg := gatewayConfig{Store: "memory", SimURL: s.url, LogLevel: "info"}
	dir := t.TempDir()
	path := filepath.Join(dir, "llmgate.yaml")
	write := func(y string) {
		if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := strings.Replace(cfg.YAML(), "tenants:\n", "state_dir: "+dir+"\ntenants:\n", 1)
	write(base)
	r := e2eutil.Launch(t, "replica-A", e2eutil.Env, "--config", path)
	r.WaitReady(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	const newKey = "sk-e2e-reloaded-tenant-3b91"
	if st, _ := chatStatus(t, ctx, r, newKey); st != http.StatusUnauthorized {
		t.Fatalf("a key of no tenant: %d", st)
	}
	write(base + fmt.Sprintf("  - name: team-b\n    api_key_sha256: %s\n", tokenHash(newKey)))
	if err := r.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	r.Stderr.WaitFor(t, "configuration reloaded", 30*time.Second)
	if st, code := chatStatus(t, ctx, r, newKey); st != http.StatusOK {
		t.Fatalf("the reloaded tenant's key: %d %s", st, code)
	}

	write("providers: [{name: broken\n")
	if err := r.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	r.Stderr.WaitFor(t, "the configuration in force stays", 30*time.Second)
	for _, key := range []string{newKey, e2eutil.TenantKey} {
		if st, code := chatStatus(t, ctx, r, key); st != http.StatusOK {
			t.Errorf("after an invalid reload: %d %s", st, code)
		}
	}
}

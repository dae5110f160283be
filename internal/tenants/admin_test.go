package tenants

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func newAdmin(t *testing.T) (*Admin, *bytes.Buffer) {
	var log bytes.Buffer
	a := &Admin{
		Registry:   NewRegistry(NewMemory(), nil),
		FileTenant: func(name string) bool { return name == "from-file" },
		FileKey:    func(sha string) bool { return sha == HashKey("admin-token") },
		Check: func(t Tenant) error {
			if t.Limits.RPM < 0 {
				return errors.New("limits.rpm: is negative")
			}
			return nil
		},
		Log: slog.New(slog.NewTextHandler(&log, nil)),
	}
	return a, &log
}

func do(t *testing.T, h http.Handler, method, path, body string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer admin-token")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("%s %s: not JSON: %s", method, path, w.Body)
	}
	return w.Code, m
}

func errCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	if c, ok := e["code"].(string); ok {
		return c
	}
	t, _ := e["type"].(string)
	return t
}

func TestAdminLifecycle(t *testing.T) {
	a, log := newAdmin(t)
	h := a.Handler()
	st, m := do(t, h, "POST", "/admin/tenants", `{"name":"t1","limits":{"rpm":3},"max_wait":"2s","cache":{"ttl":"1m"}}`)
	if st != http.StatusCreated {
		t.Fatalf("create: %d %v", st, m)
	}
	key, _ := m["api_key"].(string)
	if !strings.HasPrefix(key, keyPrefix) {
		t.Fatalf("create answered no key: %v", m)
	}
	tn, _ := m["tenant"].(map[string]any)
	if tn["priority"] != "interactive" || tn["max_wait"] != "2s" {
		t.Fatalf("defaults or durations wrong: %v", tn)
	}
	stored, err := a.Registry.Get(t.Context(), "t1")
	if err != nil || len(stored.Keys) != 1 || stored.Keys[0].SHA256 != HashKey(key) {
		t.Fatalf("stored %+v, %v: want the key's hash", stored, err)
	}
	if strings.Contains(mustJSON(t, m), stored.Keys[0].SHA256) {
		t.Fatal("the answer shows the key's hash")
	}

	st, m = do(t, h, "PATCH", "/admin/tenants/t1", `{"limits":{"tpm":100},"budget":{"period":"day","tokens":10}}`)
	if st != http.StatusOK {
		t.Fatalf("patch: %d %v", st, m)
	}
	got, _ := a.Registry.Get(t.Context(), "t1")
	if got.Limits != (Limits{TPM: 100}) || got.Budget == nil || got.Budget.Timezone != "UTC" || got.Cache == nil || len(got.Keys) != 1 {
		t.Fatalf("after patch: %+v", got)
	}
	if st, m = do(t, h, "PATCH", "/admin/tenants/t1", `{"budget":null}`); st != http.StatusOK {
		t.Fatalf("patch null: %d %v", st, m)
	}
	if got, _ = a.Registry.Get(t.Context(), "t1"); got.Budget != nil {
		t.Fatal("budget: null did not clear the budget")
	}

	st, m = do(t, h, "POST", "/admin/tenants/t1/keys", "")
	if st != http.StatusCreated {
		t.Fatalf("add key: %d %v", st, m)
	}
	id := stored.Keys[0].ID
	if st, m = do(t, h, "DELETE", "/admin/tenants/t1/keys/"+id, ""); st != http.StatusOK {
		t.Fatalf("revoke: %d %v", st, m)
	}
	if st, m = do(t, h, "DELETE", "/admin/tenants/t1/keys/"+id, ""); st != http.StatusNotFound || errCode(m) != "unknown_key" {
		t.Fatalf("revoke twice: %d %v", st, m)
	}
	st, m = do(t, h, "GET", "/admin/tenants/t1/keys", "")
	if ks, _ := m["data"].([]any); st != http.StatusOK || len(ks) != 1 {
		t.Fatalf("keys: %d %v", st, m)
	}
	if st, m = do(t, h, "GET", "/admin/tenants", ""); st != http.StatusOK || m["version"] != float64(5) {
		t.Fatalf("list: %d %v", st, m)
	}
	if st, m = do(t, h, "DELETE", "/admin/tenants/t1", ""); st != http.StatusOK {
		t.Fatalf("delete: %d %v", st, m)
	}
	if st, _ = do(t, h, "GET", "/admin/tenants/t1", ""); st != http.StatusNotFound {
		t.Fatalf("get after delete: %d", st)
	}

	out := log.String()
	for _, want := range []string{"action=tenant.create", "action=tenant.update", "fields=budget,limits", "action=key.create", "action=key.revoke", "action=tenant.delete", "admin=" + HashKey("admin-token")[:8]} {
		if !strings.Contains(out, want) {
			t.Errorf("audit log lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, key) || strings.Contains(out, "admin-token") {
		t.Error("the audit log shows a key or the admin token")
	}
}

func TestAdminRefuses(t *testing.T) {
	a, _ := newAdmin(t)
	h := a.Handler()
	if st, m := do(t, h, "POST", "/admin/tenants", `{"name":"ok"}`); st != http.StatusCreated {
		t.Fatalf("create: %d %v", st, m)
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/admin/tenants", `{"name":"ok"}`, 409, "tenant_exists"},
		{"POST", "/admin/tenants", `{"name":"from-file"}`, 409, "tenant_in_config_file"},
		{"PATCH", "/admin/tenants/from-file", `{}`, 409, "tenant_in_config_file"},
		{"POST", "/admin/tenants", `{"name":"bad name"}`, 400, "invalid_request_error"},
		{"POST", "/admin/tenants", `{"name":"n","rpm":1}`, 400, "invalid_request_error"},
		{"POST", "/admin/tenants", `{"name":"n","limits":{"rpm":"many"}}`, 400, "invalid_request_error"},
		{"POST", "/admin/tenants", `{"name":"n","limits":{"rpm":-1}}`, 400, "invalid_request_error"},
		{"POST", "/admin/tenants", `{"name":"n","max_wait":"soon"}`, 400, "invalid_request_error"},
		{"POST", "/admin/tenants", `{"name":"n","keys":[]}`, 400, "invalid_request_error"},
		{"POST", "/admin/tenants", `[1]`, 400, "invalid_request_error"},
		{"POST", "/admin/tenants", `{"name":"n","api_key_sha256":"` + HashKey("admin-token") + `"}`, 409, "key_taken"},
		{"POST", "/admin/tenants", `{"name":"n","api_key_sha256":"xyz"}`, 400, "invalid_request_error"},
		{"PATCH", "/admin/tenants/ok", `{"name":"other"}`, 400, "invalid_request_error"},
		{"PATCH", "/admin/tenants/ok", `{"limits":{"rpm":-5}}`, 400, "invalid_request_error"},
		{"PATCH", "/admin/tenants/none", `{}`, 404, "unknown_tenant"},
		{"POST", "/admin/tenants/ok/keys", `{"sha256":"` + HashKey("admin-token") + `"}`, 409, "key_taken"},
		{"POST", "/admin/tenants/ok/keys", `{"colour":1}`, 400, "invalid_request_error"},
		{"PUT", "/admin/tenants/ok", `{}`, 404, "unknown_url"},
		{"GET", "/admin/tenants/ok/other", ``, 404, "unknown_url"},
	} {
		req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != c.status {
			t.Errorf("%s %s %s: %d %s, want %d", c.method, c.path, c.body, w.Code, w.Body, c.status)
			continue
		}
		if c.code == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil || errCode(m) != c.code {
			t.Errorf("%s %s %s: %s, want error %s", c.method, c.path, c.body, w.Body, c.code)
		}
	}
	// A user-supplied hash is stored as given (lowercase), and can then
	// not be another tenant's.
	h2 := strings.ToUpper(HashKey("their own key"))
	if st, m := do(t, h, "POST", "/admin/tenants", `{"name":"byo","api_key_sha256":"`+h2+`"}`); st != http.StatusCreated || m["api_key"] != nil {
		t.Fatalf("create with a hash: %d %v", st, m)
	}
	if st, m := do(t, h, "POST", "/admin/tenants/ok/keys", `{"sha256":"`+h2+`"}`); st != http.StatusConflict {
		t.Fatalf("another tenant's hash: %d %v", st, m)
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// start runs a Server for cfg on a loopback httptest.Server.
func start(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request and reads the whole answer.
func do(t *testing.T, ts *httptest.Server, method, path, key, body string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

func chatBody(prompt string, extra string) string {
	p, _ := json.Marshal(prompt)
	return `{"model":"gpt-4.1","messages":[{"role":"user","content":` + string(p) + `}]` + extra + `}`
}

// openAIError decodes an error body, failing unless it has OpenAI's shape:
// exactly the keys message, type, param and code, message and type set.
func openAIError(t testing.TB, b []byte) apiErrorBody {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || len(raw) != 1 || raw["error"] == nil {
		t.Fatalf("not an OpenAI error body: %s (%v)", b, err)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Fatalf("error body lacks %q: %s", k, b)
		}
	}
	if len(raw["error"]) != 4 {
		t.Fatalf("error body has extra keys: %s", b)
	}
	var e apiError
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("error body without message or type: %s (%v)", b, err)
	}
	return e.Error
}

func deref(p *string) string {
	if p == nil {
		return "<null>"
	}
	return *p
}

// fakeStart is a fixed instant for tests on a fake clock.
var fakeStart = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func keyHash(k string) string {
	sum := sha256.Sum256([]byte(k))
	return hex.EncodeToString(sum[:4])
}

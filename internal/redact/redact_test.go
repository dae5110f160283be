package redact

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

const key = "sk-proj-abcdefghijklmnop"

func TestBytesAndString(t *testing.T) {
	r := New(key, "", "short", key+"-longer")
	for _, tc := range []struct{ in, want string }{
		{"nothing here", "nothing here"},
		{`{"error":{"message":"Incorrect API key provided: ` + key + `"}}`, `{"error":{"message":"Incorrect API key provided: [redacted]"}}`},
		{key + key, "[redacted][redacted]"},
		{key + "-longer", "[redacted]"}, // the longer secret first: nothing of it is left
		{"short", "short"},              // below MinLen: not a secret
	} {
		if got := string(r.Bytes([]byte(tc.in))); got != tc.want {
			t.Errorf("Bytes(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := r.String(tc.in); got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	in := []byte("clean")
	if out := r.Bytes(in); &out[0] != &in[0] {
		t.Error("Bytes copied a clean input")
	}
	var nilR *Redactor
	if nilR.String(key) != key || !nilR.Empty() {
		t.Error("a nil Redactor changed its input")
	}
}

func TestHeader(t *testing.T) {
	shared := []string{"Bearer " + key, "ok"}
	h := http.Header{"X-Echo": shared, "Other": {"fine"}}
	New(key).Header(h)
	if got := h["X-Echo"]; got[0] != "Bearer [redacted]" || got[1] != "ok" {
		t.Errorf("X-Echo = %q", got)
	}
	if shared[0] != "Bearer "+key {
		t.Error("the caller's slice was modified")
	}
	if h.Get("Other") != "fine" {
		t.Error("a clean header changed")
	}
}

func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New(key).Handler(slog.NewTextHandler(&buf, nil)))
	log = log.With("base", "url?key="+key)
	log.Info("call with "+key, "err", errors.New("401: "+key), "n", 3,
		slog.Group("g", "inner", key), "any", struct{ K string }{key}, "raw", []byte(key))
	out := buf.String()
	if strings.Contains(out, key) {
		t.Fatalf("the log carries the secret: %s", out)
	}
	if strings.Count(out, Mask) != 6 || !strings.Contains(out, "n=3") {
		t.Errorf("log = %s", out)
	}
}

func FuzzRedact(f *testing.F) {
	f.Add([]byte("x "+key+" y"), key)
	f.Add([]byte(""), "aaaaaaaa")
	f.Fuzz(func(t *testing.T, b []byte, secret string) {
		out := New(secret).Bytes(append([]byte(nil), b...))
		// A new occurrence could only be made of the mask's own bytes.
		if len(secret) >= MinLen && !strings.ContainsAny(secret, Mask) && bytes.Contains(out, []byte(secret)) {
			t.Fatalf("Bytes(%q) kept %q: %q", b, secret, out)
		}
	})
}

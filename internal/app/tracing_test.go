package app

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/config"
)

// TestTracingExportsOverOTLP: with tracing.otlp_endpoint set, the spans of
// a request reach the collector over OTLP/HTTP (protobuf on /v1/traces),
// at the latest when the server stops.
func TestTracingExportsOverOTLP(t *testing.T) {
	var (
		mu    sync.Mutex // protects posts
		posts []string
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		posts = append(posts, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type")+" "+string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()

	getenv := func(string) string { return "" }
	cfg := config.Default(getenv)
	cfg.StateDir = t.TempDir()
	cfg.Tracing.OTLPEndpoint = collector.URL
	cfg.Tracing.ServiceName = "llmgate-test"
	if err := cfg.Validate(getenv); err != nil {
		t.Fatal(err)
	}
	a := &App{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard, Getenv: getenv, Environ: func() []string { return nil }}
	s, err := a.startServer(cfg, newLogger(io.Discard, cfg.Log, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.gw.Handler())
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, hs.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4.1-mini","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.gw.Close(ctx); err != nil {
		t.Fatal(err)
	}
	s.close() // flushes the spans

	mu.Lock()
	defer mu.Unlock()
	if len(posts) == 0 {
		t.Fatal("the collector received nothing")
	}
	all := strings.Join(posts, "\n")
	for _, want := range []string{"POST /v1/traces application/x-protobuf", "llmgate-test", "upstream", "admission.wait"} {
		if !strings.Contains(all, want) {
			t.Errorf("the export lacks %q", want)
		}
	}
}

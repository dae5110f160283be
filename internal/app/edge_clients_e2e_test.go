//go:build linux

package app

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
)

// The tests of this file are slow or hostile clients of `llmgate serve`,
// and providers that echo secrets back (findings 5 and 6 of the HTTP edge
// review).

// headOf is the start of a chat request with the tenant key and body
// length n.
func headOf(n int) string {
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", e2eutil.TenantKey, n)
}

// TestE2EEdgeSlowBody: a client that trickles its body gets a 408 once
// server.body_timeout has passed, and its connection is closed.
func TestE2EEdgeSlowBody(t *testing.T) {
	t.Parallel()
	const bodyTimeout = time.Second
	s := newE2ESim(t, sim.Config{})
	r := e2eutil.LaunchReplica(t, "edge-slowbody", gatewayConfig{Store: "memory", SimURL: s.url,
		Extra: fmt.Sprintf("server: {body_timeout: %v}\n", bodyTimeout)})
	r.WaitReady(t)
	c, err := net.Dial("tcp", strings.TrimPrefix(r.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 200
	if _, err := io.WriteString(c, headOf(n)); err != nil {
		t.Fatal(err)
	}
	// One byte every 300ms: the whole body would take a minute.
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for range n {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * bodyTimeout))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a trickled body within %v: %v", 10*bodyTimeout, err)
	}
	b, _ := io.ReadAll(resp.Body)
	took := time.Since(start)
	if resp.StatusCode != http.StatusRequestTimeout || decodeError(t, b).Error.Code != "request_timeout" {
		t.Fatalf("status %d %s, want 408 request_timeout", resp.StatusCode, b)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("the connection stayed open after the 408 (read: %v)", err)
	}
	t.Logf("408 after %v", took.Round(time.Millisecond))
	if v, err := r.Metric(t.Context(), `llmgate_client_timeouts_total{kind="body"}`); err != nil || v < 1 {
		t.Errorf("llmgate_client_timeouts_total{kind=\"body\"} = %v (%v), want at least 1", v, err)
	}
	if all, _ := s.Arrivals("gpt-4.1"); len(all) != 0 {
		t.Errorf("the provider saw %d requests", len(all))
	}
}

// TestE2EEdgeClientStopsReading: a client that asks for a stream and never
// reads it is cut after server.stream_write_timeout, and the upstream call
// with it.
func TestE2EEdgeClientStopsReading(t *testing.T) {
	t.Parallel()
	var ended atomic.Int64 // when the provider's request context ended, unix ns
	chunk := `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"content":"` +
		strings.Repeat("x", 64<<10) + `"}}]}` + "\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { ended.Store(time.Now().UnixNano()) }()
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		deadline := time.Now().Add(60 * time.Second) // bounded, whatever happens
		for time.Now().Before(deadline) {
			if _, err := io.WriteString(w, chunk); err != nil || rc.Flush() != nil {
				return
			}
		}
	}))
	t.Cleanup(up.Close)
	r := e2eutil.LaunchReplica(t, "edge-noread", gatewayConfig{Store: "memory", SimURL: up.URL + "/v1",
		Extra: "server: {stream_write_timeout: 1s}\n"})
	r.WaitReady(t)
	c, err := net.Dial("tcp", strings.TrimPrefix(r.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A small receive buffer fills at once: the gateway's writes block.
	_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
	body := `{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	if _, err := io.WriteString(c, headOf(len(body))+body); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for ended.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the upstream call went on for 30s for a client that reads nothing")
		}
		tick := time.NewTimer(50 * time.Millisecond)
		<-tick.C
	}
	t.Logf("the upstream call ended %v after the request", time.Unix(0, ended.Load()).Sub(start).Round(time.Millisecond))
	c.Close()
	if v, err := r.Metric(t.Context(), `llmgate_client_timeouts_total{kind="write"}`); err != nil || v < 1 {
		t.Errorf("llmgate_client_timeouts_total{kind=\"write\"} = %v (%v), want at least 1", v, err)
	}
}

// TestE2EEdgeConnectionCap: with server.max_connections open, one more
// connection is answered 503 too_many_connections and closed; closing one
// lets a new one in.
func TestE2EEdgeConnectionCap(t *testing.T) {
	t.Parallel()
	s := newE2ESim(t, sim.Config{})
	r := e2eutil.LaunchReplica(t, "edge-conncap-in", gatewayConfig{Store: "memory", SimURL: s.url,
		Extra: "server: {max_connections: 3}\n"})
	r.WaitReady(t)
	e2eutil.HTTP.CloseIdleConnections() // waitReady's connection
	addr := strings.TrimPrefix(r.URL, "http://")
	// healthy makes one keep-alive request on c: it is surely accepted.
	healthy := func(c net.Conn) error {
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	var held []net.Conn
	// The cap counts connections the gateway has not seen closed yet:
	// poll until three are served.
	deadline := time.Now().Add(20 * time.Second)
	for len(held) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d connections served under a cap of 3", len(held))
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if healthy(c) == nil {
			held = append(held, c)
		} else {
			c.Close()
		}
	}
	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = over.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(over)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("a 4th connection got no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || decodeError(t, b).Error.Code != "too_many_connections" {
		t.Fatalf("4th connection: %d %s, want 503 too_many_connections", resp.StatusCode, b)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("the 4th connection stayed open (read: %v)", err)
	}
	over.Close()

	held[0].Close()
	held = held[1:]
	deadline = time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		err = healthy(c)
		c.Close()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed connection did not free its slot: %v", err)
		}
	}
	for _, c := range held {
		c.Close()
	}
	// The metrics need a connection of their own: poll until one is free.
	deadline = time.Now().Add(20 * time.Second)
	for {
		v, err := r.Metric(t.Context(), "llmgate_connections_rejected_total")
		if err == nil {
			if v < 1 {
				t.Errorf("llmgate_connections_rejected_total = %v, want at least 1", v)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics: %v", err)
		}
	}
}

// TestE2EEdgeSecretsEchoed: a provider that quotes the key it received,
// in its error body, in a header, and in a successful answer, never gets
// it relayed to the client.
func TestE2EEdgeSecretsEchoed(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		key := strings.TrimPrefix(auth, "Bearer ")
		w.Header().Set("X-Echo", auth)
		w.Header().Set("Content-Type", "application/json")
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "fail") {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":{"message":"Incorrect API key provided: %s.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`, key)
			return
		}
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4.1","choices":[{"index":0,"message":{"role":"assistant","content":"your key is %s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`, key)
	}))
	t.Cleanup(up.Close)
	r := e2eutil.LaunchReplica(t, "edge-echo", gatewayConfig{Store: "memory", SimURL: up.URL + "/v1", MaxAttempts: 1})
	r.WaitReady(t)
	for _, prompt := range []string{"fail", "succeed"} {
		body := strings.Replace(chatBody, `"hi"`, `"`+prompt+`"`, 1)
		resp, b := r.Post(t, t.Context(), "/v1/chat/completions", e2eutil.TenantKey, body)
		var hdr strings.Builder
		_ = resp.Header.Write(&hdr)
		e2eutil.AssertNoSecrets(t, prompt+": answer", hdr.String()+string(b))
		if !strings.Contains(string(b), "[redacted]") || !strings.Contains(resp.Header.Get("X-Echo"), "[redacted]") {
			t.Errorf("%s: the echoed key is not marked redacted: %s %s", prompt, resp.Header.Get("X-Echo"), b)
		}
	}
}

// TestE2EEdgeMetricsToken: with metrics_token_env, /metrics needs that
// token; without it, /metrics is open.
func TestE2EEdgeMetricsToken(t *testing.T) {
	t.Parallel()
	const token = "e2e-metrics-token-3b7f1a90"
	s := newE2ESim(t, sim.Config{})
	get := func(r *replica, tok string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, r.URL+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := e2eutil.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b)
	}
	path := filepath.Join(t.TempDir(), "metrics.yaml")
	cfg := gatewayConfig{Store: "memory", SimURL: s.url,
		Extra: "metrics_token_env: E2E_METRICS_TOKEN\nstate_dir: " + t.TempDir() + "\n"}
	if err := os.WriteFile(path, []byte(cfg.YAML()), 0o600); err != nil {
		t.Fatal(err)
	}
	locked := e2eutil.Launch(t, "edge-metrics-token", append(append([]string(nil), e2eutil.Env...), "E2E_METRICS_TOKEN="+token), "--config", path)
	locked.WaitReady(t)
	for _, tok := range []string{"", "wrong-token-123456"} {
		code, b := get(locked, tok)
		if code != http.StatusUnauthorized || !strings.Contains(b, "invalid_metrics_token") {
			t.Errorf("/metrics with token %q: %d %s, want 401 invalid_metrics_token", tok, code, b)
		}
	}
	if code, b := get(locked, token); code != 200 || !strings.Contains(b, "llmgate_connections_open") {
		t.Errorf("/metrics with the token: %d", code)
	}
	e2eutil.AssertNoSecrets(t, "logs", strings.ReplaceAll(locked.Stderr.String(), token, "<SECRET>"))
	if strings.Contains(locked.Stderr.String(), token) {
		t.Error("the metrics token appears in the logs")
	}

	open := e2eutil.LaunchReplica(t, "edge-metrics-open", gatewayConfig{Store: "memory", SimURL: s.url, Extra: "state_dir: " + t.TempDir() + "\n"})
	open.WaitReady(t)
	if code, _ := get(open, ""); code != 200 {
		t.Errorf("/metrics without metrics_token_env: %d, want 200", code)
	}
}

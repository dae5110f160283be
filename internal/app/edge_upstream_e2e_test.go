//go:build linux

package app

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
)

// The tests of this file attack `llmgate serve` on its shipped defaults
// the way the findings of the HTTP edge review did: with framing tricks
// from the client side, and with hostile or unusual upstreams.

// chatBody is a small valid chat request.
const chatBody = `{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`

// rawExchange sends raw to addr on one connection and returns every byte
// the gateway sent back until it closed the connection (each exchange
// ends with a request that makes it close), or, against a gateway that
// never does, until limit passed.
func rawExchange(t *testing.T, addr, raw string, limit time.Duration) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(limit))
	out, _ := io.ReadAll(c)
	return string(out)
}

// readResponses parses every HTTP response in out, in order.
func readResponses(t *testing.T, out string) []*http.Response {
	t.Helper()
	br := bufio.NewReader(strings.NewReader(out))
	var rs []*http.Response
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return rs
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		rs = append(rs, resp)
	}
}

// TestE2EEdgeClientFraming: finding 1. A chunked body with a trailer is one
// request; bytes after the last chunk are not a second request; a
// Content-Length of -0 is refused before the gateway's handler runs.
func TestE2EEdgeClientFraming(t *testing.T) {
	t.Parallel()
	s := newE2ESim(t, sim.Config{})
	r := e2eutil.LaunchReplica(t, "edge-framing", gatewayConfig{Store: "memory", SimURL: s.url})
	r.WaitReady(t)
	addr := strings.TrimPrefix(r.URL, "http://")
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + e2eutil.TenantKey + "\r\nContent-Type: application/json\r\n"
	chunked := head + "Transfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(chatBody)), 16) + "\r\n" + chatBody + "\r\n"
	// Only against a gateway that keeps the connection open: a slow
	// answer is read whole.
	const limit = 30 * time.Second

	t.Run("trailer", func(t *testing.T) {
		before, _ := s.Arrivals("gpt-4.1")
		out := rawExchange(t, addr, chunked+"0\r\nX-Trailer: 1\r\n\r\n"+
			"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", limit)
		rs := readResponses(t, out)
		if len(rs) != 2 || rs[0].StatusCode != 200 || rs[1].StatusCode != 200 {
			t.Fatalf("want a 200 for the chat request and one for /healthz on the same connection; got %d responses:\n%s", len(rs), out)
		}
		if after, _ := s.Arrivals("gpt-4.1"); len(after) != len(before)+1 {
			t.Fatalf("the provider saw %d requests, want 1", len(after)-len(before))
		}
	})
	t.Run("smuggled request after the last chunk", func(t *testing.T) {
		out := rawExchange(t, addr, chunked+"0\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", limit)
		if strings.Contains(out, "/smuggled") {
			t.Fatalf("a request hidden in the trailer section reached the handler:\n%s", out)
		}
	})
	t.Run("content-length -0", func(t *testing.T) {
		before, _ := s.Arrivals("gpt-4.1")
		out := rawExchange(t, addr, head+"Content-Length: -0\r\n\r\n", limit)
		rs := readResponses(t, out)
		if len(rs) != 1 || rs[0].StatusCode != http.StatusBadRequest {
			t.Fatalf("want one 400; got:\n%s", out)
		}
		if after, _ := s.Arrivals("gpt-4.1"); len(after) != len(before) {
			t.Fatal("a request with Content-Length -0 reached the provider")
		}
	})
}

// hostileUpstream accepts connections on loopback and hands each to serve
// until the test ends.
func hostileUpstream(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				// Bounded: no connection lives past the test's need.
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				serve(c)
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/v1"
}

// readRequest reads one request and its body from br.
func readRequest(br *bufio.Reader) (*http.Request, []byte, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(req.Body)
	return req, body, err
}

// vmHWM returns a process's peak resident memory in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// TestE2EEdgeEndlessUpstreamHeaders: finding 2. An upstream that streams
// header lines without end, or 1xx answers without end, costs the gateway
// a bounded amount of memory and gets the client a 502 quickly.
func TestE2EEdgeEndlessUpstreamHeaders(t *testing.T) {
	t.Parallel()
	line := "X-Flood: " + strings.Repeat("a", 64<<10) + "\r\n"
	for _, tc := range []struct {
		name  string
		start string // written once
		each  string // then written until the gateway hangs up
	}{
		{"header lines", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n", line},
		{"1xx answers", "", "HTTP/1.1 102 Processing\r\n" + line + "\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := hostileUpstream(t, func(c net.Conn) {
				if _, _, err := readRequest(bufio.NewReader(c)); err != nil {
					return
				}
				if _, err := io.WriteString(c, tc.start); err != nil {
					return
				}
				// At most 1 GiB: far past any cap, bounded all the same.
				for range 1 << 14 {
					if _, err := io.WriteString(c, tc.each); err != nil {
						return
					}
				}
			})
			r := e2eutil.LaunchReplica(t, "edge-headers", gatewayConfig{Store: "memory", SimURL: up, MaxAttempts: 1})
			r.WaitReady(t)
			start := time.Now()
			resp, body := r.Post(t, t.Context(), "/v1/chat/completions", e2eutil.TenantKey, chatBody)
			took := time.Since(start)
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502: %s", resp.StatusCode, body)
			}
			if n := len(resp.Header); n > 20 {
				t.Errorf("the answer has %d headers: the flood was relayed", n)
			}
			peak := vmHWM(t, r.Cmd.Process.Pid)
			t.Logf("502 after %v; gateway peak RSS %d MiB", took.Round(time.Millisecond), peak>>20)
			if peak > 256<<20 {
				t.Errorf("gateway peak RSS %d MiB, want under 256 MiB", peak>>20)
			}
			// The header cap cuts it, not the time-to-headers timeout
			// (at least its 10s floor), however slow this machine is.
			if took >= config.DefaultTimeoutFloor {
				t.Errorf("the 502 took %v: the time-to-headers timeout cut it (%v), not the header cap", took, config.DefaultTimeoutFloor)
			}
		})
	}
}

// TestE2EEdgeNoHiddenReplay: finding 3. A provider that reads a POST and
// closes its reused connection without an answer sees the request once
// when the gateway makes one attempt: the transport does not replay a
// request whose bytes reached the server.
func TestE2EEdgeNoHiddenReplay(t *testing.T) {
	t.Parallel()
	var seen atomic.Int64 // requests that asked for "second"
	answer := `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4.1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	up := hostileUpstream(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			_, body, err := readRequest(br)
			if err != nil {
				return
			}
			if bytes.Contains(body, []byte("second")) {
				seen.Add(1)
				return // read it all, answer nothing, close
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
		}
	})
	r := e2eutil.LaunchReplica(t, "edge-replay", gatewayConfig{Store: "memory", SimURL: up, MaxAttempts: 1})
	r.WaitReady(t)
	if resp, body := r.Post(t, t.Context(), "/v1/chat/completions", e2eutil.TenantKey, chatBody); resp.StatusCode != 200 {
		t.Fatalf("first request: %d %s", resp.StatusCode, body)
	}
	second := strings.Replace(chatBody, `"hi"`, `"second"`, 1)
	resp, body := r.Post(t, t.Context(), "/v1/chat/completions", e2eutil.TenantKey, second)
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("second request: %d %s, want 502", resp.StatusCode, body)
	}
	if n := seen.Load(); n != 1 {
		t.Fatalf("the provider received the second request %d times, want 1 (max_attempts 1)", n)
	}
}

// TestE2EEdgeUpstreamHTTP2AndConnCap: finding 4. An https provider that
// offers HTTP/2 gets it, with concurrent requests on one connection; an
// HTTP/1.1 provider gets at most upstream.max_conns_per_host connections.
func TestE2EEdgeUpstreamHTTP2AndConnCap(t *testing.T) {
	t.Parallel()
	sv, err := sim.New(sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		mu     sync.Mutex
		protos map[string]int
		conns  int
	}
	// The handler holds each request until n have arrived or a bound
	// passes, so that the requests are surely concurrent.
	serve := func(s *seen, n int, gate chan struct{}, arrived *atomic.Int64) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.mu.Lock()
			s.protos[r.Proto]++
			s.mu.Unlock()
			if arrived.Add(1) == int64(n) {
				close(gate)
			}
			select {
			case <-gate:
			case <-time.After(2 * time.Second):
			}
			sv.Handler().ServeHTTP(w, r)
		})
	}
	const n = 12
	burst := func(t *testing.T, r *replica) {
		var wg sync.WaitGroup
		errs := make(chan string, n)
		for range n {
			wg.Go(func() {
				resp, body, err := r.TryPost(t.Context(), "/v1/chat/completions", e2eutil.TenantKey, chatBody)
				if err != nil {
					errs <- err.Error()
				} else if resp.StatusCode != 200 {
					errs <- fmt.Sprintf("%d %s", resp.StatusCode, body)
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
	}

	t.Run("http2", func(t *testing.T) {
		s := &seen{protos: map[string]int{}}
		var arrived atomic.Int64
		up := httptest.NewUnstartedServer(serve(s, n, make(chan struct{}), &arrived))
		up.EnableHTTP2 = true
		up.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.mu.Lock()
				s.conns++
				s.mu.Unlock()
			}
		}
		up.StartTLS()
		t.Cleanup(up.Close)
		// The replica trusts the test server's certificate through
		// SSL_CERT_FILE, as a user with a private CA would.
		ca := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}), 0o600); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "edge-h2.yaml")
		if err := os.WriteFile(path, []byte(gatewayConfig{Store: "memory", SimURL: up.URL + "/v1"}.YAML()), 0o600); err != nil {
			t.Fatal(err)
		}
		r := e2eutil.Launch(t, "edge-h2", append(append([]string(nil), e2eutil.Env...), "SSL_CERT_FILE="+ca), "--config", path)
		r.WaitReady(t)
		// One request first: net/http dials once per request while no
		// connection to a host is up yet (a cold burst is bounded by
		// max_conns_per_host, tested below); once one is, HTTP/2 carries
		// the burst.
		arrived.Store(-1)
		if resp, body := r.Post(t, t.Context(), "/v1/chat/completions", e2eutil.TenantKey, chatBody); resp.StatusCode != 200 {
			t.Fatalf("first request: %d %s", resp.StatusCode, body)
		}
		burst(t, r)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.protos["HTTP/2.0"] != n+1 || s.conns != 1 {
			t.Fatalf("provider saw protocols %v over %d connections; want %d HTTP/2.0 requests over 1", s.protos, s.conns, n+1)
		}
	})

	t.Run("max_conns_per_host", func(t *testing.T) {
		const cap = 3
		s := &seen{protos: map[string]int{}}
		var arrived atomic.Int64
		// Only cap requests can be in at once: the gate opens on the
		// time bound, and the rest queue for a connection meanwhile.
		up := httptest.NewUnstartedServer(serve(s, n, make(chan struct{}), &arrived))
		up.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.mu.Lock()
				s.conns++
				s.mu.Unlock()
			}
		}
		up.Start()
		t.Cleanup(up.Close)
		path := filepath.Join(t.TempDir(), "edge-conncap.yaml")
		yaml := gatewayConfig{Store: "memory", SimURL: up.URL + "/v1"}.YAML()
		yaml = strings.Replace(yaml, "upstream:\n", fmt.Sprintf("upstream:\n  max_conns_per_host: %d\n", cap), 1)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		r := e2eutil.Launch(t, "edge-conncap", e2eutil.Env, "--config", path)
		r.WaitReady(t)
		burst(t, r)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.conns > cap || s.protos["HTTP/1.1"] != n {
			t.Fatalf("provider saw %v over %d connections; want %d HTTP/1.1 requests over at most %d", s.protos, s.conns, n, cap)
		}
	})
}

// TestE2EEdgeEarlyUpstreamAnswer: finding 7. A body the provider refuses
// before reading it all (its own size limit, below the gateway's) gets the
// provider's 413 relayed, after one attempt, not a 502 after three.
func TestE2EEdgeEarlyUpstreamAnswer(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, 64<<10)); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			_, _ = io.WriteString(w, `{"error":{"message":"Request too large.","type":"invalid_request_error","param":null,"code":"request_too_large"}}`)
			return
		}
		http.Error(w, "expected a large body", http.StatusTeapot)
	}))
	t.Cleanup(up.Close)
	r := e2eutil.LaunchReplica(t, "edge-early", gatewayConfig{Store: "memory", SimURL: up.URL + "/v1"})
	r.WaitReady(t)
	big := `{"model":"gpt-4.1","max_tokens":8,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 1<<20) + `"}]}`
	resp, body := r.Post(t, t.Context(), "/v1/chat/completions", e2eutil.TenantKey, big)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), "request_too_large") {
		t.Fatalf("status %d %s; want the provider's 413", resp.StatusCode, body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the provider was called %d times, want 1", n)
	}
}

// TestE2EEdgeServeTLS: with a certificate and key configured, the gateway
// serves HTTPS with HTTP/2, and the official SDK works through it.
func TestE2EEdgeServeTLS(t *testing.T) {
	t.Parallel()
	s := newE2ESim(t, sim.Config{})
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := gatewayConfig{Store: "memory", SimURL: s.url,
		Extra: fmt.Sprintf("server: {tls_cert_file: %s, tls_key_file: %s}\n", cert, key)}
	path := filepath.Join(dir, "tls.yaml")
	if err := os.WriteFile(path, []byte(cfg.YAML()), 0o600); err != nil {
		t.Fatal(err)
	}
	r := e2eutil.Launch(t, "edge-tls", e2eutil.Env, "--config", path)
	addr := waitListening(t, r, regexp.MustCompile(`llmgate gateway listening.*addr=https://(127\.0\.0\.1:[0-9]+)/v1`))

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	t.Cleanup(client.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e2eutil.TenantKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("%s %d: %s; want 200 over HTTP/2", resp.Proto, resp.StatusCode, body)
	}

	sdk := openai.NewClient(option.WithBaseURL("https://"+addr+"/v1/"), option.WithAPIKey(e2eutil.TenantKey),
		option.WithMaxRetries(0), option.WithHTTPClient(client))
	st := sdk.Chat.Completions.NewStreaming(ctx, chatParams("hello over TLS", 8))
	chunks := 0
	for st.Next() {
		chunks++
	}
	if err := st.Err(); err != nil || chunks == 0 {
		t.Fatalf("stream over TLS: %d chunks, %v", chunks, err)
	}
}

// waitListening waits for serve's listening line and returns the address
// re captures.
func waitListening(t *testing.T, r *replica, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.NewTimer(e2eutil.ReplicaStartup)
	defer deadline.Stop()
	for {
		have, changed := r.Stderr.Snapshot()
		if m := re.FindStringSubmatch(have); m != nil {
			return m[1]
		}
		select {
		case <-changed:
		case <-r.Done:
			t.Fatalf("%s exited before listening: %s", r.Name, r.Stderr.String())
		case <-deadline.C:
			t.Fatalf("%s did not listen within %v: %s", r.Name, e2eutil.ReplicaStartup, r.Stderr.String())
		}
	}
}

// selfSigned returns a PEM certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "llmgate test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

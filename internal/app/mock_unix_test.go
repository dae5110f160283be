//go:build unix

package app

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
)

// TestMockSIGTERMLetsStreamsFinish runs the real binary: SIGTERM arrives
// while a stream is in flight; the stream still ends with [DONE] and the
// process exits 0.
func TestMockSIGTERMLetsStreamsFinish(t *testing.T) {
	p := startLlmgate(t, nil, "mock", "--listen", "127.0.0.1:0", "--token-delay", "10ms")
	p.stderr.WaitFor(t, "listening on", testTimeout)
	m := listeningRE.FindStringSubmatch(p.stderr.String())
	if m == nil {
		t.Fatalf("no address in %q", p.stderr.String())
	}
	resp, err := http.Post(m[1]+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"a long answer please"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.stderr.WaitFor(t, "shutting down", testTimeout)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("stream after SIGTERM: %v, %q", err, rest)
	}
	if code, _ := p.wait(t); code != 0 || !strings.Contains(p.stderr.String(), "served 1 calls") {
		t.Fatalf("exit %d, stderr %q", code, p.stderr.String())
	}
}

package h1server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// sdkRequest is a chat completion's request line and headers as the
// official OpenAI Python SDK sends them.
const sdkRequest = "POST /v1/chat/completions HTTP/1.1\r\n" +
	"Host: 127.0.0.1:8080\r\n" +
	"Accept-Encoding: gzip, deflate\r\n" +
	"Connection: keep-alive\r\n" +
	"Accept: application/json\r\n" +
	"Content-Type: application/json\r\n" +
	"User-Agent: OpenAI/Python 1.99.9\r\n" +
	"X-Stainless-Lang: python\r\n" +
	"X-Stainless-Package-Version: 1.99.9\r\n" +
	"X-Stainless-OS: Linux\r\n" +
	"X-Stainless-Arch: x64\r\n" +
	"X-Stainless-Runtime: CPython\r\n" +
	"X-Stainless-Runtime-Version: 3.12.3\r\n" +
	"Authorization: Bearer sk-test\r\n" +
	"X-Stainless-Async: false\r\n" +
	"X-Stainless-Retry-Count: 0\r\n" +
	"X-Stainless-Read-Timeout: 600\r\n" +
	"Content-Length: 2\r\n" +
	"\r\n{}"

// BenchmarkParseRequest: one request line and 17 headers, parsed from a
// buffered reader, as a connection does for each request.
func BenchmarkParseRequest(b *testing.B) {
	sr := strings.NewReader(sdkRequest)
	br := bufio.NewReaderSize(sr, 4096)
	c := &conn{remote: "127.0.0.1:40000"}
	b.ReportAllocs()
	for b.Loop() {
		sr.Reset(sdkRequest)
		br.Reset(sr)
		if _, _, err := parseRequest(br, DefaultMaxHeaderBytes, c); err != nil {
			b.Fatal(err)
		}
	}
}

// onBothServers runs one sub-benchmark per server, h1server and net/http's
// (the baseline, same run), each serving h on a loopback port; call gets
// the server's base URL and a keep-alive client for b.Loop.
func onBothServers(b *testing.B, h http.Handler, call func(b *testing.B, client *http.Client, base string)) {
	for _, server := range []string{"net-http", "h1server"} {
		b.Run(server, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			var srv interface {
				Serve(net.Listener) error
				Close() error
			} = &Server{Handler: h}
			if server == "net-http" {
				srv = &http.Server{Handler: h}
			}
			go func() { _ = srv.Serve(ln) }()
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			b.ReportAllocs()
			call(b, client, "http://"+ln.Addr().String())
		})
	}
}

// BenchmarkStream: a handler that flushes 13 events of 220 bytes each,
// read whole by a keep-alive net/http client, on both servers.
func BenchmarkStream(b *testing.B) {
	event := []byte("data: " + strings.Repeat("x", 212) + "\n\n")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range 13 {
			_, _ = w.Write(event)
			_ = rc.Flush()
		}
	})
	onBothServers(b, h, func(b *testing.B, client *http.Client, base string) {
		for b.Loop() {
			resp, err := client.Get(base + "/")
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if n != 13*int64(len(event)) {
				b.Fatalf("read %d bytes", n)
			}
		}
	})
}

// BenchmarkServeJSON: a small POST answered with 600 bytes and a
// Content-Length, over one keep-alive connection, on both servers.
func BenchmarkServeJSON(b *testing.B) {
	answer := []byte(strings.Repeat("j", 600))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "600")
		_, _ = w.Write(answer)
	})
	body := strings.Repeat("q", 300)
	onBothServers(b, h, func(b *testing.B, client *http.Client, base string) {
		for b.Loop() {
			resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if n != int64(len(answer)) {
				b.Fatalf("read %d bytes", n)
			}
		}
	})
}

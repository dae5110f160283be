package h1

import (
	"bufio"
	"bytes"
	"io"
	"maps"
	"net/http"
	"slices"
	"testing"
)

// FuzzFastResponse: what readFastResponse accepts, it reads exactly as
// http.ReadResponse does (status, header, framing, keep-alive, body);
// what it declines, it leaves unread.
func FuzzFastResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 200\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 5\r\n\r\nab",
		"HTTP/1.1 503 Unavailable\r\nConnection: Keep-Alive, close\r\nContent-Length: 1\r\n\r\nz",
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, raw []byte, head bool) {
		req, _ := http.NewRequest(http.MethodPost, "http://x/", nil)
		if head {
			req.Method = http.MethodHead
		}
		br := bufio.NewReaderSize(bytes.NewReader(raw), 4096)
		got, ok := readFastResponse(br, req)
		if !ok {
			if rest, _ := io.ReadAll(br); !bytes.Equal(rest, raw) {
				t.Fatalf("declined %q but consumed some of it", raw)
			}
			return
		}
		want, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), req)
		if err != nil {
			t.Fatalf("accepted %q, which http.ReadResponse rejects: %v", raw, err)
		}
		if got.Status != want.Status || got.StatusCode != want.StatusCode || got.Proto != want.Proto ||
			got.ProtoMajor != want.ProtoMajor || got.ProtoMinor != want.ProtoMinor ||
			got.ContentLength != want.ContentLength || got.Close != want.Close ||
			len(want.TransferEncoding) != 0 || want.Trailer != nil {
			t.Fatalf("%q read as %+v; http.ReadResponse reads %+v", raw, got, want)
		}
		if !maps.EqualFunc(got.Header, want.Header, slices.Equal) {
			t.Fatalf("header of %q: %q; http.ReadResponse reads %q", raw, got.Header, want.Header)
		}
		gb, gerr := io.ReadAll(got.Body)
		wb, werr := io.ReadAll(want.Body)
		if !bytes.Equal(gb, wb) || (gerr == nil) != (werr == nil) {
			t.Fatalf("body of %q: %q, %v; http.ReadResponse reads %q, %v", raw, gb, gerr, wb, werr)
		}
	})
}

// TestFastResponseCovers: the answers providers give on the hot path take
// the fast way; the rest is left to http.ReadResponse.
func TestFastResponseCovers(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		fast bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", true},
		{"HTTP/1.1 200 OK\r\nDate: Wed, 02 Dec 2026 05:00:00 GMT\r\nConnection: keep-alive\r\nX-Ratelimit-Remaining-Requests: 499\r\nContent-Length: 2\r\n\r\n{}", true},
		{"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", true},
		{"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", true},
		{"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false},
		{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false},
		{"HTTP/1.1 204 No Content\r\n\r\n", false},
		{"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 0\r\n\r\n", false},
		{"HTTP/1.1 200 OK\r\n\r\nclose-delimited", false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", false}, // the header has not ended
	} {
		req, _ := http.NewRequest(http.MethodPost, "http://x/", nil)
		resp, ok := readFastResponse(bufio.NewReader(bytes.NewReader([]byte(tc.raw))), req)
		if ok != tc.fast {
			t.Errorf("%q: fast %v, want %v", tc.raw, ok, tc.fast)
		}
		if ok {
			b, err := io.ReadAll(resp.Body)
			if err != nil || string(b) != "{}" {
				t.Errorf("%q: body %q, %v", tc.raw, b, err)
			}
		}
	}
}

// openAIAnswer is the status line and header of a chat completion answer
// as api.openai.com sends them (values made up), and a short body.
const openAIAnswer = "HTTP/1.1 200 OK\r\n" +
	"Date: Wed, 02 Dec 2026 05:00:00 GMT\r\n" +
	"Content-Type: application/json\r\n" +
	"Connection: keep-alive\r\n" +
	"Access-Control-Expose-Headers: X-Request-ID\r\n" +
	"Openai-Organization: org-abc\r\n" +
	"Openai-Processing-Ms: 412\r\n" +
	"Openai-Project: proj_abc\r\n" +
	"Openai-Version: 2020-10-01\r\n" +
	"X-Envoy-Upstream-Service-Time: 415\r\n" +
	"X-Ratelimit-Limit-Requests: 500\r\n" +
	"X-Ratelimit-Limit-Tokens: 150000\r\n" +
	"X-Ratelimit-Remaining-Requests: 499\r\n" +
	"X-Ratelimit-Remaining-Tokens: 149980\r\n" +
	"X-Ratelimit-Reset-Requests: 120ms\r\n" +
	"X-Ratelimit-Reset-Tokens: 8ms\r\n" +
	"X-Request-Id: req_0123456789abcdef\r\n" +
	"Strict-Transport-Security: max-age=31536000; includeSubDomains; preload\r\n" +
	"Cf-Cache-Status: DYNAMIC\r\n" +
	"X-Content-Type-Options: nosniff\r\n" +
	"Server: cloudflare\r\n" +
	"Cf-Ray: 8f0000000000abcd-FRA\r\n" +
	"Alt-Svc: h3=\":443\"; ma=86400\r\n" +
	"Content-Length: 2\r\n" +
	"\r\n{}"

// BenchmarkReadResponse: readFastResponse against http.ReadResponse on an
// answer with OpenAI's 23 headers, body read.
func BenchmarkReadResponse(b *testing.B) {
	req, _ := http.NewRequest(http.MethodPost, "http://x/", nil)
	for _, name := range []string{"fast", "net-http"} {
		b.Run(name, func(b *testing.B) {
			sr := bytes.NewReader([]byte(openAIAnswer))
			br := bufio.NewReaderSize(sr, 4096)
			b.ReportAllocs()
			for b.Loop() {
				sr.Reset([]byte(openAIAnswer))
				br.Reset(sr)
				var resp *http.Response
				if name == "fast" {
					var ok bool
					if resp, ok = readFastResponse(br, req); !ok {
						b.Fatal("not fast")
					}
				} else {
					var err error
					if resp, err = http.ReadResponse(br, req); err != nil {
						b.Fatal(err)
					}
				}
				_, _ = io.Copy(io.Discard, resp.Body)
			}
		})
	}
}

// TestGet: Get finds what http.Header.Get finds for a canonical key,
// including a header parsed from the wire in another case.
func TestGet(t *testing.T) {
	h := http.Header{}
	key, value, err := ParseField("x-ratelimit-remaining-requests:  7 ")
	if err != nil {
		t.Fatal(err)
	}
	h[key] = []string{value, "8"}
	h.Set("Retry-After", "")
	for _, k := range []string{"X-Ratelimit-Remaining-Requests", "Retry-After", "X-Missing"} {
		if got, want := Get(h, k), h.Get(k); got != want {
			t.Errorf("Get(%q) = %q, Header.Get %q", k, got, want)
		}
	}
	if got := Get(h, "X-Ratelimit-Remaining-Requests"); got != "7" {
		t.Errorf("Get = %q, want the first value 7", got)
	}
}

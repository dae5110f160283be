package provider

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// BenchmarkDo measures the client's cost over a loopback upstream that
// answers at once; BenchmarkTransport is the same call on the bare
// transport, the floor Do is compared with.
func BenchmarkDo(b *testing.B) {
	u := newUpstream(b, nil, answerOK)
	c := newClient(b, Config{})
	tg := targetOf(u)
	req := chatReq
	req.Header = http.Header{"X-Request-Id": {"bench"}}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, _, err := c.Do(b.Context(), tg, req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	})
}

// BenchmarkTransport compares the default upstream transport (h1) with
// net/http's, on the same upstream in the same run.
func BenchmarkTransport(b *testing.B) {
	u := newUpstream(b, nil, answerOK)
	url := u.URL + "/v1/chat/completions"
	for _, tc := range []struct {
		name string
		tr   http.RoundTripper
	}{
		{"h1", newTransport()},
		{"net-http", newHTTPTransport()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.Cleanup(tc.tr.(interface{ CloseIdleConnections() }).CloseIdleConnections)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r, err := http.NewRequestWithContext(b.Context(), http.MethodPost, url, bytes.NewReader(chatReq.Body))
					if err != nil {
						b.Error(err)
						return
					}
					r.ContentLength = int64(len(chatReq.Body))
					r.Header = http.Header{"X-Request-Id": {"bench"}, "Authorization": {"Bearer " + testKey}, "Content-Type": {"application/json"}}
					resp, err := tc.tr.RoundTrip(r)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			})
		})
	}
}

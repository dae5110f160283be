package provider

import (
	"io"
	"net/http"
	"testing"
)

// BenchmarkDo measures the client's cost over a loopback upstream that
// answers at once.
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

package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/dedup"
	dedupmemory "github.com/llmgate/llmgate/dedup/memory"
)

// FuzzServe sends arbitrary bodies to every proxied endpoint: the gateway
// never panics, and every answer it writes itself is OpenAI's error shape.
func FuzzServe(f *testing.F) {
	seeds := []string{
		chatBody,
		`{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4.1","stream":true,"stream_options":{"include_usage":false},"messages":[]}`,
		`{"model":"gpt-4.1","stream":true,"stream_options":"x","messages":[]}`,
		`{"model":"fast","n":3,"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"model":"text-embedding-3-small","input":["a","b"]}`,
		`{"model":"gpt-4.1","prompt":[[1,2,3]]}`,
		`{"model":1}`, `{"model":"gpt-4.1","messages":{}}`, `null`, `{`, ``, "\x00\xff",
		`{"model":"gpt-4.1","model":"gpt-4.1-mini","messages":[]}`,
	}
	for i, s := range seeds {
		f.Add(uint8(i%3), []byte(s))
	}
	h := newHarness(&testing.T{}, harnessConfig{})
	paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}
	f.Fuzz(func(t *testing.T, ep uint8, body []byte) {
		req := httptest.NewRequest(http.MethodPost, paths[int(ep)%len(paths)], bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tenantKey)
		req.Header.Set("X-Llmgate-Max-Wait", "0")
		rec := httptest.NewRecorder()
		h.gw.Handler().ServeHTTP(rec, req)
		if rec.Header().Get("X-Request-Id") == "" {
			t.Fatal("no x-request-id")
		}
		if rec.Code == http.StatusOK {
			return
		}
		if rec.Header().Get("X-Llmgate-Deployment") != "" {
			return // the provider's own answer, relayed as is
		}
		var e struct {
			Error *struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		b, _ := io.ReadAll(rec.Body)
		if err := json.Unmarshal(b, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("status %d with body %q", rec.Code, b)
		}
	})
}

// FuzzFollow hands a follower a flight of arbitrary frames, as a store
// could hold them (another version, a foreign writer, corruption): it never
// panics, writes to its client only after a well-formed head frame, with
// that frame's status, and reports a complete answer only then.
func FuzzFollow(f *testing.F) {
	f.Add([]byte(`H{"status":200,"header":{"Content-Type":["application/json"]}}`), []byte(`B{"id":1}`), []byte("Bmore"))
	f.Add([]byte(`H{"status":99}`), []byte("B"), []byte(""))
	f.Add([]byte("Bbody before the head"), []byte(`H{"status":404,"header":null}`), []byte("H{"))
	f.Add([]byte(`H{"status":200,"header":{"X-A":null}}`), []byte(`H{"status":500}`), []byte("Xother"))
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		ctx := t.Context()
		grp := dedup.New(dedupmemory.New(clock.Real{}), dedup.Options{LeaseTTL: time.Second})
		l, _, err := grp.Join(ctx, "k", "fp", time.Minute)
		if err != nil || l == nil {
			t.Fatal(err)
		}
		for _, fr := range [][]byte{a, b, c} {
			if err := l.Publish(ctx, fr); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Finish(ctx); err != nil {
			t.Fatal(err)
		}
		_, fol, err := grp.Join(ctx, "k", "fp", time.Minute)
		if err != nil || fol == nil {
			t.Fatal(err)
		}
		defer fol.Close()
		// The status of the first head frame, if it is well-formed.
		status := 0
		for _, fr := range [][]byte{a, b, c} {
			if len(fr) > 0 && fr[0] == frameHead {
				var hf headFrame
				if json.Unmarshal(fr[1:], &hf) == nil && hf.Status >= 100 && hf.Status <= 999 {
					status = hf.Status
				}
				break
			}
			if len(fr) > 0 && fr[0] == frameBody {
				break // a body before any head: not an answer
			}
		}
		rec := httptest.NewRecorder()
		var wroteHead bool
		var wrote int
		done, _ := (&Gateway{}).follow(ctx, rec, &call{outcome: "error"}, fol, &wroteHead, &wrote)
		switch {
		case wroteHead != (status != 0):
			t.Fatalf("wrote a head: %v; the first head's status %d", wroteHead, status)
		case wroteHead && rec.Code != status:
			t.Fatalf("status %d, the head frame's %d", rec.Code, status)
		case !wroteHead && (done || rec.Body.Len() > 0):
			t.Fatalf("done %v, %d body bytes, without a head", done, rec.Body.Len())
		}
	})
}

// FuzzParseTTL: an x-llmgate-cache-ttl is refused or read as a TTL above 0
// and at most the limit; never a panic.
func FuzzParseTTL(f *testing.F) {
	for _, s := range []string{"300", "10m", "48h", "0", "-1", "1e-12", "NaN", "+Inf", "1e400", "2562047h", "0.5", " 7s ", "1h30m", ""} {
		f.Add(s)
	}
	const limit = 2 * time.Hour
	f.Fuzz(func(t *testing.T, v string) {
		d, err := parseTTL(v, limit)
		if err == nil && (d <= 0 || d > limit) {
			t.Fatalf("parseTTL(%q) = %v", v, d)
		}
	})
}

package gateway

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/tokens"
)

// TestDrainFailsReadiness: once Drain is called /readyz answers 503
// shutting_down, while /healthz and requests are still served.
func TestDrainFailsReadiness(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(h.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, b := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before Drain: %d %s", code, b)
	}
	h.gw.Drain()
	if !h.gw.Draining() {
		t.Fatal("Draining is false after Drain")
	}
	code, b := get("/readyz")
	var e struct {
		Error struct{ Type, Code, Message string }
	}
	if err := json.Unmarshal(b, &e); err != nil || code != http.StatusServiceUnavailable ||
		e.Error.Code != "shutting_down" || e.Error.Type != "service_unavailable" {
		t.Fatalf("/readyz while draining: %d %s (%v)", code, b, err)
	}
	if code, b := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while draining: %d %s", code, b)
	}
	resp := h.post("/v1/chat/completions", tenantKey, chatBody)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a request while draining: %d", resp.StatusCode)
	}
}

// TestCutSettlesStreams: Cut ends the streams still running the way the
// shutdown does at the end of its grace. Each client gets what was
// streamed, then an in-band shutting_down error, never [DONE]; each stream
// is charged its prompt estimate plus one token per chunk streamed (the
// provider sent no usage), and gives its concurrency permit back; a request
// still waiting for admission gets 503 shutting_down and its budget hold is
// released. Nothing stays held.
//
// The cancellation reaches the requests one after the other, so the
// waiting one may be admitted with the permit of a stream already cut, in
// the instant before its own turn: it is then a stream cut like the others,
// charged what the provider sent it.
func TestCutSettlesStreams(t *testing.T) {
	const (
		streams  = 2
		chunks   = 5
		messages = `[{"role":"user","content":"Tell me a long story."}]`
	)
	up := &longStream{chunks: chunks, release: make(chan struct{})} // never released: the streams last until cut
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	b := budget.Budget{Tenant: "team-a", Period: budget.Month, Tokens: 1_000_000}
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		for i := range o.Deployments {
			o.Deployments[i].Target.BaseURL = upSrv.URL + "/v1"
		}
		h.teamA.Budget = &b
		h.teamA.Limits = Limits{Concurrency: streams}
	}})
	// The server the shutdown cuts: its requests derive from BaseContext.
	srv := httptest.NewUnstartedServer(h.gw.Handler())
	srv.Config.BaseContext = h.gw.BaseContext
	srv.Start()
	t.Cleanup(srv.Close)

	body := `{"model":"gpt-4.1","stream":true,"max_tokens":100,"messages":` + messages + `}`
	post := func(url string, hdr ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tenantKey)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var readers []*bufio.Reader
	for range streams {
		resp := post(srv.URL)
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream: %d", resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		for got := 0; got < chunks; {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("after %d chunks: %v", got, err)
			}
			if strings.Contains(line, `"content":"w "`) {
				got++
			}
		}
		readers = append(readers, br)
	}
	// A third request waits for a concurrency permit.
	waiting := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tenantKey)
		req.Header.Set("X-Llmgate-Max-Wait", "30s")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			resp = nil
		}
		waiting <- resp
	}()
	waitFor(t, func() bool { return h.gw.Running() == streams+1 })

	h.gw.Cut()
	for i, br := range readers {
		raw, err := io.ReadAll(br)
		if err != nil {
			t.Fatalf("stream %d after the cut: %v", i, err)
		}
		rest := strings.TrimLeft(string(raw), "\n") // the end of the last chunk read
		if strings.Count(rest, "data: ") != 1 || !strings.HasPrefix(rest, `data: {"error":`) ||
			!strings.Contains(rest, `"code":"shutting_down"`) || !strings.HasSuffix(rest, "\n\n") {
			t.Errorf("stream %d after the cut: %q; want only the shutting_down error event", i, rest)
		}
	}
	// The streams the clients got and the content chunks in them: what
	// the budget must be charged for.
	cutStreams, streamed := int64(streams), int64(streams*chunks)
	if resp := <-waiting; resp != nil {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK: // admitted as the cut went by, then cut
			cutStreams++
			streamed += int64(strings.Count(string(raw), `"content":"w "`))
			if !strings.HasSuffix(string(raw), `"code":"shutting_down"}}`+"\n\n") {
				t.Errorf("the waiting request, admitted: %q; want a stream ending with the shutting_down error event", raw)
			}
		case resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(raw), `"code":"shutting_down"`) || resp.Header.Get("Retry-After") == "":
			t.Errorf("the waiting request: %d %s (retry-after %q); want 503 shutting_down", resp.StatusCode, raw, resp.Header.Get("Retry-After"))
		}
	}

	spend := func() budget.Status {
		t.Helper()
		st, err := h.budgets.Spend(t.Context(), b, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	waitFor(t, func() bool { return h.gw.Running() == 0 && spend().Holds == 0 })
	prompt := int64(tokens.Chat("gpt-4.1", json.RawMessage(messages), nil))
	if st := spend(); st.Spent.Tokens != cutStreams*prompt+streamed || st.Reserved != (budget.Amount{}) {
		t.Errorf("after the cut: %+v; want %d streams of %d prompt tokens and %d chunks in all spent, nothing held", st, cutStreams, prompt, streamed)
	}
	rows, err := h.budgets.Usage(t.Context(), b.Tenant, spend().Window.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Requests != cutStreams || rows[0].Expired != 0 {
		t.Errorf("usage rows %+v; want the %d streams settled", rows, cutStreams)
	}
	// Both permits are back: two requests are admitted without waiting
	// (through the server that was not cut).
	for range streams {
		resp := post(h.url, "X-Llmgate-Max-Wait", "0")
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("after the cut, a request without waiting: %d; want its concurrency permit free", resp.StatusCode)
		}
	}
}

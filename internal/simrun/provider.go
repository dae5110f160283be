package simrun

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/internal/scenario"
	"github.com/llmgate/llmgate/internal/sim"
)

// warmupModel is the model of the requests that warm the replicas up
// before an arm starts; the provider answers it without a quota.
const warmupModel = "sim-warmup"

// maxProviderBody bounds a request body the recording wrapper reads.
const maxProviderBody = 4 << 20

// upstream is one simulated provider of an arm: a sim.Server per model
// (each model has its own quota, as with a real provider), an optional
// outage window, and a record of every call it answered.
type upstream struct {
	name    string
	sc      *scenario.Provider
	servers map[string]*sim.Server
	first   string
	start   time.Time
	srv     *http.Server
	ln      net.Listener
	served  chan struct{}

	inflight atomic.Int64

	mu    sync.Mutex // protects calls
	calls []call
}

// admitted reports whether the provider took the call on (answered it or
// was cut while answering it).
func (c call) admitted() bool { return c.status == 0 || c.status == http.StatusOK }

// call is one request that reached the provider.
type call struct {
	at      time.Duration // since the start of the arm
	model   string
	status  int
	prompt  [8]byte // hash of the messages
	session int     // -1 without a [sN tK] tag
	turn    int
}

// tagRE finds the [sN tK] tag of a conversation turn; the last one in a
// body is the turn's own (earlier ones are history).
var tagRE = regexp.MustCompile(`\[s([0-9]{1,6}) t([0-9]{1,6})\]`)

// newUpstream starts provider p on a free loopback port. The sim servers'
// concurrency limit is shared by all models, so it is enforced here.
func newUpstream(name string, p *scenario.Provider, seed uint64, start time.Time) (*upstream, error) {
	u := &upstream{name: name, sc: p, servers: map[string]*sim.Server{}, start: start, served: make(chan struct{})}
	for i, m := range p.Models {
		rpm, tpm := p.Limits(m)
		s, err := sim.New(sim.Config{
			Models: []string{m.Name}, RPM: rpm, TPM: tpm,
			TTFT: p.TTFT, TokenDelay: p.TokenDelay, Jitter: p.Jitter, ErrorRate: p.ErrorRate,
			Seed: seed + uint64(i)*7919,
		})
		if err != nil {
			return nil, err
		}
		u.servers[m.Name] = s
		if i == 0 {
			u.first = m.Name
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen on loopback: %w", err)
	}
	u.ln = ln
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(u.served)
		_ = u.srv.Serve(ln)
	}()
	return u, nil
}

// BaseURL is the OpenAI base URL of the provider.
func (u *upstream) BaseURL() string { return "http://" + u.ln.Addr().String() + "/v1" }

func (u *upstream) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := u.srv.Shutdown(ctx); err != nil {
		_ = u.srv.Close()
	}
	<-u.served
}

// statusWriter remembers the status of an answer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		// Models and the like: the first model's server answers.
		u.servers[u.first].Handler().ServeHTTP(w, r)
		return
	}
	at := time.Since(u.start)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxProviderBody))
	if err != nil {
		http.Error(w, `{"error":{"message":"body too large","type":"invalid_request_error","param":null,"code":null}}`, http.StatusRequestEntityTooLarge)
		return
	}
	var head struct {
		Model    string          `json:"model"`
		Messages json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal(body, &head)
	if head.Model == warmupModel {
		// Answered here: warming up costs no quota and is not counted.
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"chatcmpl-warmup","object":"chat.completion","created":0,"model":"`+warmupModel+`","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		return
	}
	c := call{at: at, model: head.Model, session: -1}
	sum := sha256.Sum256(append([]byte(head.Model+"\x00"), head.Messages...))
	copy(c.prompt[:], sum[:8])
	if m := tagRE.FindAllSubmatch(head.Messages, -1); len(m) > 0 {
		last := m[len(m)-1]
		c.session, _ = strconv.Atoi(string(last[1]))
		c.turn, _ = strconv.Atoi(string(last[2]))
	}
	sw := &statusWriter{ResponseWriter: w}
	n := u.inflight.Add(1)
	defer u.inflight.Add(-1)
	switch o := u.sc.Outage; {
	case o != nil && at >= o.Start && at < o.Start+o.Length:
		outage(sw, o.Status)
	case u.sc.Concurrency > 0 && n > u.sc.Concurrency:
		sw.Header().Set("retry-after", "1")
		sw.Header().Set("retry-after-ms", "1000")
		writeOpenAIError(sw, http.StatusTooManyRequests, "requests", "rate_limit_exceeded",
			fmt.Sprintf("Rate limit reached for %s in organization org-sim on concurrent requests: Limit %d. Please try again once a request completes.", head.Model, u.sc.Concurrency))
	default:
		s := u.servers[head.Model]
		if s == nil {
			s = u.servers[u.first] // answers 404 model_not_found
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		s.Handler().ServeHTTP(sw, r)
	}
	// 0: the client went away before the answer began (after admission:
	// the simulator admits or refuses at once).
	c.status = sw.status
	u.mu.Lock()
	u.calls = append(u.calls, c)
	u.mu.Unlock()
}

func outage(w http.ResponseWriter, status int) {
	if status == http.StatusTooManyRequests {
		w.Header().Set("retry-after", "1")
		writeOpenAIError(w, status, "requests", "rate_limit_exceeded", "Rate limit reached (simulated outage). Please try again in 1s.")
		return
	}
	writeOpenAIError(w, status, "server_error", "", "The engine is currently overloaded, please try again later. (simulated outage)")
}

func writeOpenAIError(w http.ResponseWriter, status int, typ, code, msg string) {
	var c any
	if code != "" {
		c = code
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": c}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// snapshot returns the calls recorded so far.
func (u *upstream) snapshot() []call {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]call(nil), u.calls...)
}

// billed returns the tokens the provider counted per model.
func (u *upstream) billed() map[string]sim.KeyStats {
	out := map[string]sim.KeyStats{}
	for m, s := range u.servers {
		out[m] = s.Stats().Total
	}
	return out
}

// warmTokenizer makes the simulator count one prompt, so that its
// vocabulary is loaded before the first arm rather than during it.
func warmTokenizer() {
	s, err := sim.New(sim.Config{Models: []string{DefaultWarmModel}})
	if err != nil {
		return
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"`+DefaultWarmModel+`","messages":[{"role":"user","content":"warm up"}]}`))
	s.Handler().ServeHTTP(httptest.NewRecorder(), req)
}

// DefaultWarmModel is a model whose vocabulary is the one most scenarios use.
const DefaultWarmModel = "gpt-4.1"

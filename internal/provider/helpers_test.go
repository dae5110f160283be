package provider

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
)

// testKey is the API key of every test target; no output may contain it.
const testKey = "sk-test-7f3c9a1e5b2d4c6e8f0a1b2c3d4e5f60"

// upstream is a scripted provider on loopback: request i is answered by
// steps[i] (the last step answers every later one), and every request is
// recorded.
type upstream struct {
	*httptest.Server
	clk clock.Clock

	mu    sync.Mutex // protects steps, first, reqs
	steps []http.HandlerFunc
	first int // index of the request steps[0] answers
	reqs  []seen
}

// seen is a request as the upstream received it.
type seen struct {
	method, path string
	header       http.Header
	body         []byte
	at           time.Time // on the upstream's clock
}

func newUpstream(t testing.TB, clk clock.Clock, steps ...http.HandlerFunc) *upstream {
	t.Helper()
	if clk == nil {
		clk = clock.Real{}
	}
	u := &upstream{clk: clk, steps: steps}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	i := len(u.reqs)
	u.reqs = append(u.reqs, seen{r.Method, r.URL.RequestURI(), r.Header.Clone(), body, u.clk.Now()})
	step := u.steps[min(i-u.first, len(u.steps)-1)]
	u.mu.Unlock()
	step(w, r)
}

// then replaces the script for the requests to come.
func (u *upstream) then(steps ...http.HandlerFunc) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.steps, u.first = steps, len(u.reqs)
}

func (u *upstream) received() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.reqs...)
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.reqs)
}

// reply answers status with body and headers given as name, value pairs.
func reply(status int, body string, kv ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(kv); i += 2 {
			w.Header().Set(kv[i], kv[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// errBody is OpenAI's error shape.
func errBody(typ, code string) string {
	return `{"error":{"message":"test","type":"` + typ + `","param":null,"code":"` + code + `"}}`
}

// hangUp reads the request and drops the connection without an answer.
func hangUp(w http.ResponseWriter, r *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

// okBody is the answer of a successful call.
const okBody = `{"id":"chatcmpl-1","object":"chat.completion","choices":[]}`

var answerOK = reply(http.StatusOK, okBody)

// hold answers only once release is closed; arrived is closed when the
// request is in.
func hold(arrived, release chan struct{}, then http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		select {
		case <-release:
			then(w, r)
		case <-r.Context().Done():
		}
	}
}

// testClock is a fake clock that records the duration of every AfterFunc.
// AfterFuncs shorter than jump (backoff sleeps; the time-to-headers timers
// are longer) move the time forward at once, so that sleeps end at once.
type testClock struct {
	*clock.Fake
	jump time.Duration

	mu    sync.Mutex // protects after
	after []time.Duration
}

var start = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func newTestClock(jump time.Duration) *testClock {
	return &testClock{Fake: clock.NewFake(start), jump: jump}
}

func (c *testClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Fake.AfterFunc(d, f)
	c.mu.Lock()
	c.after = append(c.after, d)
	c.mu.Unlock()
	if d < c.jump {
		c.Advance(d)
	}
	return t
}

// timers returns the durations of every AfterFunc so far.
func (c *testClock) timers() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.after...)
}

// newClient returns a client with tiny backoffs (unless cfg says
// otherwise).
func newClient(t testing.TB, cfg Config) *Client {
	t.Helper()
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = time.Millisecond
		cfg.BackoffMax = max(cfg.BackoffMax, 4*time.Millisecond)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func targetOf(u *upstream) *Target {
	return &Target{
		Name:    "openai#1/gpt-4.1",
		BaseURL: u.URL + "/v1/",
		APIKey:  testKey,
		Header:  http.Header{"Openai-Organization": {"org-test"}},
	}
}

var chatReq = Request{Path: "/chat/completions", Body: []byte(`{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`)}

// readAll reads and closes a response body.
func readAll(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return string(b)
}

// refusedURL returns a loopback URL nothing listens on.
func refusedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return "http://" + addr + "/v1"
}

// feedbacks collects what Config.Feedback was told.
type feedbacks struct {
	mu  sync.Mutex
	got []Feedback
}

func (f *feedbacks) record(t *Target, fb Feedback) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, fb)
}

func (f *feedbacks) all() []Feedback {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Feedback(nil), f.got...)
}

func itoa(n int) string { return strconv.Itoa(n) }

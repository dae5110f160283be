// Package provider calls upstream OpenAI-compatible APIs with retries, a circuit breaker per deployment and timeouts learned from each deployment's latency.
//
// Client.Do sends one request to one Target (a provider key + model). It
// retries 429, 500, 502, 503, 504, 529 and connection errors with
// exponential backoff and full jitter, waiting at least what the upstream
// asked for (retry-after-ms, retry-after), and never past the caller's
// deadline: when the wait does not fit, the last response is returned as
// it came so the gateway can pass it on. Each target has a circuit breaker
// (consecutive failed calls open it; after a pause one trial call decides)
// and an adaptive time-to-headers timeout learned from its recent
// latencies. Every response's rate-limit headers are reported through
// Config.Feedback. Errors and logs never contain a target's API key.
package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors returned by this package. Every error Do returns wraps exactly one
// of ErrBreakerOpen, ErrTimeout, ErrUnreachable or ErrInvalidRequest.
var (
	// ErrBreakerOpen means the target's circuit breaker is open (or its
	// half-open trial is in flight): nothing was sent.
	ErrBreakerOpen = errors.New("provider: circuit breaker open")
	// ErrTimeout means the upstream sent no response headers within the
	// target's adaptive timeout, or the caller's deadline passed (then the
	// error also wraps context.DeadlineExceeded).
	ErrTimeout = errors.New("provider: upstream timed out")
	// ErrUnreachable means the upstream could not be reached or dropped the
	// connection; the transport's error is wrapped. It also marks a call
	// the caller cancelled (with context.Canceled wrapped).
	ErrUnreachable = errors.New("provider: upstream unreachable")
	// ErrInvalidRequest means the target or request cannot be sent (no
	// target, a base URL that is not http(s), a bad method): a
	// configuration or programming error, never retried.
	ErrInvalidRequest = errors.New("provider: invalid target or request")
	// ErrInvalidConfig wraps every problem Config.Validate finds.
	ErrInvalidConfig = errors.New("provider: invalid config")
)

// Target is one deployment: a provider key and a model.
type Target struct {
	// Name labels metrics and logs and keys the breaker and the latency
	// history, e.g. "openai#2/gpt-4.1".
	Name string
	// BaseURL is the API root, e.g. "https://api.openai.com/v1"; a
	// trailing slash is ignored.
	BaseURL string
	// APIKey is sent as "Authorization: Bearer APIKEY" (none when empty).
	// It is a secret: never logged, never in an error, never printed.
	APIKey string
	// Header holds extra static headers for this deployment (may be nil),
	// e.g. OpenAI-Organization. They override the caller's headers, and an
	// APIKey overrides their Authorization.
	Header http.Header
	// Kind is the API's dialect: KindOpenAI (""), KindAnthropic or
	// KindAzure. It decides how the key is sent and, for Azure, the URL.
	Kind string
	// APIVersion is the anthropic-version header sent when the caller
	// sent none (KindAnthropic; default DefaultAnthropicVersion), or the
	// api-version query parameter (KindAzure, required).
	APIVersion string
	// AzureDeployment is the Azure deployment name the model is served
	// under (KindAzure): paths go to BaseURL/openai/deployments/NAME/...
	AzureDeployment string
}

// The API dialects a Target speaks.
const (
	// KindOpenAI sends the key as "Authorization: Bearer KEY".
	KindOpenAI = ""
	// KindAnthropic sends it as "x-api-key: KEY", with anthropic-version.
	KindAnthropic = "anthropic"
	// KindAzure sends it as "api-key: KEY", to deployment URLs with an
	// api-version.
	KindAzure = "azure"
)

// statusOverloaded is Anthropic's 529: the API is overloaded for everyone.
const statusOverloaded = 529

// DefaultAnthropicVersion is the anthropic-version sent when neither the
// caller nor the target sets one.
const DefaultAnthropicVersion = "2023-06-01"

// keyHeaders are the headers a key can travel in: a caller's are never
// forwarded.
var keyHeaders = []string{"Authorization", "X-Api-Key", "Api-Key"}

func isKeyHeader(k string) bool {
	for _, h := range keyHeaders {
		if strings.EqualFold(k, h) {
			return true
		}
	}
	return false
}

// targetPath is the path of req.Path on t: for Azure, under the
// deployment, with the api-version in the query.
func targetPath(t *Target, path string) string {
	if t.Kind != KindAzure {
		return path
	}
	p, q, _ := strings.Cut(path, "?")
	v := "api-version=" + url.QueryEscape(t.APIVersion)
	if q != "" {
		v += "&" + q
	}
	return "/openai/deployments/" + url.PathEscape(t.AzureDeployment) + p + "?" + v
}

// String returns the target's name and base URL (without any userinfo).
func (t Target) String() string { return fmt.Sprintf("%s (%s)", t.Name, redactURL(t.BaseURL)) }

// Format prints String for every verb, so that %#v or %d cannot reveal the key.
func (t Target) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, t.String()) }

// LogValue logs the name and base URL only.
func (t Target) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", t.Name), slog.String("base_url", redactURL(t.BaseURL)))
}

// MarshalJSON writes the name and base URL only: a dumped target never
// carries its key or headers.
func (t Target) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Name    string `json:"name"`
		BaseURL string `json:"base_url"`
	}{t.Name, redactURL(t.BaseURL)})
}

// Request is one upstream call.
type Request struct {
	// Method defaults to POST.
	Method string
	// Path is appended to the target's BaseURL, e.g. "/chat/completions";
	// it may carry a query string.
	Path string
	// Body is sent as is, and again on each retry. It must not be modified
	// until the response body is closed.
	Body []byte
	// Header holds the client headers to forward (filtered by the gateway);
	// may be nil. Authorization is never forwarded: the target's key
	// replaces it.
	Header http.Header
	// OwnHeader gives Header to Do, which then adds the target's headers
	// and key to it instead of to a copy: the caller must not use it again.
	OwnHeader bool
	// Stream marks a streaming call. Its time to headers (the time to the
	// first token, roughly) is tracked apart from non-streaming calls (the
	// whole generation), so that neither skews the other's timeout.
	Stream bool
	// NoRetry429 returns a 429 at once (after Feedback) instead of waiting
	// its retry-after and retrying: a caller with a shared limiter retries
	// through the limiter, so that the retry takes its turn with everyone
	// else's requests.
	NoRetry429 bool
	// BeforeAttempt, when set, is called right before each attempt is
	// sent, retries included; an error from it ends Do with that error
	// (as it is) and nothing more is sent. A caller whose right to send
	// can lapse while it waits (a session lease) checks it here, as late
	// as it can be checked.
	BeforeAttempt func() error
}

// Result tells how a Do call went.
type Result struct {
	// Attempts is the number of requests sent (0 when none was).
	Attempts int
	// Retried holds the status of each attempt that was retried, or 0 for a
	// connection error or a timeout.
	Retried []int
	// Waited is the total time slept between attempts.
	Waited time.Duration
	// Latencies holds each attempt's time to headers (or to its error), in
	// order.
	Latencies []time.Duration
}

// Client sends requests to targets. Create it with New; it is safe for
// concurrent use.
type Client struct {
	cfg    Config
	tmo    timeouts
	log    *slog.Logger
	states sync.Map // target name → *targetState
	// send makes one attempt's round trip within a time-to-headers bound
	// (roundTripWithin) kept on the client's clock.
	send func(req *http.Request, d time.Duration) (*http.Response, error)
}

// targetState is what the client keeps per target name.
type targetState struct {
	br   breaker
	lat  [2]latency // [0] non-streaming, [1] streaming
	auth atomic.Pointer[authHeader]
	// urls holds the parsed URL of each upstream URL called (base URL
	// plus path), so that a call does not parse it again; at most
	// maxCachedURLs.
	urls  sync.Map // string -> *url.URL, never modified
	nurls atomic.Int32
}

// maxCachedURLs bounds targetState.urls: a target is called on a handful
// of paths (one per endpoint).
const maxCachedURLs = 32

// parseURL returns the parsed form of raw, a URL of st's target.
func (st *targetState) parseURL(raw string) (*url.URL, error) {
	if u, ok := st.urls.Load(raw); ok {
		return u.(*url.URL), nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if st.nurls.Add(1) <= maxCachedURLs {
		st.urls.Store(raw, u)
	}
	return u, nil
}

// authHeader caches the Authorization value of a key, so that a call does
// not build the string again.
type authHeader struct {
	key   string
	value []string
}

// New checks cfg, fills in its defaults and returns a Client.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	cfg = cfg.withDefaults()
	c := &Client{
		cfg: cfg,
		tmo: timeouts{floor: cfg.TimeoutFloor, ceiling: cfg.TimeoutCeiling, multiplier: cfg.TimeoutMultiplier},
		log: cfg.Logger,
	}
	after := func(d time.Duration, f func()) interface{ Stop() bool } { return cfg.Clock.AfterFunc(d, f) }
	c.send = func(req *http.Request, d time.Duration) (*http.Response, error) {
		return roundTripWithin(cfg.Transport, req, d, after)
	}
	return c, nil
}

// CloseIdleConnections closes the transport's idle connections, if it has
// any to close.
func (c *Client) CloseIdleConnections() {
	if t, ok := c.cfg.Transport.(interface{ CloseIdleConnections() }); ok {
		t.CloseIdleConnections()
	}
}

// state returns the state of a target name, creating it on first use.
func (c *Client) state(name string) *targetState {
	if v, ok := c.states.Load(name); ok {
		return v.(*targetState)
	}
	st := &targetState{}
	st.lat[0].init(c.tmo)
	st.lat[1].init(c.tmo)
	v, _ := c.states.LoadOrStore(name, st)
	return v.(*targetState)
}

// lookup returns the state of a target name, or nil if it was never used.
func (c *Client) lookup(name string) *targetState {
	if v, ok := c.states.Load(name); ok {
		return v.(*targetState)
	}
	return nil
}

// State returns the breaker state of a target name: "closed", "open" or
// "half-open" (an open breaker whose pause is over reads as half-open).
// A name never used is "closed".
func (c *Client) State(name string) string {
	st := c.lookup(name)
	if st == nil {
		return "closed"
	}
	s, _ := st.br.status(c.cfg.Clock.Now())
	return s
}

// Available reports whether a call to the target would be sent now,
// without taking the half-open trial.
func (c *Client) Available(name string) bool {
	st := c.lookup(name)
	if st == nil {
		return true
	}
	_, ok := st.br.status(c.cfg.Clock.Now())
	return ok
}

// Timeout returns the current time-to-headers timeout of the target's
// non-streaming calls.
func (c *Client) Timeout(name string) time.Duration { return c.timeout(name, false) }

// StreamTimeout returns the current time-to-headers timeout of the
// target's streaming calls.
func (c *Client) StreamTimeout(name string) time.Duration { return c.timeout(name, true) }

func (c *Client) timeout(name string, stream bool) time.Duration {
	st := c.lookup(name)
	if st == nil {
		return c.tmo.ceiling
	}
	return st.lat[b2i(stream)].current()
}

// ReportFailure counts a failure seen after Do returned (a stream that
// broke halfway, an idle timeout) against the target's breaker. The time
// to headers of that call stays in the latency history: it was measured.
func (c *Client) ReportFailure(t *Target) {
	if t == nil {
		return
	}
	st := c.state(t.Name)
	c.logTransition(t, st.br.reportFailure(c.cfg.Clock.Now(), c.cfg.BreakerFailures, c.cfg.BreakerOpenFor))
}

// attempt is the result of one request.
type attempt struct {
	resp *http.Response // nil on error
	err  error          // the transport's error, or errHeaderTimeout
	// retryable: a status or error worth another attempt.
	retryable  bool
	retryAfter time.Duration
	timeout    time.Duration // the time-to-headers timeout the attempt ran with
}

// errHeaderTimeout is the cause of an attempt cancelled by its
// time-to-headers timer.
var errHeaderTimeout = errors.New("provider: no response headers within the adaptive timeout")

// Do sends req to t, retrying 429, 500, 502, 503, 504, 529, connection
// errors and time-to-headers timeouts (not other statuses) up to
// MaxAttempts, with backoff and full jitter, waiting at least the
// upstream's retry-after-ms / retry-after. A wait that would end after the
// context's deadline, or exceeds MaxRetryWait, is not started: Do returns
// the last response (body intact) or error instead. A 429 whose body says
// insufficient_quota, or a response with "x-should-retry: false", is not
// retried.
//
// Each attempt must receive its response headers within the target's
// adaptive timeout (and, for a status of 400 or more, the first 64 KiB of
// its error body, read ahead and replayed); the returned response's body is
// then the caller's to read (bounded by ctx only) and close: closing it
// releases the attempt's resources. The target's breaker is consulted first:
// when open, Do returns ErrBreakerOpen at once and sends nothing; a
// half-open breaker lets exactly one call through, with a single attempt.
//
// Any status that is not retried is returned with a nil error, unread. For
// the breaker, a connection error, a timeout or a final 5xx (but 501) is a
// failure, a 429 or the caller's cancellation counts for nothing, and any
// other status is a success. Errors wrap one of the package's sentinels
// and the cause, and never contain the key.
func (c *Client) Do(ctx context.Context, t *Target, req Request) (*http.Response, Result, error) {
	var res Result
	if ctx == nil || t == nil {
		return nil, res, fmt.Errorf("%w: Do needs a context and a target", ErrInvalidRequest)
	}
	if err := ctx.Err(); err != nil {
		return nil, res, c.ctxError(t, err, "before sending")
	}
	st := c.state(t.Name)
	base, err := c.newRequest(t, st, &req)
	if err != nil {
		return nil, res, err
	}
	tk, ok := st.br.allow(c.cfg.Clock.Now())
	if !ok {
		next := "a trial call is in flight"
		if d := st.br.retryIn(c.cfg.Clock.Now()); d > 0 {
			next = fmt.Sprintf("next trial in %v", d.Round(time.Millisecond))
		}
		return nil, res, fmt.Errorf("%w: %q failed %d times in a row; %s", ErrBreakerOpen, t.Name, c.cfg.BreakerFailures, next)
	}
	maxAttempts := c.cfg.MaxAttempts
	if tk.trial {
		maxAttempts = 1 // a half-open breaker's trial is one request, not a burst
	}
	lat := &st.lat[b2i(req.Stream)]
	res.Latencies = make([]time.Duration, 0, min(maxAttempts, 4))
	for {
		if req.BeforeAttempt != nil {
			if err := req.BeforeAttempt(); err != nil {
				c.finish(t, st, tk, neutral)
				return nil, res, err
			}
		}
		a, took := c.attempt(ctx, t, base, &req, lat)
		res.Attempts++
		res.Latencies = append(res.Latencies, took)
		if a.err != nil && a.err != errHeaderTimeout && ctx.Err() != nil {
			c.finish(t, st, tk, neutral)
			return nil, res, c.ctxError(t, ctx.Err(), "waiting for the response headers")
		}
		stop := ""
		if a.retryable {
			if wait, why := c.retryWait(ctx, st, tk, &res, &a, maxAttempts); why != "" {
				stop = why
			} else {
				status := 0
				if a.resp != nil {
					status = a.resp.StatusCode
					_ = a.resp.Body.Close() // read to its end already when small: the connection is reused
				}
				res.Retried = append(res.Retried, status)
				if c.log.Enabled(ctx, slog.LevelDebug) {
					c.log.LogAttrs(ctx, slog.LevelDebug, "provider: retrying", slog.String("target", t.Name),
						slog.Int("attempt", res.Attempts), slog.Int("status", status),
						slog.String("error", errString(a.err, t)), slog.Duration("wait", wait))
				}
				if err := c.sleep(ctx, wait); err != nil {
					c.finish(t, st, tk, neutral)
					return nil, res, c.ctxError(t, err, fmt.Sprintf("waiting %v to retry after %d attempts", wait, res.Attempts))
				}
				res.Waited += wait
				continue
			}
		}
		if a.resp != nil {
			c.finish(t, st, tk, statusOutcome(a.resp.StatusCode))
			if stop != "" && c.log.Enabled(ctx, slog.LevelDebug) {
				c.log.LogAttrs(ctx, slog.LevelDebug, "provider: not retrying", slog.String("target", t.Name),
					slog.Int("status", a.resp.StatusCode), slog.String("reason", stop))
			}
			return a.resp, res, nil
		}
		c.finish(t, st, tk, failure)
		if stop != "" {
			stop = " (" + stop + ")"
		}
		if a.err == errHeaderTimeout {
			return nil, res, fmt.Errorf("%w: %q sent no response headers within %v, its adaptive timeout%s",
				ErrTimeout, t.Name, a.timeout, stop)
		}
		return nil, res, fmt.Errorf("%w: %q%s: %w", ErrUnreachable, t.Name, stop, redact(a.err, t))
	}
}

// retryWait returns the wait before the next attempt, or why there is none.
func (c *Client) retryWait(ctx context.Context, st *targetState, tk ticket, res *Result, a *attempt, maxAttempts int) (time.Duration, string) {
	switch {
	case res.Attempts >= maxAttempts:
		return 0, fmt.Sprintf("gave up after %d attempts", res.Attempts)
	case !tk.trial && st.br.isOpen():
		return 0, "gave up: the breaker opened meanwhile"
	case a.retryAfter > c.cfg.MaxRetryWait:
		return 0, fmt.Sprintf("not retried: the upstream asks to wait %v, more than MaxRetryWait (%v)", a.retryAfter, c.cfg.MaxRetryWait)
	}
	wait := c.backoff(len(res.Retried), a.retryAfter)
	if !fits(ctx, wait) {
		return 0, fmt.Sprintf("not retried: the deadline is too close for a %v wait", wait.Round(time.Millisecond))
	}
	return wait, ""
}

// attempt sends one request and reads what the retry decision needs. Its
// bound (the adaptive timeout) covers the wait for headers and, for an
// error status, the read of the (small) error body; never the body of a
// successful response.
func (c *Client) attempt(ctx context.Context, t *Target, base *http.Request, req *Request, lat *latency) (attempt, time.Duration) {
	body := req.Body
	a := attempt{timeout: lat.current()}
	r := base.WithContext(ctx)
	if len(body) > 0 {
		r.Body = newBodyReader(body)
	}
	start := c.cfg.Clock.Now()
	resp, err := c.send(r, a.timeout)
	took := c.cfg.Clock.Now().Sub(start)
	if err != nil {
		if errors.Is(err, errHeaderTimeout) {
			err = errHeaderTimeout
		}
		return attempt{err: err, retryable: true, timeout: a.timeout}, took
	}

	status := resp.StatusCode
	a.retryable = retryableStatus(status) && !strings.EqualFold(resp.Header.Get("X-Should-Retry"), "false")
	b := &respBody{rc: resp.Body}
	resp.Body = b
	kind, reported := "", LimitReport{}
	if status >= 400 {
		// Error bodies are small: read them now, within the bound, so that
		// a retry finds the connection free and a 429's kind is known.
		if err := b.peek(); errors.Is(err, errHeaderTimeout) {
			_ = resp.Body.Close()
			return attempt{err: errHeaderTimeout, retryable: true, timeout: a.timeout}, took
		}
		if status == http.StatusTooManyRequests {
			var quota bool
			kind, quota, reported = rateLimitInfo(b.buf)
			a.retryable = a.retryable && !quota && !req.NoRetry429
		}
	}
	if status >= 200 && status < 300 {
		lat.observe(took, c.tmo)
	}
	if a.retryable || c.cfg.Feedback != nil {
		f := parseFeedback(status, resp.Header, c.cfg.Clock.Now())
		a.retryAfter = f.RetryAfter
		if c.cfg.Feedback != nil && (status == http.StatusTooManyRequests || status == statusOverloaded || f.HasLimits()) {
			f.Kind, f.Reported = kind, reported
			c.cfg.Feedback(t, f)
		}
	}
	a.resp = resp
	return a, took
}

// newRequest builds the request every attempt is a copy of.
func (c *Client) newRequest(t *Target, st *targetState, req *Request) (*http.Request, error) {
	method := req.Method
	if method == "" {
		method = http.MethodPost
	}
	path := req.Path
	if path != "" && path[0] != '/' {
		// Without the slash, "@host" in a path would become the URL's host
		// and the key would go there.
		path = "/" + path
	}
	if !validMethod(method) {
		return nil, fmt.Errorf("%w: %q: invalid method %q", ErrInvalidRequest, t.Name, method)
	}
	cached, err := st.parseURL(strings.TrimSuffix(t.BaseURL, "/") + targetPath(t, path))
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL may carry secrets in its query: do not repeat it
		}
		return nil, fmt.Errorf("%w: %q: %s %s: %w", ErrInvalidRequest, t.Name, method, redactURL(t.BaseURL), redact(err, t))
	}
	if (cached.Scheme != "http" && cached.Scheme != "https") || cached.Host == "" {
		return nil, fmt.Errorf("%w: %q: base URL %q is not an http(s) URL with a host", ErrInvalidRequest, t.Name, redactURL(t.BaseURL))
	}
	u := *cached // the transport gets its own copy: nothing may change the cached one
	// No context here: each attempt makes its copy with its own.
	r := &http.Request{
		Method: method, URL: &u, Host: strings.TrimSuffix(u.Host, ":"), // as http.NewRequest sets it
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: header(t, st, req.Header, req.OwnHeader, len(req.Body) > 0),
	}
	if n := len(req.Body); n > 0 {
		b := req.Body
		r.ContentLength = int64(n)
		// GetBody lets the transport replay the body itself (HTTP/2 retry
		// after GOAWAY, a redirect) without copying it.
		r.GetBody = func() (io.ReadCloser, error) { return newBodyReader(b), nil }
	}
	return r, nil
}

// newBodyReader returns a request body read from b. It must be
// io.NopCloser over a *bytes.Reader: net/http knows that one is in memory
// and writes headers and body in one write; any other type makes it send
// the headers first, then copy the body through a 32 KiB buffer.
func newBodyReader(b []byte) io.ReadCloser {
	return io.NopCloser(bytes.NewReader(b))
}

var jsonContentType = []string{"application/json"}

// validMethod reports whether m is an HTTP method token, as
// http.NewRequest requires.
func validMethod(m string) bool {
	return m != "" && strings.IndexFunc(m, func(r rune) bool {
		return r <= ' ' || r >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", r)
	}) < 0
}

// header merges the caller's headers, the target's and the key. The
// slices are shared, not copied: nothing on the way modifies them.
// With own, in itself is completed and returned.
func header(t *Target, st *targetState, in http.Header, own, hasBody bool) http.Header {
	var h http.Header
	if own && in != nil {
		h = in
		for k := range h {
			if isKeyHeader(k) { // the tenant's key must never reach the provider
				delete(h, k)
			}
		}
	} else {
		h = make(http.Header, len(in)+len(t.Header)+2)
		for k, v := range in {
			if !isKeyHeader(k) {
				h[k] = v
			}
		}
	}
	for k, v := range t.Header {
		h[k] = v
	}
	if t.APIKey != "" {
		a := st.auth.Load()
		if a == nil || a.key != t.APIKey {
			v := "Bearer " + t.APIKey
			if t.Kind != KindOpenAI {
				v = t.APIKey
			}
			a = &authHeader{key: t.APIKey, value: []string{v}}
			st.auth.Store(a)
		}
		switch t.Kind {
		case KindAnthropic:
			h["X-Api-Key"] = a.value
		case KindAzure:
			h["Api-Key"] = a.value
		default:
			h["Authorization"] = a.value
		}
	}
	if t.Kind == KindAnthropic && h.Get("Anthropic-Version") == "" {
		v := t.APIVersion
		if v == "" {
			v = DefaultAnthropicVersion
		}
		h["Anthropic-Version"] = []string{v}
	}
	if hasBody && h["Content-Type"] == nil {
		h["Content-Type"] = jsonContentType
	}
	return h
}

// finish tells the breaker how the call went and logs a state change.
func (c *Client) finish(t *Target, st *targetState, tk ticket, o outcome) {
	c.logTransition(t, st.br.record(tk, o, c.cfg.Clock.Now(), c.cfg.BreakerFailures, c.cfg.BreakerOpenFor))
}

func (c *Client) logTransition(t *Target, tr transition) {
	switch tr {
	case opened:
		c.log.Warn("provider: circuit breaker opened", slog.String("target", t.Name),
			slog.Int("failures", c.cfg.BreakerFailures), slog.Duration("open_for", c.cfg.BreakerOpenFor))
	case reopened:
		c.log.Warn("provider: circuit breaker trial failed; open again", slog.String("target", t.Name),
			slog.Duration("open_for", c.cfg.BreakerOpenFor))
	case closed:
		c.log.Info("provider: circuit breaker closed", slog.String("target", t.Name))
	}
}

// backoff returns the wait before retry k (k = 0 for the first retry): a
// uniform random time in [0, min(BackoffMax, BackoffBase·2^k)), and at
// least retryAfter.
func (c *Client) backoff(k int, retryAfter time.Duration) time.Duration {
	ceil := c.cfg.BackoffMax
	if k < 63 && c.cfg.BackoffBase <= ceil>>k {
		ceil = c.cfg.BackoffBase << k
	}
	r := c.cfg.Rand()
	if !(r > 0) { // also NaN
		r = 0
	}
	d := time.Duration(min(r, 1) * float64(ceil))
	if d >= ceil {
		d = max(ceil-1, 0)
	}
	return max(d, retryAfter)
}

// sleep waits d on the client's clock, or until ctx ends.
func (c *Client) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	done := make(chan struct{})
	t := c.cfg.Clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

// fits reports whether a wait of d ends before ctx's deadline. Deadlines
// are real time, whatever the client's clock.
func fits(ctx context.Context, d time.Duration) bool {
	dl, ok := ctx.Deadline()
	return !ok || d < time.Until(dl)
}

// ctxError wraps the caller's context error: a passed deadline is a
// timeout, a cancellation leaves the upstream's answer unknown.
func (c *Client) ctxError(t *Target, err error, while string) error {
	sentinel := ErrUnreachable
	if errors.Is(err, context.DeadlineExceeded) {
		sentinel = ErrTimeout
	}
	return fmt.Errorf("%w: %q: the caller's context ended %s: %w", sentinel, t.Name, while, err)
}

// retryableStatus reports the statuses worth another attempt: rate
// limiting and transient server trouble (529 is "overloaded").
func retryableStatus(s int) bool {
	switch s {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout, 529:
		return true
	}
	return false
}

// statusOutcome is what a final status says about the target's health.
func statusOutcome(s int) outcome {
	switch {
	case s == http.StatusTooManyRequests:
		return neutral
	case s >= 500 && s != http.StatusNotImplemented: // 501: the endpoint, not the target, is the problem
		return failure
	}
	return success
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// peekLimit bounds what is read ahead of an error response's body.
const peekLimit = 64 << 10

// respBody is a response body handed to the caller: the bytes read ahead
// (an error body, to parse it and free the connection) come first.
type respBody struct {
	buf []byte
	rc  io.ReadCloser
}

// peek reads up to peekLimit bytes ahead. If that was the whole body, the
// underlying body is closed (its connection free); otherwise what was read
// is served first, and the read's error, if any, is returned.
func (b *respBody) peek() error {
	buf, err := io.ReadAll(io.LimitReader(b.rc, peekLimit+1))
	b.buf = buf
	if err != nil || len(buf) > peekLimit {
		return err
	}
	_ = b.rc.Close()
	b.rc = http.NoBody
	return nil
}

func (b *respBody) Read(p []byte) (int, error) {
	if len(b.buf) > 0 {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		return n, nil
	}
	return b.rc.Read(p)
}

// Close may run concurrently with Read (a caller cuts a stalled stream by
// closing its body from another goroutine), so it touches only rc, whose
// Close is safe for that.
func (b *respBody) Close() error { return b.rc.Close() }

// redactedError hides a target's key in an error's text.
type redactedError struct {
	err    error
	secret string
}

func (e *redactedError) Error() string {
	return strings.ReplaceAll(e.err.Error(), e.secret, "[redacted]")
}

func (e *redactedError) Unwrap() error { return e.err }

// redact wraps err so that its text never shows t's key, should a
// transport or a proxy have echoed it.
func redact(err error, t *Target) error {
	if err == nil || t.APIKey == "" {
		return err
	}
	return &redactedError{err: err, secret: t.APIKey}
}

// errString renders err for a log line, without the key.
func errString(err error, t *Target) string {
	if err == nil {
		return ""
	}
	return redact(err, t).Error()
}

// redactURL removes any userinfo, query and fragment from a URL (either
// may carry a key, as in "?key=..."), for messages.
func redactURL(s string) string {
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s = s[:i]
	}
	u, err := url.Parse(s)
	if err != nil {
		if i := strings.LastIndex(s, "@"); i >= 0 {
			if j := strings.Index(s, "://"); j >= 0 && j < i {
				return s[:j+3] + "xxxxx" + s[i:]
			}
			return "xxxxx" + s[i:]
		}
		return s
	}
	if u.User != nil {
		u.User = url.User("xxxxx")
	}
	return u.String()
}

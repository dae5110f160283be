package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
)

func TestRetryThenSuccess(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  http.HandlerFunc
		retry int // the status Result.Retried reports
	}{
		{"429", reply(http.StatusTooManyRequests, errBody("requests", "rate_limit_exceeded")), 429},
		{"500", reply(http.StatusInternalServerError, errBody("server_error", "")), 500},
		{"502", reply(http.StatusBadGateway, "bad gateway"), 502},
		{"503", reply(http.StatusServiceUnavailable, errBody("server_error", "")), 503},
		{"504", reply(http.StatusGatewayTimeout, ""), 504},
		{"529", reply(529, `{"type":"error","error":{"type":"overloaded_error"}}`), 529},
		{"connection reset", hangUp, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUpstream(t, nil, tc.fail, answerOK)
			c := newClient(t, Config{})
			req := chatReq
			req.Header = http.Header{"X-Client": {"kept"}, "Authorization": {"Bearer tenant-key"}, "authorization": {"Bearer lower"}}
			resp, res, err := c.Do(t.Context(), targetOf(u), req)
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			if resp.StatusCode != http.StatusOK || readAll(t, resp) != okBody {
				t.Fatalf("got %d, want 200 with the upstream's body", resp.StatusCode)
			}
			if res.Attempts != 2 || !slices.Equal(res.Retried, []int{tc.retry}) || len(res.Latencies) != 2 {
				t.Fatalf("Result %+v, want 2 attempts, Retried [%d], 2 latencies", res, tc.retry)
			}
			got := u.received()
			if len(got) != 2 {
				t.Fatalf("upstream saw %d requests, want 2", len(got))
			}
			for i, r := range got {
				if r.method != http.MethodPost || r.path != "/v1/chat/completions" || string(r.body) != string(chatReq.Body) {
					t.Errorf("request %d: %s %s %q, want POST /v1/chat/completions with the body", i, r.method, r.path, r.body)
				}
				if a := r.header.Values("Authorization"); !slices.Equal(a, []string{"Bearer " + testKey}) {
					t.Errorf("request %d: Authorization %q, want only the target's key", i, a)
				}
				if r.header.Get("Openai-Organization") != "org-test" || r.header.Get("X-Client") != "kept" ||
					r.header.Get("Content-Type") != "application/json" {
					t.Errorf("request %d: headers %v, want the target's, the client's and a JSON content type", i, r.header)
				}
			}
			if s := c.State("openai#1/gpt-4.1"); s != "closed" {
				t.Errorf("breaker %s after a success, want closed", s)
			}
		})
	}
}

func TestNoRetryOnClientErrors(t *testing.T) {
	for _, status := range []int{400, 401, 403, 404, 409, 413, 422, 501} {
		t.Run(itoa(status), func(t *testing.T) {
			body := errBody("invalid_request_error", "bad")
			u := newUpstream(t, nil, reply(status, body), answerOK)
			c := newClient(t, Config{BreakerFailures: 1})
			resp, res, err := c.Do(t.Context(), targetOf(u), chatReq)
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			if resp.StatusCode != status || readAll(t, resp) != body {
				t.Fatalf("got %d, want %d with its body", resp.StatusCode, status)
			}
			if res.Attempts != 1 || res.Retried != nil || u.count() != 1 {
				t.Fatalf("Result %+v and %d requests, want exactly one attempt", res, u.count())
			}
			if s := c.State("openai#1/gpt-4.1"); s != "closed" {
				t.Errorf("breaker %s after %d, want closed (a client error says nothing of the target's health)", s, status)
			}
		})
	}
}

func TestNoRetryWhenUpstreamSaysSo(t *testing.T) {
	for name, step := range map[string]http.HandlerFunc{
		"insufficient_quota": reply(429, errBody("insufficient_quota", "insufficient_quota")),
		"x-should-retry":     reply(503, errBody("server_error", ""), "x-should-retry", "false"),
	} {
		t.Run(name, func(t *testing.T) {
			u := newUpstream(t, nil, step, answerOK)
			c := newClient(t, Config{})
			resp, res, err := c.Do(t.Context(), targetOf(u), chatReq)
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			if res.Attempts != 1 || u.count() != 1 {
				t.Fatalf("%d attempts, %d requests; want 1", res.Attempts, u.count())
			}
		})
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	date := start.Add(-time.Second) // the upstream's clock lags ours: only its own Date counts
	for _, tc := range []struct {
		name string
		kv   []string
		want time.Duration
	}{
		{"retry-after seconds", []string{"retry-after", "2"}, 2 * time.Second},
		{"retry-after-ms", []string{"retry-after-ms", "1500"}, 1500 * time.Millisecond},
		{"retry-after-ms preferred", []string{"retry-after", "9", "retry-after-ms", "250"}, 250 * time.Millisecond},
		{"retry-after HTTP date", []string{"Date", date.Format(http.TimeFormat), "retry-after", date.Add(3 * time.Second).Format(http.TimeFormat)}, 3 * time.Second},
		{"503 retry-after", []string{"retry-after", "4"}, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newTestClock(time.Hour)
			status := http.StatusTooManyRequests
			if strings.HasPrefix(tc.name, "503") {
				status = http.StatusServiceUnavailable
			}
			u := newUpstream(t, clk, reply(status, errBody("requests", "rate_limit_exceeded"), tc.kv...), answerOK)
			// Rand 0: the jitter alone would not wait at all.
			c := newClient(t, Config{Clock: clk, Rand: func() float64 { return 0 }, TimeoutCeiling: 2 * time.Hour,
				BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second})
			resp, res, err := c.Do(t.Context(), targetOf(u), chatReq)
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			if res.Waited != tc.want || res.Attempts != 2 {
				t.Fatalf("waited %v over %d attempts, want %v over 2", res.Waited, res.Attempts, tc.want)
			}
			got := u.received()
			if gap := got[1].at.Sub(got[0].at); gap != tc.want {
				t.Fatalf("the retry came %v after the first request, want %v", gap, tc.want)
			}
		})
	}
}

func TestRetryAfterBeyondMaxRetryWait(t *testing.T) {
	u := newUpstream(t, nil, reply(429, errBody("tokens", "rate_limit_exceeded"), "retry-after", "120"), answerOK)
	c := newClient(t, Config{MaxRetryWait: time.Minute})
	resp, res, err := c.Do(t.Context(), targetOf(u), chatReq)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "120" || res.Attempts != 1 {
		t.Fatalf("got %d after %d attempts, want the 429 with its retry-after at once", resp.StatusCode, res.Attempts)
	}
	readAll(t, resp)
}

func TestNoRetryWhenDeadlineTooShort(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		kv     []string
	}{
		{"429 retry-after", 429, []string{"retry-after", "5"}},
		{"429 retry-after-ms", 429, []string{"retry-after-ms", "3000", "x-ratelimit-remaining-requests", "0"}},
		{"503 retry-after", 503, []string{"retry-after", "5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := errBody("requests", "rate_limit_exceeded")
			u := newUpstream(t, nil, reply(tc.status, body, tc.kv...), answerOK)
			var fb feedbacks
			c := newClient(t, Config{Feedback: fb.record})
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			resp, res, err := c.Do(ctx, targetOf(u), chatReq)
			if err != nil {
				t.Fatalf("Do: %v, want the last response", err)
			}
			if resp.StatusCode != tc.status || res.Attempts != 1 || u.count() != 1 {
				t.Fatalf("got %d after %d attempts (%d requests), want %d after 1", resp.StatusCode, res.Attempts, u.count(), tc.status)
			}
			if got := readAll(t, resp); got != body {
				t.Fatalf("body %q, want the upstream's %q", got, body)
			}
			if tc.status == 429 {
				f := fb.all()
				if len(f) != 1 || f[0].Kind != "requests" || f[0].RetryAfter < 3*time.Second {
					t.Fatalf("feedback %+v, want one 429 of kind requests with its retry-after", f)
				}
			}
		})
	}
	t.Run("jitter past the deadline", func(t *testing.T) {
		c := newClient(t, Config{BackoffBase: 5 * time.Second, BackoffMax: 10 * time.Second, Rand: func() float64 { return 0.9 }})
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, res, err := c.Do(ctx, &Target{Name: "down", BaseURL: refusedURL(t), APIKey: testKey}, chatReq)
		if !errors.Is(err, ErrUnreachable) || res.Attempts != 1 || !strings.Contains(err.Error(), "deadline") {
			t.Fatalf("err %v after %d attempts, want ErrUnreachable at once, naming the deadline", err, res.Attempts)
		}
	})
}

func TestMaxAttempts(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		t.Run(itoa(n), func(t *testing.T) {
			body := errBody("server_error", "")
			u := newUpstream(t, nil, reply(503, body))
			c := newClient(t, Config{MaxAttempts: n})
			resp, res, err := c.Do(t.Context(), targetOf(u), chatReq)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 503 || readAll(t, resp) != body {
				t.Fatalf("got %d, want the last 503 with its body", resp.StatusCode)
			}
			if res.Attempts != n || u.count() != n || len(res.Retried) != n-1 {
				t.Fatalf("Result %+v, %d requests; want %d attempts", res, u.count(), n)
			}
		})
	}
	t.Run("connection refused", func(t *testing.T) {
		c := newClient(t, Config{MaxAttempts: 3})
		_, res, err := c.Do(t.Context(), &Target{Name: "down", BaseURL: refusedURL(t), APIKey: testKey}, chatReq)
		if !errors.Is(err, ErrUnreachable) || res.Attempts != 3 || !slices.Equal(res.Retried, []int{0, 0}) {
			t.Fatalf("err %v, Result %+v; want ErrUnreachable after 3 attempts", err, res)
		}
		if !strings.Contains(err.Error(), "gave up after 3 attempts") {
			t.Errorf("error %q does not say it gave up", err)
		}
	})
}

func TestBackoffFullJitter(t *testing.T) {
	const base, most = 200 * time.Millisecond, 10 * time.Second
	for _, r := range []float64{0, 1e-9, 0.25, 0.5, 0.999999, math.Nextafter(1, 0), 1, 1.5, -1, math.NaN(), math.Inf(1)} {
		c := newClient(t, Config{BackoffBase: base, BackoffMax: most, Rand: func() float64 { return r }})
		for k := range 70 {
			bound := most
			if k < 6 {
				bound = min(most, base<<k)
			}
			d := c.backoff(k, 0)
			if d < 0 || d >= bound {
				t.Fatalf("rand %v, retry %d: wait %v, want in [0, %v)", r, k, d, bound)
			}
			if r >= 0 && r < 1 {
				if want := time.Duration(r * float64(bound)); d != want {
					t.Fatalf("rand %v, retry %d: wait %v, want %v", r, k, d, want)
				}
			}
			if got := c.backoff(k, 3*most); got != 3*most {
				t.Fatalf("retry-after 30s: wait %v, want it honoured", got)
			}
		}
	}
	t.Run("end to end", func(t *testing.T) {
		clk := newTestClock(time.Hour)
		u := newUpstream(t, clk, reply(500, ""), reply(502, ""), reply(503, ""), answerOK)
		c := newClient(t, Config{Clock: clk, TimeoutCeiling: 2 * time.Hour, MaxAttempts: 4,
			BackoffBase: 2 * time.Second, BackoffMax: 5 * time.Second, Rand: func() float64 { return 0.5 }})
		resp, res, err := c.Do(t.Context(), targetOf(u), chatReq)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		// Bounds 2s, 4s, min(5s, 8s): half of each.
		if want := time.Second + 2*time.Second + 2500*time.Millisecond; res.Waited != want || !slices.Equal(res.Retried, []int{500, 502, 503}) {
			t.Fatalf("Result %+v, want waits totalling %v after 500, 502, 503", res, want)
		}
	})
}

// TestFeedbackFromResponses: a 429's feedback has its headers, the kind of
// limit its body names and what its message reports about that limit; a
// 200's has its headers.
func TestFeedbackFromResponses(t *testing.T) {
	tpm429 := `{"error":{"message":"Rate limit reached for gpt-4.1 in organization org-x on tokens per min (TPM): Limit 30000, Used 29990, Requested 48. Please try again in 1ms.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`
	u := newUpstream(t, nil,
		reply(429, tpm429, "retry-after-ms", "1",
			"x-ratelimit-limit-tokens", "30000", "x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "6m0s"),
		reply(200, okBody, "x-ratelimit-limit-requests", "500", "x-ratelimit-remaining-requests", "499", "x-ratelimit-reset-requests", "120ms"),
		answerOK)
	var fb feedbacks
	c := newClient(t, Config{Feedback: fb.record})
	for range 2 {
		resp, _, err := c.Do(t.Context(), targetOf(u), chatReq)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	got := fb.all()
	want := []Feedback{
		{Status: 429, RetryAfter: time.Millisecond, LimitRequests: -1, RemainingRequests: -1, LimitTokens: 30000, RemainingTokens: 0,
			ResetRequests: -1, ResetTokens: 6 * time.Minute, Kind: "tokens",
			LimitInputTokens: -1, RemainingInputTokens: -1, LimitOutputTokens: -1, RemainingOutputTokens: -1, ResetInputTokens: -1, ResetOutputTokens: -1,
			Reported: LimitReport{Kind: "tokens", Window: time.Minute, Limit: 30000, Used: 29990, Requested: 48}},
		{Status: 200, LimitRequests: 500, RemainingRequests: 499, LimitTokens: -1, RemainingTokens: -1,
			ResetRequests: 120 * time.Millisecond, ResetTokens: -1,
			LimitInputTokens: -1, RemainingInputTokens: -1, LimitOutputTokens: -1, RemainingOutputTokens: -1, ResetInputTokens: -1, ResetOutputTokens: -1},
	}
	// The third response (the second call) has no rate-limit headers: no feedback.
	if !slices.Equal(got, want) {
		t.Fatalf("feedback\n got %+v\nwant %+v", got, want)
	}
}

func TestLargeErrorBodyIntact(t *testing.T) {
	big := strings.Repeat("x", peekLimit*3+17)
	u := newUpstream(t, nil, reply(500, big))
	c := newClient(t, Config{MaxAttempts: 1})
	resp, _, err := c.Do(t.Context(), targetOf(u), chatReq)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != big {
		t.Fatalf("body of %d bytes, want the %d the upstream sent", len(got), len(big))
	}
}

func TestCallerCancellation(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	u := newUpstream(t, nil, hold(arrived, release, answerOK))
	c := newClient(t, Config{BreakerFailures: 1})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, _, err := c.Do(ctx, targetOf(u), chatReq)
		errc <- err
	}()
	<-arrived
	cancel()
	err := <-errc
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrUnreachable) {
		t.Fatalf("err %v, want context.Canceled wrapped in ErrUnreachable", err)
	}
	if s := c.State("openai#1/gpt-4.1"); s != "closed" {
		t.Fatalf("breaker %s, want closed: a caller giving up says nothing of the target", s)
	}

	ctx, cancel = context.WithTimeout(t.Context(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	if _, _, err := c.Do(ctx, targetOf(u), chatReq); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want context.DeadlineExceeded wrapped in ErrTimeout", err)
	}
}

func TestInvalid(t *testing.T) {
	for _, cfg := range []Config{
		{MaxAttempts: -1}, {BackoffBase: -time.Second}, {BackoffBase: time.Minute, BackoffMax: time.Second},
		{TimeoutFloor: time.Minute, TimeoutCeiling: time.Second}, {TimeoutMultiplier: 0.5},
		{TimeoutMultiplier: math.NaN()}, {BreakerFailures: -3}, {MaxRetryWait: -1},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	c := newClient(t, Config{})
	for _, tc := range []struct {
		t   *Target
		req Request
	}{
		{nil, chatReq},
		{&Target{Name: "x", BaseURL: "ftp://host/v1", APIKey: testKey}, chatReq},
		{&Target{Name: "x", BaseURL: "", APIKey: testKey}, chatReq},
		{&Target{Name: "x", BaseURL: "http://[::1", APIKey: testKey}, chatReq},
		{&Target{Name: "x", BaseURL: "http://host", APIKey: testKey}, Request{Method: "BAD METHOD"}},
	} {
		_, res, err := c.Do(t.Context(), tc.t, tc.req)
		if !errors.Is(err, ErrInvalidRequest) || res.Attempts != 0 {
			t.Errorf("Do(%v, %+v) = %v, want ErrInvalidRequest and no attempt", tc.t, tc.req.Method, err)
		}
	}
	var noCtx context.Context // a nil context is refused, not a crash
	if _, _, err := c.Do(noCtx, &Target{BaseURL: "http://host"}, chatReq); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("nil context: %v, want ErrInvalidRequest", err)
	}
}

func TestPathCannotChangeHost(t *testing.T) {
	u := newUpstream(t, nil, answerOK)
	c := newClient(t, Config{})
	tg := targetOf(u)
	tg.BaseURL = u.URL // no path, no trailing slash
	resp, _, err := c.Do(t.Context(), tg, Request{Method: http.MethodGet, Path: "@evil.example/models"})
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := u.received(); len(got) != 1 || got[0].path != "/@evil.example/models" {
		t.Fatalf("requests %+v, want one to /@evil.example/models on the target's host", got)
	}
}

// TestBodyReadableAfterDo checks that the returned body is not bound to
// the attempt's timer nor cut when Do returns.
func TestBodyReadableAfterDo(t *testing.T) {
	u := newUpstream(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		for i := range 3 {
			_, _ = io.WriteString(w, "chunk"+itoa(i)+";")
			http.NewResponseController(w).Flush()
			time.Sleep(30 * time.Millisecond) // a slow stream, longer in total than the timeout
		}
	})
	c := newClient(t, Config{TimeoutFloor: 20 * time.Millisecond, TimeoutCeiling: 20 * time.Millisecond})
	resp, _, err := c.Do(t.Context(), targetOf(u), chatReq)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != "chunk0;chunk1;chunk2;" {
		t.Fatalf("body %q, want all three chunks", got)
	}
}

// TestCloseEndsAttemptContext checks that an attempt leaves nothing on
// the caller's context once the body is read, which a long-lived context
// would otherwise keep forever: the context the time-to-headers timer
// cancels ends with the body, on the real clock and on a fake one.
func TestCloseEndsAttemptContext(t *testing.T) {
	u := newUpstream(t, nil, answerOK)
	for _, tc := range []struct {
		name  string
		clock clock.Clock
	}{{"real", nil}, {"fake", newTestClock(0)}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			c := newClient(t, Config{Clock: tc.clock})
			resp, _, err := c.Do(ctx, targetOf(u), chatReq)
			if err != nil {
				t.Fatal(err)
			}
			actx := resp.Request.Context()
			if actx.Err() != nil {
				t.Fatalf("the attempt's context ended before the body was read: %v", actx.Err())
			}
			readAll(t, resp)
			select {
			case <-actx.Done():
			default:
				t.Fatal("closing the body left the attempt's context alive")
			}
		})
	}
}

// TestParseURLCache: a target's URLs are parsed once and shared read-only,
// up to maxCachedURLs; past that they are still parsed right.
func TestParseURLCache(t *testing.T) {
	st := &targetState{}
	a, err := st.parseURL("http://127.0.0.1:1/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := st.parseURL("http://127.0.0.1:1/v1/chat/completions")
	if a != b {
		t.Error("the same URL was parsed twice")
	}
	for i := range 2 * maxCachedURLs {
		raw := fmt.Sprintf("http://127.0.0.1:1/v1/p%d", i)
		u, err := st.parseURL(raw)
		if err != nil || u.String() != raw {
			t.Fatalf("parseURL(%q) = %v, %v", raw, u, err)
		}
	}
	n := 0
	st.urls.Range(func(any, any) bool { n++; return true })
	if n > maxCachedURLs {
		t.Errorf("%d URLs cached, at most %d wanted", n, maxCachedURLs)
	}
	if _, err := st.parseURL("http://[::1"); err == nil {
		t.Error("a bad URL parsed")
	}
}

// TestHeaderOwned: with OwnHeader the caller's map is completed in place,
// and the caller's Authorization is still dropped for the target's key.
func TestHeaderOwned(t *testing.T) {
	tg := &Target{Name: "t", APIKey: "sk-target", Header: http.Header{"X-Target": {"1"}}}
	for _, own := range []bool{false, true} {
		in := http.Header{"authorization": {"Bearer sk-tenant"}, "X-Request-Id": {"r1"}}
		h := header(tg, &targetState{}, in, own, true)
		//lint:ignore SA1008 a non-canonical key, as a hand-built header may have: it must not get through
		if got := h.Get("Authorization"); got != "Bearer sk-target" || len(h.Values("Authorization")) != 1 || h["authorization"] != nil {
			t.Errorf("own=%v: Authorization %q (%v)", own, got, h)
		}
		if h.Get("X-Request-Id") != "r1" || h.Get("X-Target") != "1" || h.Get("Content-Type") != "application/json" {
			t.Errorf("own=%v: headers %v", own, h)
		}
		if same := len(in) == len(h) && in.Get("X-Target") == "1"; same != own {
			t.Errorf("own=%v: the caller's map was completed in place: %v", own, same)
		}
	}
}

// TestBeforeAttempt: the check runs right before every attempt, retries
// included; once it fails, Do returns its error as it is and sends
// nothing more.
func TestBeforeAttempt(t *testing.T) {
	errStop := errors.New("no longer allowed to send")
	u := newUpstream(t, nil, reply(http.StatusServiceUnavailable, errBody("server_error", "")))
	c := newClient(t, Config{MaxAttempts: 5})
	checks := 0
	req := chatReq
	req.BeforeAttempt = func() error {
		checks++
		if checks == 3 {
			return errStop
		}
		return nil
	}
	resp, res, err := c.Do(t.Context(), targetOf(u), req)
	if resp != nil || err != errStop {
		t.Fatalf("Do: %v %v; want exactly the check's error", resp, err)
	}
	if res.Attempts != 2 || u.count() != 2 || checks != 3 {
		t.Fatalf("%d attempts, %d at the upstream, %d checks; want 2, 2 and 3 (one before each attempt)", res.Attempts, u.count(), checks)
	}
	if s := c.State("openai#1/gpt-4.1"); s != "closed" {
		t.Errorf("breaker %s; a stopped call says nothing of the upstream's health", s)
	}
}

package provider

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"
)

const name = "openai#1/gpt-4.1"

// breakerClient is a client on a fake clock with one attempt per call, so
// that every call is one breaker outcome.
func breakerClient(t *testing.T, clk *testClock, failures int) *Client {
	return newClient(t, Config{Clock: clk, MaxAttempts: 1, BreakerFailures: failures, BreakerOpenFor: 30 * time.Second})
}

func call(t *testing.T, c *Client, tg *Target) (int, error) {
	t.Helper()
	resp, _, err := c.Do(t.Context(), tg, chatReq)
	if err != nil {
		return 0, err
	}
	readAll(t, resp)
	return resp.StatusCode, nil
}

func TestBreakerOpensAndFailsFast(t *testing.T) {
	clk := newTestClock(0)
	u := newUpstream(t, clk, reply(500, errBody("server_error", "")))
	c := breakerClient(t, clk, 3)
	tg := targetOf(u)
	for i := range 3 {
		if s := c.State(name); s != "closed" || !c.Available(name) {
			t.Fatalf("after %d failures: %s, want closed and available", i, s)
		}
		if status, err := call(t, c, tg); status != 500 || err != nil {
			t.Fatalf("call %d: %d %v, want the 500", i, status, err)
		}
	}
	if s := c.State(name); s != "open" || c.Available(name) {
		t.Fatalf("after 3 failures: %s, want open and unavailable", s)
	}
	_, res, err := c.Do(t.Context(), tg, chatReq)
	if !errors.Is(err, ErrBreakerOpen) || res.Attempts != 0 || u.count() != 3 {
		t.Fatalf("open breaker: %v, %d attempts, %d requests; want ErrBreakerOpen with nothing sent", err, res.Attempts, u.count())
	}
	clk.Advance(29 * time.Second)
	if _, err := call(t, c, tg); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("before BreakerOpenFor: %v, want ErrBreakerOpen", err)
	}
	clk.Advance(time.Second)
	if s := c.State(name); s != "half-open" || !c.Available(name) {
		t.Fatalf("after BreakerOpenFor: %s, want half-open and available", s)
	}
}

func TestBreakerCountsOnlyConsecutiveFailures(t *testing.T) {
	clk := newTestClock(0)
	u := newUpstream(t, clk, reply(500, ""), reply(503, ""), reply(400, ""), reply(502, ""), reply(504, ""),
		reply(429, errBody("requests", "rate_limit_exceeded")), reply(429, ""), reply(429, ""), reply(429, ""), reply(529, ""))
	c := breakerClient(t, clk, 3)
	tg := targetOf(u)
	for i := range 9 { // 2 failures, a 4xx (success), 2 failures, 4 rate-limited
		if _, err := call(t, c, tg); err != nil {
			t.Fatal(err)
		}
		if s := c.State(name); s != "closed" {
			t.Fatalf("after call %d: %s, want closed (a 4xx resets the count, a 429 does not count)", i, s)
		}
	}
	if _, err := call(t, c, tg); err != nil { // the third failure in a row
		t.Fatal(err)
	}
	if s := c.State(name); s != "open" {
		t.Fatalf("after 3 failures in a row (429s between them): %s, want open", s)
	}
}

func TestBreakerConnectionErrorsAndReportFailure(t *testing.T) {
	clk := newTestClock(0)
	c := breakerClient(t, clk, 2)
	down := &Target{Name: "down", BaseURL: refusedURL(t), APIKey: testKey}
	for range 2 {
		if _, err := call(t, c, down); !errors.Is(err, ErrUnreachable) {
			t.Fatalf("err %v, want ErrUnreachable", err)
		}
	}
	if s := c.State("down"); s != "open" {
		t.Fatalf("after 2 connection errors: %s, want open", s)
	}

	u := newUpstream(t, clk, answerOK)
	tg := targetOf(u)
	if _, err := call(t, c, tg); err != nil {
		t.Fatal(err)
	}
	c.ReportFailure(tg) // e.g. the stream broke halfway
	if s := c.State(name); s != "closed" {
		t.Fatalf("after one reported failure: %s, want closed", s)
	}
	c.ReportFailure(tg)
	if s := c.State(name); s != "open" {
		t.Fatalf("after two reported failures: %s, want open", s)
	}
	c.ReportFailure(nil) // no panic
}

func TestBreakerHalfOpenLetsOneTrialThrough(t *testing.T) {
	clk := newTestClock(0)
	u := newUpstream(t, clk, reply(503, ""))
	c := breakerClient(t, clk, 2)
	tg := targetOf(u)
	for range 2 {
		if _, err := call(t, c, tg); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(30 * time.Second)
	arrived, release := make(chan struct{}), make(chan struct{})
	u.then(hold(arrived, release, answerOK))

	const callers = 16
	var (
		wg      sync.WaitGroup
		startGo = make(chan struct{})
		mu      sync.Mutex
		refused int
		results = make(chan int, callers)
	)
	for range callers {
		wg.Go(func() {
			<-startGo
			resp, _, err := c.Do(t.Context(), tg, chatReq)
			if err != nil {
				if errors.Is(err, ErrBreakerOpen) {
					mu.Lock()
					refused++
					mu.Unlock()
				}
				results <- 0
				return
			}
			readAll(t, resp)
			results <- resp.StatusCode
		})
	}
	close(startGo)
	<-arrived // the trial is at the upstream; everyone else must be refused meanwhile
	for range callers - 1 {
		if status := <-results; status != 0 {
			t.Fatalf("a caller got %d while the trial was in flight, want ErrBreakerOpen", status)
		}
	}
	if s := c.State(name); s != "half-open" || c.Available(name) {
		t.Fatalf("during the trial: %s, available %v; want half-open and unavailable", s, c.Available(name))
	}
	close(release)
	wg.Wait()
	if status := <-results; status != 200 {
		t.Fatalf("the trial got %d, want 200", status)
	}
	if refused != callers-1 || u.count() != 3 {
		t.Fatalf("%d refused, %d requests at the upstream; want %d refused and exactly one trial", refused, u.count(), callers-1)
	}
	if s := c.State(name); s != "closed" {
		t.Fatalf("after a successful trial: %s, want closed", s)
	}
}

// TestRetriesStopWhenBreakerOpens checks that a retry loop gives up once
// its target's breaker opened, here by a failure reported while the first
// attempt was being answered.
func TestRetriesStopWhenBreakerOpens(t *testing.T) {
	clk := newTestClock(time.Hour)
	u := newUpstream(t, clk, reply(503, "", "x-ratelimit-remaining-requests", "5"), answerOK)
	var c *Client
	c = newClient(t, Config{Clock: clk, TimeoutCeiling: 2 * time.Hour, BreakerFailures: 1,
		Feedback: func(tg *Target, _ Feedback) { c.ReportFailure(tg) }})
	resp, res, err := c.Do(t.Context(), targetOf(u), chatReq)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 503 || res.Attempts != 1 || u.count() != 1 {
		t.Fatalf("got %d after %d attempts, want the 503 without retry", resp.StatusCode, res.Attempts)
	}
}

func TestBreakerTrial(t *testing.T) {
	clk := newTestClock(time.Hour) // backoff sleeps end at once
	u := newUpstream(t, clk, reply(500, ""))
	c := newClient(t, Config{Clock: clk, MaxAttempts: 3, BreakerFailures: 1, BreakerOpenFor: time.Minute, TimeoutCeiling: 2 * time.Hour})
	tg := targetOf(u)
	if _, err := call(t, c, tg); err != nil || u.count() != 3 {
		t.Fatalf("first call: %v after %d requests, want the 500 after 3", err, u.count())
	}
	if s := c.State(name); s != "open" {
		t.Fatalf("after the failure: %s, want open", s)
	}
	clk.Advance(time.Minute)
	_, res, err := c.Do(t.Context(), tg, chatReq)
	if err != nil || res.Attempts != 1 || u.count() != 4 {
		t.Fatalf("trial: %v after %d attempts, want the 500 after exactly one attempt", err, res.Attempts)
	}
	if s := c.State(name); s != "open" {
		t.Fatalf("after a failed trial: %s, want open again", s)
	}
	if _, err := call(t, c, tg); !errors.Is(err, ErrBreakerOpen) || u.count() != 4 {
		t.Fatalf("after a failed trial: %v, %d requests; want ErrBreakerOpen and nothing sent", err, u.count())
	}
	clk.Advance(time.Minute)
	u.then(reply(http.StatusTooManyRequests, errBody("requests", "rate_limit_exceeded")))
	if status, err := call(t, c, tg); status != 429 || err != nil || u.count() != 5 {
		t.Fatalf("trial answered 429: %d %v", status, err)
	}
	if s := c.State(name); s != "half-open" || !c.Available(name) {
		t.Fatalf("after a rate-limited trial: %s, want half-open and available for the next trial", s)
	}
	u.then(answerOK)
	if status, err := call(t, c, tg); status != 200 || err != nil {
		t.Fatalf("next trial: %d %v, want 200", status, err)
	}
	if s := c.State(name); s != "closed" {
		t.Fatalf("after a successful trial: %s, want closed", s)
	}
}

// TestBreakerIgnoresStaleResults checks that a call started before the
// breaker opened cannot close it by succeeding late.
func TestBreakerIgnoresStaleResults(t *testing.T) {
	var b breaker
	now := start
	slow, ok := b.allow(now)
	if !ok {
		t.Fatal("a new breaker refused a call")
	}
	for range 2 {
		tk, _ := b.allow(now)
		b.record(tk, failure, now, 2, time.Second)
	}
	if s, _ := b.status(now); s != "open" {
		t.Fatalf("%s, want open", s)
	}
	if tr := b.record(slow, success, now, 2, time.Second); tr != noChange {
		t.Fatalf("a stale success changed the breaker: %v", tr)
	}
	if s, _ := b.status(now); s != "open" {
		t.Fatalf("%s after a stale success, want open", s)
	}
	trial, ok := b.allow(now.Add(time.Second))
	if !ok || !trial.trial {
		t.Fatalf("after the pause: %+v %v, want the trial", trial, ok)
	}
	if _, ok := b.allow(now.Add(time.Second)); ok {
		t.Fatal("a second trial was let through")
	}
	if tr := b.record(trial, success, now, 2, time.Second); tr != closed {
		t.Fatalf("successful trial: %v, want closed", tr)
	}
	// The slow call fails now: it started two generations ago and must not
	// count against the breaker that has just closed.
	b.record(slow, failure, now, 2, time.Second)
	tk, _ := b.allow(now)
	b.record(tk, failure, now, 2, time.Second)
	if s, _ := b.status(now); s != "closed" {
		t.Fatalf("%s after one fresh and one stale failure, want closed", s)
	}
}

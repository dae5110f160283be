package provider

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdaptiveTimeout teaches a target latencies of 10ms to 200ms on a
// fake clock, then checks the timeout (4 × p95 = 4 × 190ms) and that a hung
// upstream is cut exactly there.
func TestAdaptiveTimeout(t *testing.T) {
	clk := newTestClock(0)
	var delay time.Duration
	u := newUpstream(t, clk, func(w http.ResponseWriter, r *http.Request) {
		clk.Advance(delay) // the upstream "takes" delay before its headers
		answerOK(w, r)
	})
	c := newClient(t, Config{Clock: clk, MaxAttempts: 1, BreakerFailures: 1,
		TimeoutFloor: 50 * time.Millisecond, TimeoutCeiling: time.Hour})
	tg := targetOf(u)
	for i := 1; i <= minSamples; i++ {
		if got := c.Timeout(name); got != time.Hour {
			t.Fatalf("after %d samples: timeout %v, want the ceiling until %d samples", i-1, got, minSamples)
		}
		delay = time.Duration(i) * 10 * time.Millisecond
		resp, res, err := c.Do(t.Context(), tg, chatReq)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if res.Latencies[0] != delay {
			t.Fatalf("latency %v, want %v", res.Latencies[0], delay)
		}
	}
	const want = 4 * 190 * time.Millisecond // p95 of 10..200ms is the 19th smallest
	if got := c.Timeout(name); got != want {
		t.Fatalf("timeout %v, want %v", got, want)
	}
	if got := c.StreamTimeout(name); got != time.Hour {
		t.Fatalf("stream timeout %v, want the ceiling: streaming calls are tracked apart", got)
	}

	arrived, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	u.then(hold(arrived, release, answerOK))
	errc := make(chan error, 1)
	go func() {
		_, _, err := c.Do(t.Context(), tg, chatReq)
		errc <- err
	}()
	<-arrived
	timers := clk.timers()
	if last := timers[len(timers)-1]; last != want {
		t.Fatalf("the attempt's timer is %v, want %v", last, want)
	}
	clk.Advance(want)
	err := <-errc
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), want.String()) {
		t.Fatalf("hung upstream: %v, want ErrTimeout naming %v", err, want)
	}
	if errors.Is(err, ErrUnreachable) {
		t.Fatalf("%v: a timeout must not also read as unreachable", err)
	}
	if s := c.State(name); s != "open" {
		t.Fatalf("breaker %s after a timeout with BreakerFailures 1, want open", s)
	}
}

// TestTimeoutSparesSlowBody checks that the time-to-headers timer stops
// once the headers are in: a stream slower than the timeout is read whole.
func TestTimeoutSparesSlowBody(t *testing.T) {
	clk := newTestClock(0)
	more := make(chan struct{})
	u := newUpstream(t, clk, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "data: first\n\n")
		http.NewResponseController(w).Flush()
		<-more
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	c := newClient(t, Config{Clock: clk, TimeoutFloor: 100 * time.Millisecond, TimeoutCeiling: 100 * time.Millisecond})
	resp, _, err := c.Do(t.Context(), targetOf(u), Request{Path: "/chat/completions", Body: chatReq.Body, Stream: true})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour) // far past the timeout: a timer still armed would cut the body
	close(more)
	if got := readAll(t, resp); got != "data: first\n\ndata: [DONE]\n\n" {
		t.Fatalf("body %q, want the whole stream", got)
	}
}

func TestTimeoutRealClock(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	u := newUpstream(t, nil, hold(arrived, release, answerOK))
	c := newClient(t, Config{MaxAttempts: 1, TimeoutFloor: 30 * time.Millisecond, TimeoutCeiling: 30 * time.Millisecond})
	_, res, err := c.Do(t.Context(), targetOf(u), chatReq)
	if !errors.Is(err, ErrTimeout) || res.Attempts != 1 {
		t.Fatalf("hung upstream: %v after %d attempts, want ErrTimeout", err, res.Attempts)
	}
}

func TestLatencyWindow(t *testing.T) {
	p := timeouts{floor: 10 * time.Millisecond, ceiling: time.Minute, multiplier: 4}
	var l latency
	l.init(p)
	for range 300 {
		l.observe(time.Second, p) // old samples, pushed out of the window below
	}
	if got := l.current(); got != 4*time.Second {
		t.Fatalf("timeout %v, want 4s", got)
	}
	dropped := -1
	for i := range latencyWindow + recomputeEvery {
		l.observe(time.Millisecond, p)
		if dropped < 0 && l.current() != 4*time.Second {
			dropped = i
		}
	}
	// The p95 of 256 samples is the 244th smallest: it turns fast once 244
	// fast samples are in (12 slow ones left), at the next recomputation.
	want := 244
	for (300+want)%recomputeEvery != 0 {
		want++
	}
	if dropped+1 != want {
		t.Fatalf("the timeout changed after %d fast samples, want %d", dropped+1, want)
	}
	if got := l.current(); got != p.floor {
		t.Fatalf("timeout %v after a window of 1ms samples, want the floor %v", got, p.floor)
	}
	for range latencyWindow {
		l.observe(time.Hour, p)
	}
	if got := l.current(); got != p.ceiling {
		t.Fatalf("timeout %v after a window of 1h samples, want the ceiling %v", got, p.ceiling)
	}
}

package h1

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// ErrHeaderTimeout is what RoundTripWithin and RoundTripTimer fail with
// (errors.Is) when the response did not come within their bound.
var ErrHeaderTimeout = errors.New("h1: no response headers in time")

// RoundTripWithin is RoundTrip with a bound d on the wait for the
// response: from the call until its headers are in and, for a status of
// 400 or more, until its body has been read too (error bodies are small
// and read at once; a server stalling on one is as stuck as one stalling
// before its headers). Past d, the call, or that body's Read, fails with
// an error that Is ErrHeaderTimeout. The body of any other response is not
// bounded.
//
// On the transport's own connections the bound is the connection's
// deadline, which costs no timer, context or closure; a request that goes
// to Fallback gets them (RoundTripTimer).
func (t *Transport) RoundTripWithin(req *http.Request, d time.Duration) (*http.Response, error) {
	return t.roundTrip(req, time.Now().Add(d))
}

// AfterFunc calls f in its own goroutine after d, unless stopped first, as
// time.AfterFunc does.
type AfterFunc func(d time.Duration, f func()) interface{ Stop() bool }

// RoundTripTimer is RoundTripWithin for any RoundTripper, with the bound
// kept by a timer that after starts (a fake clock's, in tests) and a
// context that the timer cancels.
func RoundTripTimer(rt http.RoundTripper, req *http.Request, d time.Duration, after AfterFunc) (*http.Response, error) {
	parent := req.Context()
	ctx, cancel := context.WithCancelCause(parent)
	timer := after(d, func() { cancel(ErrHeaderTimeout) })
	resp, err := rt.RoundTrip(req.WithContext(ctx))
	if err != nil {
		timer.Stop()
		if context.Cause(ctx) == ErrHeaderTimeout && parent.Err() == nil {
			err = fmt.Errorf("%w: %w", ErrHeaderTimeout, err)
		}
		cancel(nil)
		return nil, err
	}
	if resp.StatusCode < 400 {
		if !timer.Stop() {
			// The timer fired as the headers arrived: the body is cut. It
			// is a timeout like any other.
			_ = resp.Body.Close()
			cancel(nil)
			return nil, ErrHeaderTimeout
		}
		timer = nil
	}
	resp.Body = &timerBody{rc: resp.Body, ctx: ctx, cancel: cancel, timer: timer}
	return resp, nil
}

// timerBody is a response body of RoundTripTimer: its end stops the timer
// (if it still runs), its Close also cancels the call's context.
type timerBody struct {
	rc     io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	mu     sync.Mutex // protects timer: Close may run concurrently with Read
	timer  interface{ Stop() bool }
}

func (b *timerBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		b.stop()
		if context.Cause(b.ctx) == ErrHeaderTimeout && err != io.EOF {
			err = fmt.Errorf("%w: %w", ErrHeaderTimeout, err)
		}
	}
	return n, err
}

func (b *timerBody) Close() error {
	err := b.rc.Close()
	b.stop()
	b.cancel(nil)
	return err
}

func (b *timerBody) stop() {
	b.mu.Lock()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.mu.Unlock()
}

// timedOut reports whether err on a call or body whose connection carries
// RoundTripWithin's bound (bounded) is that bound passing rather than the
// context's cancellation, which also acts through the connection's
// deadline.
func timedOut(ctx context.Context, bounded bool, err error) bool {
	return bounded && ctx.Err() == nil && errors.Is(err, os.ErrDeadlineExceeded)
}

// clearDeadline lifts c's deadline once a bounded response's headers are
// in. A cancellation hook (see roundTrip) may have set its own deadline in
// the meantime: that one is put back.
func (c *conn) clearDeadline(ctx context.Context) {
	_ = c.nc.SetDeadline(time.Time{})
	if ctx.Err() != nil {
		_ = c.nc.SetDeadline(aLongTimeAgo)
	}
}

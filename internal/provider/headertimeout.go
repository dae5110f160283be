package provider

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// afterFunc calls f in its own goroutine after d unless stopped first, as
// time.AfterFunc does; a fake clock's in tests.
type afterFunc func(d time.Duration, f func()) interface{ Stop() bool }

// roundTripWithin sends req through rt with a bound d on the wait for the
// response: until its headers are in and, for a status of 400 or more,
// until its body has been read too. Error bodies are small and read at
// once, and a server that stalls on one is as stuck as one that stalls
// before its headers. Past d the call, or that body's Read, fails with an
// error wrapping errHeaderTimeout. A successful body is not bounded here:
// the gateway's idle timer watches streams.
func roundTripWithin(rt http.RoundTripper, req *http.Request, d time.Duration, after afterFunc) (*http.Response, error) {
	parent := req.Context()
	ctx, cancel := context.WithCancelCause(parent)
	timer := after(d, func() { cancel(errHeaderTimeout) })
	resp, err := rt.RoundTrip(req.WithContext(ctx))
	if err != nil {
		timer.Stop()
		if context.Cause(ctx) == errHeaderTimeout && parent.Err() == nil {
			err = fmt.Errorf("%w: %w", errHeaderTimeout, err)
		}
		cancel(nil)
		return nil, err
	}
	if resp.StatusCode < 400 {
		if !timer.Stop() {
			// The timer fired as the headers arrived, so the body is cut:
			// a timeout like any other.
			_ = resp.Body.Close()
			cancel(nil)
			return nil, errHeaderTimeout
		}
		timer = nil
	}
	resp.Body = &timerBody{rc: resp.Body, ctx: ctx, cancel: cancel, timer: timer}
	return resp, nil
}

// timerBody is a response body of roundTripWithin: its end stops the timer
// if it still runs, and its Close also cancels the call's context.
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
		if context.Cause(b.ctx) == errHeaderTimeout && err != io.EOF {
			err = fmt.Errorf("%w: %w", errHeaderTimeout, err)
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

package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
)

// Frames of a shared answer (dedup flights and cache entries): a head frame
// with the status and headers, then one frame per Write of the body (the
// whole JSON answer, or one SSE event).
const (
	frameHead = 'H'
	frameBody = 'B'
)

type headFrame struct {
	Status int         `json:"status"`
	Header http.Header `json:"header"`
}

// sharedHeader is the part of a response header that a follower or a cache
// hit repeats: not the request id (each request has its own) nor the rate
// limit state of the leader's tenant.
func sharedHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if k == "X-Request-Id" || k == "X-Llmgate-Dedup" || k == "X-Llmgate-Cache" || strings.HasPrefix(k, "X-Ratelimit-") {
			continue
		}
		out[k] = v
	}
	return out
}

func encodeHead(status int, h http.Header) []byte {
	b, _ := json.Marshal(headFrame{Status: status, Header: h}) // a header always marshals
	return append([]byte{frameHead}, b...)
}

// teeWriter writes a leader's answer to its client and copies it, frame by
// frame, to the flight's followers (publish) and to a cache entry (record).
// A leader that took over a flight after its client had already received
// part of the answer skips what the client has.
type teeWriter struct {
	http.ResponseWriter
	ctx     context.Context
	publish func(ctx context.Context, frame []byte) error // nil: no flight
	// record collects the answer for the cache; nil once it grew too big
	// or is not wanted.
	record    *recording
	status    int
	wroteHead bool
	// skipHead and skipFrames drop what the client already got.
	skipHead   bool
	skipFrames int
	// pubErr is the first publish failure; publishing stops after it (the
	// client still gets its answer).
	pubErr error
}

type recording struct {
	status int
	header http.Header
	frames [][]byte
	size   int64
	max    int64
}

func (t *teeWriter) WriteHeader(status int) {
	if t.wroteHead {
		return
	}
	t.wroteHead, t.status = true, status
	h := sharedHeader(t.ResponseWriter.Header())
	if t.record != nil {
		t.record.status, t.record.header = status, h
	}
	t.send(encodeHead(status, h))
	if !t.skipHead {
		t.ResponseWriter.WriteHeader(status)
	}
}

func (t *teeWriter) Write(p []byte) (int, error) {
	if !t.wroteHead {
		t.WriteHeader(http.StatusOK)
	}
	if t.record != nil {
		t.record.size += int64(len(p))
		if t.record.size > t.record.max {
			t.record = nil
		} else {
			t.record.frames = append(t.record.frames, append([]byte(nil), p...))
		}
	}
	frame := make([]byte, 1+len(p))
	frame[0] = frameBody
	copy(frame[1:], p)
	t.send(frame)
	if t.skipFrames > 0 {
		t.skipFrames--
		return len(p), nil
	}
	return t.ResponseWriter.Write(p)
}

func (t *teeWriter) send(frame []byte) {
	if t.publish == nil || t.pubErr != nil {
		return
	}
	t.pubErr = t.publish(t.ctx, frame)
}

// Flush passes through (SSE events are flushed one by one).
func (t *teeWriter) Flush() {
	if f, ok := t.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (t *teeWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// clientOnly returns the writer of w's client alone, without the copies a
// teeWriter makes: for what is meant for this client only.
func clientOnly(w http.ResponseWriter) http.ResponseWriter {
	for {
		t, ok := w.(*teeWriter)
		if !ok {
			return w
		}
		w = t.ResponseWriter
	}
}

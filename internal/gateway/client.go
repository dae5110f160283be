package gateway

import (
	"errors"
	"net/http"
	"os"
	"time"
)

// clientWriter bounds every write to the client: a client that stops
// reading would otherwise hold its connection, its upstream call and its
// reservations for as long as it likes. Each Write and Flush must finish
// within timeout, which is the answer's write bound and, once the answer
// is a stream, the bound of one event (a Write and the Flush after it).
type clientWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	// cut counts a client cut for being too slow, once.
	cut  func()
	done bool
	// status is the answer's status, once sent (0 before).
	status int
}

func (w *clientWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func newClientWriter(w http.ResponseWriter, timeout time.Duration, cut func()) *clientWriter {
	return &clientWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout, cut: cut}
}

func (w *clientWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.check(err)
	return n, err
}

// FlushError is what http.ResponseController.Flush calls. The Write
// before it set the deadline already: a Flush follows its Write at once.
func (w *clientWriter) FlushError() error {
	err := w.rc.Flush()
	w.check(err)
	return err
}

// Flush is FlushError for callers that know only http.Flusher.
func (w *clientWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the server's writer.
func (w *clientWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// release lifts the deadline once the handler is done with the
// connection, so that the next request on it starts unbounded.
func (w *clientWriter) release() { _ = w.rc.SetWriteDeadline(time.Time{}) }

func (w *clientWriter) check(err error) {
	if err != nil && !w.done && errors.Is(err, os.ErrDeadlineExceeded) {
		w.done = true
		w.cut()
	}
}

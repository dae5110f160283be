package gateway

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/ratelimit"
)

// readBody reads the request body up to the configured limit, within the
// body timeout: a client that trickles its body (a byte every few
// seconds) would otherwise hold the connection for as long as it likes.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if r.ContentLength > g.opt.HTTP.MaxBodyBytes {
		return nil, g.tooLarge()
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(g.opt.HTTP.BodyTimeout))
	size := 4096
	if r.ContentLength > 0 {
		size = int(r.ContentLength) + 1 // +1: room to read EOF without growing the buffer
	}
	buf := make([]byte, 0, size)
	lr := http.MaxBytesReader(w, r.Body, g.opt.HTTP.MaxBodyBytes)
	for {
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			// Lifted once the body is in: net/http goes on reading the
			// connection in the background to notice a client that
			// leaves, and a deadline passing there would cancel the
			// request. On failure the deadline stays, so that net/http
			// does not wait for the rest of the body either.
			_ = rc.SetReadDeadline(time.Time{})
			return buf, nil
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, g.tooLarge()
			}
			if r.ProtoMajor == 1 {
				// Else net/http would try to read the rest of the body
				// before it sends the answer.
				w.Header().Set("Connection", "close")
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				g.metrics.clientTimeout.WithLabelValues("body").Inc()
				return nil, errf(http.StatusRequestTimeout, openai.TypeInvalidRequest, "request_timeout", "",
					"The request body did not arrive within %s.", g.opt.HTTP.BodyTimeout)
			}
			return nil, openai.BadRequest("", "The request body could not be read: the connection ended early.")
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
	}
}

func (g *Gateway) tooLarge() *apiError {
	return errf(http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest, "request_too_large", "",
		"The request body is larger than this gateway accepts (%d bytes).", g.opt.HTTP.MaxBodyBytes)
}

// readHints applies the x-llmgate-priority and x-llmgate-max-wait headers.
func (g *Gateway) readHints(r *http.Request, c *call) *apiError {
	c.priority = c.tenant.Priority
	if p := r.Header.Get("X-Llmgate-Priority"); p != "" {
		switch strings.ToLower(strings.TrimSpace(p)) {
		case "interactive":
			c.priority = ratelimit.Interactive
		case "batch":
			c.priority = ratelimit.Batch
		default:
			return errf(http.StatusBadRequest, openai.TypeInvalidRequest, "invalid_header", "x-llmgate-priority",
				"Invalid x-llmgate-priority %q: use 'interactive' or 'batch'.", p)
		}
	}
	c.maxWait = g.opt.Admission.MaxWait
	if c.tenant.MaxWait != nil {
		c.maxWait = *c.tenant.MaxWait
	}
	if v := r.Header.Get("X-Llmgate-Max-Wait"); v != "" {
		d, err := parseWait(v)
		if err != nil {
			return errf(http.StatusBadRequest, openai.TypeInvalidRequest, "invalid_header", "x-llmgate-max-wait",
				"Invalid x-llmgate-max-wait %q: give seconds (\"2.5\") or a duration (\"500ms\", \"1m\").", v)
		}
		c.maxWait = d
	}
	return nil
}

// parseWait reads a wait given in seconds or as a Go duration.
func parseWait(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f < 0 || f > 86400 || f != f {
			return 0, errors.New("out of range")
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > 24*time.Hour {
		return 0, errors.New("bad duration")
	}
	return d, nil
}

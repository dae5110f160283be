package gatewaybench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// requestGrace bounds how long requests still in flight at the end of
	// a cell may take before they are cancelled.
	requestGrace = 30 * time.Second
	// maxErrors ends a cell early: failing requests return fast and would
	// only spin.
	maxErrors = 1000
	// maxErrorBody is how much of a refused request's body is kept for
	// the report.
	maxErrorBody = 300
)

// chatBody is every request: three messages and max_tokens 16, so that
// the answer is small and the figures are about the path, not the payload.
// It sets no temperature: llmgate de-duplicates identical temperature-0
// requests, and the benchmark would then measure the sharing, not the path.
var (
	chatBody = []byte(`{"model":"` + Model + `","max_tokens":16,"messages":[` +
		`{"role":"system","content":"You are a terse assistant. Answer in one short sentence."},` +
		`{"role":"assistant","content":"Hello. What would you like to know?"},` +
		`{"role":"user","content":"Why do gateways put rate limits in front of an LLM provider?"}]}`)
	streamBody = append(bytes.TrimSuffix(slices.Clone(chatBody), []byte("}")), []byte(`,"stream":true}`)...)
)

var (
	sseEventEnd = []byte("\n\n")
	sseDone     = []byte("data: [DONE]")
	choicesKey  = []byte(`"choices"`)
)

// load is one cell's load generator: closed loop, one keep-alive client
// per worker.
type load struct {
	url         string
	cell        Cell
	duration    time.Duration
	maxRequests int64
	clients     []*http.Client
	body        []byte
}

// workerStats is what one worker saw.
type workerStats struct {
	lat, ttfb []time.Duration
	ok, errs  int64
	firstErr  string
}

// loadResult is a cell's raw figures.
type loadResult struct {
	elapsed   time.Duration
	ok, errs  int64
	firstErr  string
	lat, ttfb []time.Duration // sorted
}

func newLoad(url string, cell Cell, duration time.Duration, maxRequests int64) *load {
	l := &load{url: url, cell: cell, duration: duration, maxRequests: maxRequests, body: chatBody}
	if cell.Stream {
		l.body = streamBody
	}
	for range cell.Concurrency {
		l.clients = append(l.clients, &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: cell.Concurrency,
			IdleConnTimeout:     90 * time.Second,
		}})
	}
	return l
}

// close drops the workers' connections, so that servers do not keep idle
// connections from earlier cells.
func (l *load) close() {
	for _, c := range l.clients {
		c.CloseIdleConnections()
	}
}

// warm sends one untimed request per worker, all at once, so that every
// connection is open before the clock starts. It returns the failures.
func (l *load) warm(ctx context.Context) (errs int64, first string) {
	var (
		mu sync.Mutex // protects errs, first
		wg sync.WaitGroup
	)
	for _, c := range l.clients {
		wg.Go(func() {
			pprof.Do(ctx, pprof.Labels("part", "client"), func(ctx context.Context) {
				var buf bytes.Buffer
				if _, _, err := l.do(ctx, c, &buf); err != nil && ctx.Err() == nil {
					mu.Lock()
					errs++
					if first == "" {
						first = "warm-up: " + err.Error()
					}
					mu.Unlock()
				}
			})
		})
	}
	wg.Wait()
	return errs, first
}

// run is the measured part: every worker sends requests back to back
// until the duration, the request bound or ctx ends it.
func (l *load) run(ctx context.Context) loadResult {
	ctx, cancel := context.WithTimeout(ctx, l.duration+requestGrace)
	defer cancel()
	stats := make([]workerStats, len(l.clients))
	var issued, errCount atomic.Int64
	start := time.Now()
	stop := start.Add(l.duration)
	var wg sync.WaitGroup
	for w, c := range l.clients {
		wg.Go(func() {
			pprof.Do(ctx, pprof.Labels("part", "client"), func(ctx context.Context) {
				// A context of its own: every request derives one from
				// it, and a parent shared by all workers would make them
				// queue on its mutex.
				ctx, wcancel := context.WithCancel(ctx)
				defer wcancel()
				st := &stats[w]
				var buf bytes.Buffer
				for issued.Add(1) <= l.maxRequests {
					t0 := time.Now()
					if !t0.Before(stop) || ctx.Err() != nil {
						return
					}
					lat, ttfb, err := l.do(ctx, c, &buf)
					if err != nil {
						if ctx.Err() != nil {
							return // cancelled, not failed
						}
						st.errs++
						if st.firstErr == "" {
							st.firstErr = err.Error()
						}
						if errCount.Add(1) >= maxErrors {
							cancel()
							return
						}
						continue
					}
					st.ok++
					st.lat = append(st.lat, lat)
					if l.cell.Stream {
						st.ttfb = append(st.ttfb, ttfb)
					}
				}
			})
		})
	}
	wg.Wait()
	res := loadResult{elapsed: time.Since(start)}
	for _, st := range stats {
		res.ok += st.ok
		res.errs += st.errs
		if res.firstErr == "" {
			res.firstErr = st.firstErr
		}
		res.lat = append(res.lat, st.lat...)
		res.ttfb = append(res.ttfb, st.ttfb...)
	}
	slices.Sort(res.lat)
	slices.Sort(res.ttfb)
	return res
}

// errBadAnswer is an answer that is 200 but not what the provider sends.
var errBadAnswer = errors.New("gatewaybench: bad answer")

// do sends one request and reads the whole answer into buf. lat is the
// time until the last byte was read; ttfb, for a stream, until the first
// complete SSE event was. Any status but 200 is an error.
func (l *load) do(ctx context.Context, c *http.Client, buf *bytes.Buffer) (lat, ttfb time.Duration, err error) {
	buf.Reset()
	t0 := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, bytes.NewReader(l.body))
	if err != nil {
		return 0, 0, err
	}
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header["Authorization"] = []string{"Bearer " + TenantKey}
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if !l.cell.Stream {
		_, err = buf.ReadFrom(resp.Body)
		lat = time.Since(t0)
	} else {
		// Read as it comes, to time the first event.
		scanned := 0
		for {
			if buf.Available() < 512 {
				buf.Grow(4096)
			}
			b := buf.AvailableBuffer()[:buf.Available()]
			n, rerr := resp.Body.Read(b)
			buf.Write(b[:n])
			if ttfb == 0 && n > 0 {
				if bytes.Contains(buf.Bytes()[max(scanned-1, 0):], sseEventEnd) {
					ttfb = time.Since(t0)
				}
				scanned = buf.Len()
			}
			if rerr != nil {
				if !errors.Is(rerr, io.EOF) {
					err = rerr
				}
				break
			}
		}
		lat = time.Since(t0)
	}
	if resp.StatusCode != http.StatusOK {
		b := buf.Bytes()
		if len(b) > maxErrorBody {
			b = b[:maxErrorBody]
		}
		return 0, 0, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	if err != nil {
		return 0, 0, fmt.Errorf("reading the answer: %w", err)
	}
	if l.cell.Stream {
		if ttfb == 0 || !bytes.HasSuffix(bytes.TrimRight(buf.Bytes(), "\n"), sseDone) {
			return 0, 0, fmt.Errorf("%w: the stream did not end with data: [DONE] (%d bytes)", errBadAnswer, buf.Len())
		}
	} else if !bytes.Contains(buf.Bytes(), choicesKey) {
		return 0, 0, fmt.Errorf("%w: no choices in a %d-byte answer", errBadAnswer, buf.Len())
	}
	return lat, ttfb, nil
}

package gatewaybench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/benchcli"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/storeurl"
)

const (
	// chatPath is appended to a variant's base URL.
	chatPath = "/chat/completions"
	// drainTimeout bounds the wait for a gateway's background work after
	// a cell.
	drainTimeout = 30 * time.Second
	// warmUp is the untimed run of every variant before the first
	// repetition (at most Duration): pools filled, heap grown.
	warmUp = 500 * time.Millisecond
)

// endpoint is a variant ready to take requests.
type endpoint struct {
	url   string // the chat completions URL
	drain func(context.Context) error
	// redis, for the redis variant, reads the server's CPU time and
	// command counts.
	redis rueidis.Client
}

// bench is a run's servers: the provider and every variant.
type bench struct {
	endpoints map[string]*endpoint
	closers   []func()
}

func (b *bench) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// serveLoopback serves h on a fresh loopback port with net/http's server;
// its goroutines carry the profiler label part=part. It returns the base
// URL (with /v1).
func (b *bench) serveLoopback(part string, h http.Handler) (string, error) {
	return b.serveOn(part, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second})
}

// server is what serveOn needs of an HTTP server.
type server interface {
	Serve(net.Listener) error
	Close() error
}

func (b *bench) serveOn(part string, srv server) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("%w: listen on loopback: %w", ErrSetup, err)
	}
	done := make(chan struct{})
	go pprof.Do(context.Background(), pprof.Labels("part", part), func(context.Context) {
		defer close(done)
		_ = srv.Serve(ln) // ends with ErrServerClosed
	})
	b.closers = append(b.closers, func() {
		_ = srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String() + "/v1", nil
}

// newReferenceProxy is the reference proxy of the issue:
// httputil.ReverseProxy with a tuned Transport (MaxIdleConnsPerHost 512),
// flushing every write (FlushInterval -1), reading the request body whole
// before relaying it, as the gateway and the floor do. Without that, on
// net/http's server, ReverseProxy cuts about one stream in a thousand under
// load (Go issue 40747: writing the answer's header closes the inbound body
// while the Transport still reads it once more after its Content-Length,
// which fails the upstream connection mid-answer).
func newReferenceProxy(upstream *url.URL) (http.Handler, *http.Transport) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 512
	rp := httputil.NewSingleHostReverseProxy(upstream)
	rp.Transport = tr
	rp.FlushInterval = -1
	// Failed requests are counted by the load generator; the proxy's own
	// lines would only interleave with the progress.
	rp.ErrorLog = log.New(io.Discard, "", 0)
	return readBodyFirst(rp), tr
}

// readBodyFirst reads the request body whole before h runs.
func readBodyFirst(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		h.ServeHTTP(w, r)
	})
}

// newFloorProxy relays each request to upstream (the provider's base URL)
// through tr the way the gateway does: the body read whole, one upstream
// request, the answer copied back with its type and length, a stream
// flushed at every read. No authentication, parsing, admission or
// accounting: the floor under llmgate's own work.
func newFloorProxy(upstream string, tr http.RoundTripper) http.Handler {
	base := strings.TrimSuffix(upstream, "/v1")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, base+r.URL.Path, bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		h := w.Header()
		h["Content-Type"] = resp.Header["Content-Type"]
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			w.WriteHeader(resp.StatusCode)
			rc := http.NewResponseController(w)
			buf := make([]byte, 32<<10)
			for {
				n, err := resp.Body.Read(buf)
				if n > 0 {
					if _, werr := w.Write(buf[:n]); werr != nil || rc.Flush() != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}
		answer, err := io.ReadAll(resp.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		h["Content-Length"] = []string{strconv.Itoa(len(answer))}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	})
}

// setup starts the provider and every variant of cfg.
func setup(ctx context.Context, cfg Config) (_ *bench, err error) {
	b := &bench{endpoints: map[string]*endpoint{}}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	// The provider: no latency, no limits, default models.
	sv, err := sim.New(sim.Config{})
	if err != nil {
		return nil, fmt.Errorf("%w: simulated provider: %w", ErrSetup, err)
	}
	simBase, err := b.serveLoopback("provider", sv.Handler())
	if err != nil {
		return nil, err
	}
	for _, v := range cfg.Variants {
		switch v {
		case VariantDirect:
			b.endpoints[v] = &endpoint{url: simBase + chatPath}
		case VariantProxy:
			u, err := url.Parse(simBase)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrSetup, err)
			}
			u.Path = "" // the client's path (/v1/...) passes through
			h, tr := newReferenceProxy(u)
			b.closers = append(b.closers, tr.CloseIdleConnections)
			base, err := b.serveLoopback("proxy", h)
			if err != nil {
				return nil, err
			}
			b.endpoints[v] = &endpoint{url: base + chatPath}
		case VariantFloor:
			tr := provider.NewTransport(provider.TransportConfig{})
			b.closers = append(b.closers, tr.CloseIdleConnections)
			base, err := b.serveLoopback("proxy", newFloorProxy(simBase, tr))
			if err != nil {
				return nil, err
			}
			b.endpoints[v] = &endpoint{url: base + chatPath}
		case VariantMemory, VariantRedis, VariantRedisStrict:
			store := "memory"
			ep := &endpoint{}
			if onRedis(v) {
				store = cfg.Redis
				opt, err := storeurl.RedisOption(cfg.Redis)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", ErrSetup, err)
				}
				if ep.redis, err = rueidis.NewClient(opt); err != nil {
					return nil, fmt.Errorf("%w: cannot connect to Redis at %s: %w", ErrSetup, storeurl.Redact(cfg.Redis), err)
				}
				b.closers = append(b.closers, ep.redis.Close)
			}
			var (
				h       http.Handler
				release func()
				ferr    error
			)
			// Goroutines the gateway starts now (store clients) count
			// as the gateway's in a profile.
			pprof.Do(ctx, pprof.Labels("part", "gateway"), func(ctx context.Context) {
				h, release, ferr = cfg.Factory(ctx, v, store, simBase)
			})
			if ferr != nil {
				return nil, fmt.Errorf("%w: llmgate on %s: %w", ErrSetup, v, ferr)
			}
			if release != nil {
				b.closers = append(b.closers, release)
			}
			if d, ok := h.(Drainer); ok {
				ep.drain = d.Drain
			}
			base, err := b.serveLoopback("gateway", h)
			if err != nil {
				return nil, err
			}
			ep.url = base + chatPath
			b.endpoints[v] = ep
		}
	}
	return b, nil
}

// measure runs variant v in cell and returns its figures (Rep and Order
// are the caller's).
func (b *bench) measure(ctx context.Context, v string, cell Cell, cfg Config) Measurement {
	ep := b.endpoints[v]
	m := Measurement{Variant: v, Cell: cell}
	l := newLoad(ep.url, cell, cfg.Duration, cfg.MaxRequests)
	defer l.close()
	// Garbage of the previous cell is not this variant's to collect.
	runtime.GC()
	m.Errors, m.FirstError = l.warm(ctx)
	if ep.drain != nil {
		b.drain(ctx, ep, &m)
	}
	cpu0, cpuOK := benchcli.ProcessCPU()
	redis0, redisErr := readRedisStats(ctx, ep.redis)
	res := l.run(ctx)
	if ep.drain != nil {
		// The settles of this cell's requests are part of their cost.
		b.drain(ctx, ep, &m)
	}
	cpu1, _ := benchcli.ProcessCPU()
	redis1, redisErr1 := readRedisStats(ctx, ep.redis)

	m.Requests = res.ok
	m.Errors += res.errs
	if m.FirstError == "" {
		m.FirstError = res.firstErr
	}
	m.DurationS = round(res.elapsed.Seconds(), 3)
	if res.elapsed > 0 {
		m.RPS = round(float64(res.ok)/res.elapsed.Seconds(), 1)
	}
	m.P50Us = us(percentile(res.lat, 50))
	m.P99Us = us(percentile(res.lat, 99))
	if cell.Stream {
		m.TTFBP50Us = us(percentile(res.ttfb, 50))
		m.TTFBP99Us = us(percentile(res.ttfb, 99))
	}
	if n := res.ok + res.errs; n > 0 {
		if cpuOK {
			m.CPUUsPerReq = us((cpu1 - cpu0) / time.Duration(n))
		}
		if ep.redis != nil && redisErr == nil && redisErr1 == nil {
			m.RedisCPUUsPerReq = us((redis1.cpu - redis0.cpu) / time.Duration(n))
			m.RedisCallsPerReq = callsPerRequest(redis0.calls, redis1.calls, n)
		}
	}
	return m
}

func (b *bench) drain(ctx context.Context, ep *endpoint, m *Measurement) {
	dctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	if err := ep.drain(dctx); err != nil && ctx.Err() == nil {
		m.Errors++
		if m.FirstError == "" {
			m.FirstError = "the gateway's background work did not finish: " + err.Error()
		}
	}
}

// rotate returns vs rotated left by k.
func rotate(vs []string, k int) []string {
	if len(vs) == 0 {
		return nil
	}
	k %= len(vs)
	return append(slices.Clone(vs[k:]), vs[:k]...)
}

// Run measures every variant of cfg, interleaved, and summarises. progress
// (nil: none) receives one line per cell run. When ctx ends early it
// returns the cells completed before, marked Interrupted.
func Run(ctx context.Context, cfg Config, progress io.Writer) (*Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	res := newResult(cfg)
	res.Redis = storeurl.Redact(cfg.Redis)
	b, err := setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer b.close()

	top := Cell{Concurrency: slices.Max(cfg.Concurrency)}
	for _, v := range cfg.Variants {
		if ctx.Err() != nil {
			break
		}
		wcfg := cfg
		wcfg.Duration = min(cfg.Duration, warmUp)
		m := b.measure(ctx, v, top, wcfg)
		fmt.Fprintf(progress, "warm-up %-7s %-12s %8.0f req/s  p50 %8.1fus  errors %d\n", v, top, m.RPS, m.P50Us, m.Errors)
	}

	cells := cfg.cells()
reps:
	for rep := range cfg.Reps {
		if l, ok := load1(); ok {
			res.Load1 = append(res.Load1, l)
		}
		for ci, cell := range cells {
			// Rotated by repetition and cell: no variant always runs
			// first, or always right after another.
			for i, v := range rotate(cfg.Variants, rep+ci) {
				m := b.measure(ctx, v, cell, cfg)
				if ctx.Err() != nil {
					res.Interrupted = true
					break reps // a cut cell is not a measurement
				}
				m.Rep, m.Order = rep+1, i
				res.Measurements = append(res.Measurements, m)
				fmt.Fprintf(progress, "rep %d/%d %-12s %-7s %8.0f req/s  p50 %8.1fus  p99 %8.1fus%s  cpu %6.1fus/req  errors %d\n",
					rep+1, cfg.Reps, cell, v, m.RPS, m.P50Us, m.P99Us, ttfbNote(m), m.CPUUsPerReq, m.Errors)
			}
		}
	}
	if l, ok := load1(); ok {
		res.Load1 = append(res.Load1, l)
	}

	if cfg.profiling() && !res.Interrupted {
		m, err := b.profile(ctx, cfg, top)
		if err != nil {
			return nil, err
		}
		res.Profiled = &m
		fmt.Fprintf(progress, "profiled %-7s %-12s %8.0f req/s  p50 %8.1fus  errors %d\n", m.Variant, m.Cell, m.RPS, m.P50Us, m.Errors)
	}

	res.Summaries = summarize(res.Measurements, cfg.Variants, cells)
	res.Targets = targets(res.Summaries, cfg.Concurrency)
	for _, m := range res.Measurements {
		res.Errors += m.Errors
	}
	if res.Profiled != nil {
		res.Errors += res.Profiled.Errors
	}
	res.Flagged = res.Errors > 0
	return res, nil
}

// profile runs cfg.ProfileVariant in cell once more with the CPU and/or
// mutex profiler on. The profiles cover the warm-up requests too (a few
// connections set up), a small fraction of a cell.
func (b *bench) profile(ctx context.Context, cfg Config, cell Cell) (Measurement, error) {
	if cfg.Profile != nil {
		if err := pprof.StartCPUProfile(cfg.Profile); err != nil {
			return Measurement{}, fmt.Errorf("%w: CPU profile: %w", ErrSetup, err)
		}
	}
	if cfg.MutexProfile != nil {
		// Every contention event: the run is short, and exact waits
		// matter more than the profiler's own cost here.
		prev := runtime.SetMutexProfileFraction(1)
		defer runtime.SetMutexProfileFraction(prev)
	}
	// The allocation profile is as of the last garbage collection.
	if err := writeAllocs(cfg.MemProfileBase); err != nil {
		return Measurement{}, err
	}
	m := b.measure(ctx, cfg.ProfileVariant, cell, cfg)
	if cfg.Profile != nil {
		pprof.StopCPUProfile()
	}
	if err := writeAllocs(cfg.MemProfile); err != nil {
		return m, err
	}
	if cfg.MutexProfile != nil {
		if err := pprof.Lookup("mutex").WriteTo(cfg.MutexProfile, 0); err != nil {
			return m, fmt.Errorf("gatewaybench: mutex profile: %w", err)
		}
	}
	return m, nil
}

// writeAllocs writes the allocation profile as of a fresh garbage
// collection to w, if w is not nil.
func writeAllocs(w io.Writer) error {
	if w == nil {
		return nil
	}
	runtime.GC()
	if err := pprof.Lookup("allocs").WriteTo(w, 0); err != nil {
		return fmt.Errorf("gatewaybench: allocation profile: %w", err)
	}
	return nil
}

func ttfbNote(m Measurement) string {
	if !m.Stream {
		return ""
	}
	return fmt.Sprintf("  ttfb %7.1fus", m.TTFBP50Us)
}

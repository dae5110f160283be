// Package gatewaybench measures what the llmgate gateway adds to a chat completion: latency, throughput and stream time to first event against direct calls and a bare reverse proxy.
//
// Everything runs in one process on loopback: the simulated provider
// (internal/sim, no latency, no limits) on its own listener; the reference
// proxy, httputil.ReverseProxy with a tuned http.Transport and nothing
// else; and llmgate on the memory store and on Redis, built by a
// GatewayFactory (internal/app passes the wiring `llmgate serve` uses). A
// closed-loop load generator of N workers, each with its own keep-alive
// client, sends the same small chat request to each variant in turn.
//
// The variants are interleaved: for every repetition, for every cell (a
// concurrency, or a stream cell at concurrency 1), every variant runs once,
// in an order rotated from cell to cell. Figures compared across variants
// (added latency, throughput ratios) are taken within one repetition and
// then the median over repetitions is reported, so slow drifts of a shared
// machine fall on all variants alike.
package gatewaybench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Variant names.
const (
	// VariantDirect calls the simulated provider directly.
	VariantDirect = "direct"
	// VariantProxy goes through the reference proxy:
	// httputil.ReverseProxy, tuned Transport, nothing else.
	VariantProxy = "proxy"
	// VariantMemory goes through llmgate on the memory store. The llmgate
	// variants are served by net/http's server, as llmgate serve is.
	VariantMemory = "memory"
	// VariantRedis goes through llmgate on a Redis store.
	VariantRedis = "redis"
	// VariantRedisStrict goes through llmgate on the same Redis with the
	// local quota off (ratelimit.local_quota: false): one store decision
	// per request.
	VariantRedisStrict = "redis-strict"
	// VariantFloor goes through net/http's server and llmgate's upstream
	// transport (provider.NewTransport), relaying the body and doing
	// nothing else: what a gateway built like llmgate costs before any of
	// its own work. Not measured unless asked for.
	VariantFloor = "floor"
)

// AllVariants lists every variant, in the order reports show them.
var AllVariants = []string{VariantDirect, VariantProxy, VariantFloor, VariantMemory, VariantRedis, VariantRedisStrict}

// DefaultVariants are the variants measured when none are named: the
// issue's.
var DefaultVariants = []string{VariantDirect, VariantProxy, VariantMemory, VariantRedis, VariantRedisStrict}

// onRedis reports whether variant v runs llmgate on Redis.
func onRedis(v string) bool { return v == VariantRedis || v == VariantRedisStrict }

// Defaults used by Main for flags left out.
const (
	DefaultDuration    = 3 * time.Second
	DefaultReps        = 3
	DefaultMaxRequests = 2_000_000
	// MaxConcurrency bounds --concurrency: each worker holds a connection
	// to the variant and the variant one to the provider.
	MaxConcurrency = 4096
	// MaxReps bounds --reps.
	MaxReps = 100
)

// DefaultConcurrency is the concurrency of the cells when --concurrency is
// left out: the ones the targets name.
var DefaultConcurrency = []int{1, 16, 64}

// What every request carries. The gateway's factory must accept TenantKey
// as a tenant's bearer token and route Model to the provider.
const (
	// TenantKey is the bearer token of the benchmark's tenant. It is not a
	// secret: it only opens a gateway that lives for one benchmark run on
	// loopback.
	TenantKey = "sk-llmgate-bench-tenant"
	// Model is the model every request asks for (one of the simulated
	// provider's default models).
	Model = "gpt-4.1-mini"
)

// Errors returned by Run.
var (
	// ErrConfig wraps every complaint about a Config.
	ErrConfig = errors.New("gatewaybench: bad configuration")
	// ErrSetup wraps failures to start the provider, the proxy or a gateway.
	ErrSetup = errors.New("gatewaybench: setup failed")
)

// GatewayFactory builds the llmgate gateway of variant (VariantMemory,
// VariantRedis or VariantRedisStrict) on store ("memory" or a
// redis:// URL) whose single provider, of type openai, is at
// upstreamBaseURL (e.g. "http://127.0.0.1:PORT/v1"). It must accept
// TenantKey and serve Model. The returned function releases everything the
// gateway holds; it is called once, after the last request. The handler
// may implement Drainer.
type GatewayFactory func(ctx context.Context, variant, store, upstreamBaseURL string) (http.Handler, func(), error)

// Drainer is implemented by a gateway handler that finishes work in the
// background (settling usage after the answer was sent). The benchmark
// calls Drain after each of the handler's cells so that one cell's
// leftovers are not charged to the next.
type Drainer interface {
	Drain(ctx context.Context) error
}

// Config describes one benchmark run.
type Config struct {
	// Duration is how long each cell runs. Default DefaultDuration.
	Duration time.Duration
	// Reps is the number of interleaved repetitions. Default DefaultReps.
	Reps int
	// Concurrency lists the closed-loop worker counts, one cell each.
	// Default DefaultConcurrency.
	Concurrency []int
	// Stream adds a cell of streamed requests at concurrency 1, which
	// measures the time to the first event.
	Stream bool
	// Variants are the paths measured; VariantDirect is required (every
	// figure is relative to it). Default AllVariants.
	Variants []string
	// Redis is the redis:// URL of the store of VariantRedis and
	// VariantRedisStrict.
	Redis string
	// MaxRequests bounds the requests of one cell, whatever its duration.
	// Default DefaultMaxRequests.
	MaxRequests int64
	// Factory builds the gateway of VariantMemory, VariantRedis and
	// VariantRedisStrict.
	Factory GatewayFactory
	// ProfileVariant, when Profile, MutexProfile or MemProfile is not nil, is run
	// once more after the repetitions, at the highest concurrency for
	// Duration, with the CPU profiler writing to Profile and the mutex
	// profiler (every contention event) to MutexProfile. Default
	// VariantMemory.
	ProfileVariant string
	Profile        io.Writer
	MutexProfile   io.Writer
	// MemProfile and MemProfileBase, when not nil, get the process's
	// allocation profile after and before that run: the run's own
	// allocations are the difference (go tool pprof -base).
	MemProfile, MemProfileBase io.Writer
}

// profiling reports whether a profiled run is asked for.
func (c *Config) profiling() bool {
	return c.Profile != nil || c.MutexProfile != nil || c.MemProfile != nil
}

// withDefaults fills unset fields.
func (c Config) withDefaults() Config {
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Reps == 0 {
		c.Reps = DefaultReps
	}
	if len(c.Concurrency) == 0 {
		c.Concurrency = slices.Clone(DefaultConcurrency)
	}
	if len(c.Variants) == 0 {
		c.Variants = slices.Clone(DefaultVariants)
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = DefaultMaxRequests
	}
	if c.ProfileVariant == "" {
		c.ProfileVariant = VariantMemory
	}
	return c
}

// Validate reports a Config that cannot run, in words a user can act on.
// Zero fields are valid: they take their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Duration < 0 || c.Duration > time.Hour:
		return fmt.Errorf("%w: --duration must be positive and at most 1h, got %v", ErrConfig, c.Duration)
	case c.Reps < 1 || c.Reps > MaxReps:
		return fmt.Errorf("%w: --reps must be between 1 and %d, got %d", ErrConfig, MaxReps, c.Reps)
	case c.MaxRequests < 1:
		return fmt.Errorf("%w: --max-requests must be at least 1, got %d", ErrConfig, c.MaxRequests)
	}
	seen := map[int]bool{}
	for _, n := range c.Concurrency {
		if n < 1 || n > MaxConcurrency {
			return fmt.Errorf("%w: --concurrency values must be between 1 and %d, got %d", ErrConfig, MaxConcurrency, n)
		}
		if seen[n] {
			return fmt.Errorf("%w: --concurrency lists %d twice", ErrConfig, n)
		}
		seen[n] = true
	}
	seenV := map[string]bool{}
	for _, v := range c.Variants {
		if !slices.Contains(AllVariants, v) {
			return fmt.Errorf("%w: unknown variant %q in --variants; choose from %s", ErrConfig, v, strings.Join(AllVariants, ","))
		}
		if seenV[v] {
			return fmt.Errorf("%w: --variants lists %s twice", ErrConfig, v)
		}
		seenV[v] = true
	}
	if !seenV[VariantDirect] {
		return fmt.Errorf("%w: --variants must include %s: every figure is relative to it", ErrConfig, VariantDirect)
	}
	redis := seenV[VariantRedis] || seenV[VariantRedisStrict]
	if (seenV[VariantMemory] || redis) && c.Factory == nil {
		return fmt.Errorf("%w: the llmgate variants (%s, %s, %s) need a GatewayFactory", ErrConfig, VariantMemory, VariantRedis, VariantRedisStrict)
	}
	if redis && c.Redis == "" {
		return fmt.Errorf("%w: the %s and %s variants need a Redis: give --redis ADDR, or put redis-server on PATH", ErrConfig, VariantRedis, VariantRedisStrict)
	}
	if c.profiling() && !seenV[c.ProfileVariant] {
		return fmt.Errorf("%w: --profile-variant %s is not among --variants", ErrConfig, c.ProfileVariant)
	}
	return nil
}

// Cell is one column of the grid: a concurrency, streamed or not.
type Cell struct {
	Concurrency int  `json:"concurrency"`
	Stream      bool `json:"stream,omitempty"`
}

func (c Cell) String() string {
	if c.Stream {
		return "stream c=" + strconv.Itoa(c.Concurrency)
	}
	return "c=" + strconv.Itoa(c.Concurrency)
}

// cells returns the grid of a Config, in run order.
func (c Config) cells() []Cell {
	out := make([]Cell, 0, len(c.Concurrency)+1)
	for _, n := range c.Concurrency {
		out = append(out, Cell{Concurrency: n})
	}
	if c.Stream {
		out = append(out, Cell{Concurrency: 1, Stream: true})
	}
	return out
}

// Measurement is one variant in one cell of one repetition.
type Measurement struct {
	Rep     int    `json:"rep"`
	Variant string `json:"variant"`
	Cell
	// Order is the variant's position among the cell's runs (0 first).
	Order      int     `json:"order"`
	Requests   int64   `json:"requests"` // answered 200 and read to the end
	Errors     int64   `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	DurationS  float64 `json:"duration_s"`
	RPS        float64 `json:"rps"`
	P50Us      float64 `json:"p50_us"`
	P99Us      float64 `json:"p99_us"`
	// TTFBP50Us and TTFBP99Us are the time until the first SSE event was
	// read, in stream cells.
	TTFBP50Us float64 `json:"ttfb_p50_us,omitempty"`
	TTFBP99Us float64 `json:"ttfb_p99_us,omitempty"`
	// CPUUsPerReq is this process's CPU time (user + system) per request:
	// load generator, provider and the variant together.
	CPUUsPerReq float64 `json:"cpu_us_per_req"`
	// RedisCPUUsPerReq is the Redis server's CPU time per request (the
	// redis variant only).
	RedisCPUUsPerReq float64 `json:"redis_cpu_us_per_req,omitempty"`
	// RedisCallsPerReq is the commands the Redis server ran per request,
	// by name (INFO commandstats: the commands inside scripts count under
	// their own names too).
	RedisCallsPerReq map[string]float64 `json:"redis_calls_per_req,omitempty"`
}

// Summary is one variant in one cell, over the repetitions: medians of the
// per-repetition figures. Differences and ratios are taken within each
// repetition first.
type Summary struct {
	Variant string `json:"variant"`
	Cell
	Reps      int     `json:"reps"` // repetitions measured
	Errors    int64   `json:"errors"`
	P50Us     float64 `json:"p50_us"`
	P99Us     float64 `json:"p99_us"`
	RPS       float64 `json:"rps"`
	TTFBP50Us float64 `json:"ttfb_p50_us,omitempty"`
	// AddedP50Us is the median of (variant p50 − direct p50).
	AddedP50Us float64 `json:"added_p50_us"`
	// AddedP99Us is the median of (variant p99 − direct p99).
	AddedP99Us float64 `json:"added_p99_us"`
	// AddedTTFBUs is the median of (variant TTFB p50 − direct TTFB p50).
	AddedTTFBUs float64 `json:"added_ttfb_us,omitempty"`
	// RatioToDirect and RatioToProxy are medians of the throughput ratios.
	RatioToDirect float64  `json:"ratio_to_direct"`
	RatioToProxy  *float64 `json:"ratio_to_proxy,omitempty"`
	CPUUsPerReq   float64  `json:"cpu_us_per_req"`
	// AddedCPUUsPerReq is the median of (variant − direct) CPU per request:
	// what the hop in the middle costs.
	AddedCPUUsPerReq float64 `json:"added_cpu_us_per_req"`
	RedisCPUUsPerReq float64 `json:"redis_cpu_us_per_req,omitempty"`
}

// Target is one of the goals, checked against a run.
type Target struct {
	Name string `json:"name"`
	// Want states the goal, Got what was measured.
	Want string `json:"want"`
	Got  string `json:"got"`
	// Status is PASS, MISS, or n/a when the run lacks the cells or
	// variants it needs.
	Status string `json:"status"`
}

// Target statuses.
const (
	StatusPass = "PASS"
	StatusMiss = "MISS"
	StatusNA   = "n/a"
)

// Result is the outcome of a run; Main prints it as a table or JSON.
type Result struct {
	StartedAt   string   `json:"started_at"`
	GoVersion   string   `json:"go_version"`
	GoMaxProcs  int      `json:"gomaxprocs"`
	NumCPU      int      `json:"num_cpu"`
	DurationS   float64  `json:"duration_s"` // per cell
	Reps        int      `json:"reps"`
	Concurrency []int    `json:"concurrency"`
	Stream      bool     `json:"stream"`
	Variants    []string `json:"variants"`
	Redis       string   `json:"redis,omitempty"` // password redacted
	// Load1 is the one-minute load average at the start of each
	// repetition and at the end (Linux; empty elsewhere).
	Load1        []float64     `json:"load1,omitempty"`
	Measurements []Measurement `json:"measurements"`
	Summaries    []Summary     `json:"summaries"`
	Targets      []Target      `json:"targets"`
	// Profiled is the run the profiles cover.
	Profiled *Measurement `json:"profiled,omitempty"`
	// Errors counts failed requests over the whole run; a run with errors
	// is Flagged: its figures are suspect.
	Errors      int64 `json:"errors"`
	Flagged     bool  `json:"flagged"`
	Interrupted bool  `json:"interrupted,omitempty"`
}

func newResult(cfg Config) *Result {
	return &Result{
		StartedAt:   time.Now().UTC().Format(time.RFC3339),
		GoVersion:   runtime.Version(),
		GoMaxProcs:  runtime.GOMAXPROCS(0),
		NumCPU:      runtime.NumCPU(),
		DurationS:   cfg.Duration.Seconds(),
		Reps:        cfg.Reps,
		Concurrency: slices.Clone(cfg.Concurrency),
		Stream:      cfg.Stream,
		Variants:    slices.Clone(cfg.Variants),
	}
}

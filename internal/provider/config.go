package provider

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/h1"
)

// Defaults used when a Config field is left at its zero value.
const (
	DefaultMaxAttempts       = 3
	DefaultBackoffBase       = 200 * time.Millisecond
	DefaultBackoffMax        = 10 * time.Second
	DefaultMaxRetryWait      = time.Minute
	DefaultBreakerFailures   = 5
	DefaultBreakerOpenFor    = 30 * time.Second
	DefaultTimeoutFloor      = 10 * time.Second
	DefaultTimeoutCeiling    = 300 * time.Second
	DefaultTimeoutMultiplier = 4.0
)

// Config tunes a Client. The zero value is usable: every zero field means
// its default.
type Config struct {
	// Transport sends the requests. Default: an h1.Transport (HTTP/1.1 in
	// the calling goroutine, 512 idle connections per host, 90s idle
	// timeout), which hands what it does not serve (a host reached through
	// a proxy from the environment) to a *http.Transport tuned alike, with
	// HTTP/2. There is no overall client timeout: the caller's context
	// bounds each call, and the adaptive timeout bounds the wait for
	// response headers.
	Transport http.RoundTripper
	// MaxAttempts is the most requests one Do sends, the first included.
	// Default 3; 1 means no retry.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the "full jitter" backoff: retry k
	// (k = 0 for the first retry) waits a uniform random time in
	// [0, min(BackoffMax, BackoffBase·2^k)), and at least the upstream's
	// retry-after. Defaults 200ms and 10s.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// MaxRetryWait bounds one wait before a retry: when an upstream's
	// retry-after asks for more, Do returns its response at once rather than
	// hold the caller (the gateway may fall back to another deployment).
	// Default 1 minute.
	MaxRetryWait time.Duration
	// BreakerFailures is the number of consecutive failed calls that opens a
	// target's breaker. Default 5.
	BreakerFailures int
	// BreakerOpenFor is how long an open breaker fails calls fast before it
	// lets one trial call through (half-open): its success closes the
	// breaker, its failure opens it again. Default 30s.
	BreakerOpenFor time.Duration
	// TimeoutFloor, TimeoutCeiling and TimeoutMultiplier set the adaptive
	// time-to-headers timeout of each attempt: clamp(TimeoutMultiplier × p95
	// of the target's recent successful times to headers, TimeoutFloor,
	// TimeoutCeiling), and TimeoutCeiling until 20 samples exist. Defaults
	// 10s, 300s and 4.
	TimeoutFloor      time.Duration
	TimeoutCeiling    time.Duration
	TimeoutMultiplier float64
	// Clock times backoffs, breakers and latencies. Default clock.Real{}.
	// Context deadlines are real time whatever the clock.
	Clock clock.Clock
	// Rand returns uniform numbers in [0, 1) for the jitter. Default
	// math/rand/v2.Float64; it must be safe for concurrent use.
	Rand func() float64
	// Logger receives retries (debug) and breaker changes (warn, info).
	// Default: discard.
	Logger *slog.Logger
	// Feedback, when set, is called synchronously with what each upstream
	// response said about rate limits: every 429 (with its retry-after and
	// Kind) and every response carrying x-ratelimit-* headers, retried ones
	// included. It must be fast and safe for concurrent use; the gateway
	// feeds it into the shared limiter.
	Feedback func(t *Target, f Feedback)
}

// withDefaults returns a copy of c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Transport == nil {
		c.Transport = newTransport()
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = max(DefaultBackoffMax, c.BackoffBase)
	}
	if c.MaxRetryWait == 0 {
		c.MaxRetryWait = DefaultMaxRetryWait
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = DefaultBreakerFailures
	}
	if c.BreakerOpenFor == 0 {
		c.BreakerOpenFor = DefaultBreakerOpenFor
	}
	switch {
	case c.TimeoutFloor == 0 && c.TimeoutCeiling == 0:
		c.TimeoutFloor, c.TimeoutCeiling = DefaultTimeoutFloor, DefaultTimeoutCeiling
	case c.TimeoutFloor == 0: // a ceiling below the default floor lowers the floor with it
		c.TimeoutFloor = min(DefaultTimeoutFloor, c.TimeoutCeiling)
	case c.TimeoutCeiling == 0:
		c.TimeoutCeiling = max(DefaultTimeoutCeiling, c.TimeoutFloor)
	}
	if c.TimeoutMultiplier == 0 {
		c.TimeoutMultiplier = DefaultTimeoutMultiplier
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every setting that cannot work, with what to change.
// Zero values are valid: they mean the defaults.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("provider: "+format, args...)) }
	if c.MaxAttempts < 0 {
		bad("MaxAttempts is %d; use 0 for the default (%d) or a positive number (1 = no retry)", c.MaxAttempts, DefaultMaxAttempts)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"BackoffBase", c.BackoffBase}, {"BackoffMax", c.BackoffMax}, {"MaxRetryWait", c.MaxRetryWait},
		{"BreakerOpenFor", c.BreakerOpenFor}, {"TimeoutFloor", c.TimeoutFloor}, {"TimeoutCeiling", c.TimeoutCeiling},
	} {
		if d.v < 0 {
			bad("%s is %v; use 0 for the default or a positive duration", d.name, d.v)
		}
	}
	if c.BackoffBase > 0 && c.BackoffMax > 0 && c.BackoffBase > c.BackoffMax {
		bad("BackoffBase (%v) is above BackoffMax (%v); the base is the first retry's bound and cannot exceed the largest", c.BackoffBase, c.BackoffMax)
	}
	if c.TimeoutFloor > 0 && c.TimeoutCeiling > 0 && c.TimeoutFloor > c.TimeoutCeiling {
		bad("TimeoutFloor (%v) is above TimeoutCeiling (%v); make the floor at most the ceiling", c.TimeoutFloor, c.TimeoutCeiling)
	}
	if c.BreakerFailures < 0 {
		bad("BreakerFailures is %d; use 0 for the default (%d) or a positive number of consecutive failures", c.BreakerFailures, DefaultBreakerFailures)
	}
	if m := c.TimeoutMultiplier; m != 0 && !(m >= 1 && m <= 1000) { // also rejects NaN and ±Inf
		bad("TimeoutMultiplier is %v; use 0 for the default (%v) or a factor between 1 and 1000 applied to the p95 latency", m, DefaultTimeoutMultiplier)
	}
	return errors.Join(errs...)
}

// newTransport returns the default transport: many idle connections per
// host (a gateway talks to a few hosts at high concurrency), HTTP/1.1 on the
// caller's goroutine (package h1: about 15–30 µs less CPU per call than
// net/http's Transport, see BENCHMARKS.md), and net/http with HTTP/2 for
// hosts behind a proxy.
func newTransport() http.RoundTripper {
	return h1.New(newHTTPTransport()) // h1's defaults: 512 idle per host, 90s
}

// newHTTPTransport is net/http's transport, tuned for a gateway.
func newHTTPTransport() *http.Transport {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          0, // no global cap; MaxIdleConnsPerHost bounds each host
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// clampDuration converts f nanoseconds to a Duration in [0, hi]; NaN is 0.
func clampDuration(f float64, hi time.Duration) time.Duration {
	switch {
	case !(f > 0): // also NaN
		return 0
	case f >= float64(hi):
		return hi
	}
	return time.Duration(f)
}

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
	// Transport sends the requests. Default: NewTransport with its
	// defaults. There is no overall client timeout: the caller's context
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
		c.Transport = NewTransport(TransportConfig{})
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

// Defaults of TransportConfig.
const (
	DefaultMaxConnsPerHost        = 1024
	DefaultMaxIdleConnsPerHost    = 512
	DefaultMaxResponseHeaderBytes = 10 << 20 // as net/http's
	DefaultDialTimeout            = 30 * time.Second
	DefaultTLSHandshakeTimeout    = 10 * time.Second
	DefaultIdleConnTimeout        = 90 * time.Second
)

// TransportConfig tunes the net/http Transport that NewTransport builds.
// Zero fields mean their defaults.
type TransportConfig struct {
	// MaxConnsPerHost bounds the connections to one host, idle or in use:
	// a burst waits for a connection instead of opening one TLS handshake
	// per request. Over HTTP/2 one connection carries many requests.
	// Default DefaultMaxConnsPerHost.
	MaxConnsPerHost int
	// MaxIdleConnsPerHost bounds the idle connections kept per host.
	// Default DefaultMaxIdleConnsPerHost.
	MaxIdleConnsPerHost int
	// MaxResponseHeaderBytes bounds a response's headers, 1xx responses
	// included. Default DefaultMaxResponseHeaderBytes.
	MaxResponseHeaderBytes int64
	// DialTimeout, TLSHandshakeTimeout and IdleConnTimeout bound a TCP
	// connect, a TLS handshake and the life of an idle connection.
	DialTimeout         time.Duration
	TLSHandshakeTimeout time.Duration
	IdleConnTimeout     time.Duration
}

// NewTransport returns net/http's Transport tuned for a gateway: HTTP/2
// where the provider offers it (many streams over one connection), the
// proxy from the environment, and bounds on connections, header size and
// every wait before a response. Requests are replayed only as net/http
// allows: never a POST whose bytes may have reached the provider.
func NewTransport(c TransportConfig) *http.Transport {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   positive(c.DialTimeout, DefaultDialTimeout),
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           0, // no global cap: MaxIdleConnsPerHost bounds each host
		MaxIdleConnsPerHost:    positive(c.MaxIdleConnsPerHost, DefaultMaxIdleConnsPerHost),
		MaxConnsPerHost:        positive(c.MaxConnsPerHost, DefaultMaxConnsPerHost),
		MaxResponseHeaderBytes: positive(c.MaxResponseHeaderBytes, DefaultMaxResponseHeaderBytes),
		IdleConnTimeout:        positive(c.IdleConnTimeout, DefaultIdleConnTimeout),
		TLSHandshakeTimeout:    positive(c.TLSHandshakeTimeout, DefaultTLSHandshakeTimeout),
		ExpectContinueTimeout:  time.Second,
	}
}

func positive[T int | int64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
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

package sim

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// The simulator enforces its limits with a small local token bucket rather
// than the ratelimit package on purpose: it plays the provider that the
// gateway's limiter is tested against, so it must be an independent oracle
// (a bug shared by both would hide itself), it must deny at once like
// OpenAI (no queue, no admission ahead of tokens), and it must expose the
// exact level of each bucket for the x-ratelimit-* headers. The whole state
// sits under Server.mu; a bucket is a few floats.

// bucket holds up to limit units and refills continuously at limit per
// minute, the way OpenAI describes its RPM and TPM limits.
type bucket struct {
	limit float64
	level float64
	last  time.Time
}

func newBucket(limit int64, now time.Time) *bucket {
	return &bucket{limit: float64(limit), level: float64(limit), last: now}
}

func (b *bucket) rate() float64 { return b.limit / float64(time.Minute) } // units per ns

func (b *bucket) refill(now time.Time) {
	if el := now.Sub(b.last); el > 0 {
		b.level = math.Min(b.limit, b.level+float64(el)*b.rate())
	}
	b.last = now
}

// wait is how long until cost units are available (0 if they are).
func (b *bucket) wait(cost float64) time.Duration {
	if b.level >= cost {
		return 0
	}
	return time.Duration(math.Ceil((cost - b.level) / b.rate()))
}

// reset is how long until the bucket is full again.
func (b *bucket) reset() time.Duration {
	return time.Duration(math.Ceil((b.limit - b.level) / b.rate()))
}

func (b *bucket) remaining() int64 { return int64(math.Floor(math.Max(b.level, 0))) }

// scopeLimits are the buckets of one (key, model) pair; nil = unlimited.
type scopeLimits struct {
	req, tok *bucket
}

// denial says why a request was refused with 429.
type denial struct {
	kind       string // "requests" or "tokens"
	message    string
	retryAfter time.Duration // 0: never fits, no retry-after
}

// admitLocked charges one request of cost tokens to sl if both buckets
// have room, and charges nothing otherwise. s.mu must be held.
func admitLocked(sl *scopeLimits, model string, cost int64, now time.Time) *denial {
	if sl.req != nil {
		sl.req.refill(now)
	}
	if sl.tok != nil {
		sl.tok.refill(now)
	}
	if b := sl.req; b != nil {
		if w := b.wait(1); w > 0 {
			return &denial{kind: "requests", retryAfter: w, message: fmt.Sprintf(
				"Rate limit reached for %s in organization org-sim on requests per min (RPM): Limit %d, Used %d, Requested 1. Please try again in %s. Visit https://platform.openai.com/account/rate-limits to learn more.",
				model, int64(b.limit), int64(b.limit)-b.remaining(), openaiDuration(w))}
		}
	}
	if b := sl.tok; b != nil {
		if float64(cost) > b.limit {
			return &denial{kind: "tokens", message: fmt.Sprintf(
				"Request too large for %s in organization org-sim on tokens per min (TPM): Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more.",
				model, int64(b.limit), cost)}
		}
		if w := b.wait(float64(cost)); w > 0 {
			return &denial{kind: "tokens", retryAfter: w, message: fmt.Sprintf(
				"Rate limit reached for %s in organization org-sim on tokens per min (TPM): Limit %d, Used %d, Requested %d. Please try again in %s. Visit https://platform.openai.com/account/rate-limits to learn more.",
				model, int64(b.limit), int64(b.limit)-b.remaining(), cost, openaiDuration(w))}
		}
	}
	if sl.req != nil {
		sl.req.level--
	}
	if sl.tok != nil {
		sl.tok.level -= float64(cost)
	}
	return nil
}

// setRateHeadersLocked writes the x-ratelimit-* headers of sl (only for
// the limits that exist). s.mu must be held.
func setRateHeadersLocked(h http.Header, sl *scopeLimits) {
	if b := sl.req; b != nil {
		h.Set("x-ratelimit-limit-requests", strconv.FormatInt(int64(b.limit), 10))
		h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(b.remaining(), 10))
		h.Set("x-ratelimit-reset-requests", openaiDuration(b.reset()))
	}
	if b := sl.tok; b != nil {
		h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(int64(b.limit), 10))
		h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(b.remaining(), 10))
		h.Set("x-ratelimit-reset-tokens", openaiDuration(b.reset()))
	}
}

// setRetryAfter writes retry-after (whole seconds, rounded up, at least 1)
// and retry-after-ms (milliseconds, rounded up).
func setRetryAfter(h http.Header, d time.Duration) {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	s := max((d+time.Second-1)/time.Second, 1)
	h.Set("retry-after", strconv.FormatInt(int64(s), 10))
	h.Set("retry-after-ms", strconv.FormatInt(int64(ms), 10))
}

// openaiDuration formats d as OpenAI's reset headers do: Go duration
// syntax, to the millisecond below a second ("20ms"), to the 10 ms below a
// minute ("1.2s", "8.64s"), to the second above ("6m0s").
func openaiDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return max(d.Round(time.Millisecond), time.Millisecond).String()
	case d < time.Minute:
		return d.Round(10 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

package provider

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxHint bounds the waits and resets read from headers: an upstream asking
// for more than a day is treated as asking for a day, and an absurd value
// cannot overflow a Duration.
const maxHint = 24 * time.Hour

// Feedback is what one upstream response said about rate limits.
type Feedback struct {
	// Status is the response's HTTP status.
	Status int
	// RetryAfter is the wait the upstream asked for, from retry-after-ms
	// (preferred) or retry-after (seconds, or an HTTP date taken relative to
	// the response's Date header when there is one); 0 if absent.
	RetryAfter time.Duration
	// LimitRequests and RemainingRequests are x-ratelimit-limit-requests and
	// x-ratelimit-remaining-requests; LimitTokens and RemainingTokens the
	// same for tokens. -1 if absent or unreadable.
	LimitRequests, RemainingRequests int64
	LimitTokens, RemainingTokens     int64
	// ResetRequests and ResetTokens are x-ratelimit-reset-requests and
	// x-ratelimit-reset-tokens, in OpenAI's Go-duration format ("1s",
	// "6m0s", "20ms") or plain seconds; -1 if absent or unreadable.
	ResetRequests, ResetTokens time.Duration
	// Kind says which limit a 429 was about: "requests", "tokens" or "" when
	// the error body does not tell (or for other statuses).
	Kind string
}

// HasLimits reports whether any x-ratelimit-* value was present.
func (f Feedback) HasLimits() bool {
	return f.LimitRequests >= 0 || f.RemainingRequests >= 0 || f.LimitTokens >= 0 ||
		f.RemainingTokens >= 0 || f.ResetRequests >= 0 || f.ResetTokens >= 0
}

// ParseFeedback reads the rate-limit headers of a response with the given
// status. Kind is left empty: it comes from the body, which Do reads for
// 429s. Unreadable values count as absent; it never fails.
func ParseFeedback(status int, h http.Header) Feedback {
	return parseFeedback(status, h, time.Now())
}

// parseFeedback is ParseFeedback with the time an HTTP-date retry-after is
// measured from when the response has no Date header.
func parseFeedback(status int, h http.Header, now time.Time) Feedback {
	return Feedback{
		Status:            status,
		RetryAfter:        retryAfter(h, now),
		LimitRequests:     parseCount(h.Get("X-Ratelimit-Limit-Requests")),
		RemainingRequests: parseCount(h.Get("X-Ratelimit-Remaining-Requests")),
		LimitTokens:       parseCount(h.Get("X-Ratelimit-Limit-Tokens")),
		RemainingTokens:   parseCount(h.Get("X-Ratelimit-Remaining-Tokens")),
		ResetRequests:     parseReset(h.Get("X-Ratelimit-Reset-Requests")),
		ResetTokens:       parseReset(h.Get("X-Ratelimit-Reset-Tokens")),
	}
}

// retryAfter reads retry-after-ms, else retry-after; 0 if neither is
// readable.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && !math.IsInf(ms, 0) {
			return clampDuration(ms*float64(time.Millisecond), maxHint)
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		return clampDuration(s*float64(time.Second), maxHint)
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	// The server's own Date is the reference when it sent one: the two
	// come from the same clock, so skew between us and it does not matter.
	if d, err := http.ParseTime(h.Get("Date")); err == nil {
		now = d
	}
	return clampDuration(float64(at.Sub(now)), maxHint)
}

// parseCount reads a non-negative integer header; -1 if absent or invalid.
func parseCount(v string) int64 {
	v = strings.TrimSpace(v)
	if v == "" {
		return -1
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return -1
		}
		return n
	}
	// Some compatible servers send "1000.0".
	if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 && f < math.MaxInt64 {
		return int64(f)
	}
	return -1
}

// parseReset reads a reset header: a Go duration as OpenAI sends it
// ("6m0s", "1.5s", "20ms"), or plain seconds ("60", "0.5"); -1 if absent or
// invalid.
func parseReset(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return -1
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return -1
		}
		return min(d, maxHint)
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return clampDuration(s*float64(time.Second), maxHint)
	}
	return -1
}

// errorBody is the part of OpenAI's error shape that says which limit a 429
// was about: {"error":{"message","type","code"}}.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// rateLimitKind reads which limit a 429 body is about ("requests",
// "tokens" or ""), and whether it is rather an exhausted quota
// (insufficient_quota: billing, which no retry can fix).
func rateLimitKind(body []byte) (kind string, quota bool) {
	var e errorBody
	// A field of another JSON type (a numeric code, say) is skipped, and
	// the others are still filled: the error can be ignored.
	_ = json.Unmarshal(body, &e)
	for _, s := range [...]string{e.Error.Type, e.Error.Code} {
		switch {
		case s == "insufficient_quota":
			return "", true
		case strings.HasPrefix(s, "requests"):
			return "requests", false
		case strings.HasPrefix(s, "tokens"):
			return "tokens", false
		}
	}
	// Compatible servers that say "rate_limit_exceeded" alone still name
	// the limit in the message, as OpenAI does: "... on tokens per min (TPM)".
	m := e.Error.Message
	switch {
	case strings.Contains(m, "tokens per "), strings.Contains(m, "(TPM)"), strings.Contains(m, "(TPD)"):
		return "tokens", false
	case strings.Contains(m, "requests per "), strings.Contains(m, "(RPM)"), strings.Contains(m, "(RPD)"):
		return "requests", false
	case strings.Contains(m, "exceeded your current quota"):
		return "", true
	}
	return "", false
}

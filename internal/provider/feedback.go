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
	// LimitInputTokens, RemainingInputTokens, LimitOutputTokens and
	// RemainingOutputTokens are Anthropic's per-minute input and output
	// token limits (anthropic-ratelimit-input-tokens-*,
	// -output-tokens-*); ResetInputTokens and ResetOutputTokens their
	// resets. -1 if absent or unreadable.
	LimitInputTokens, RemainingInputTokens   int64
	LimitOutputTokens, RemainingOutputTokens int64
	ResetInputTokens, ResetOutputTokens      time.Duration
	// Kind says which limit a 429 was about: "requests", "tokens" or "" when
	// the error body does not tell (or for other statuses).
	Kind string
	// Reported is what a 429's message said about the limit it hit ("...
	// on requests per min (RPM): Limit 5, Used 5, Requested 1."); zero when
	// it said nothing readable, and for other statuses. It is kept apart
	// from the x-ratelimit-* values above, which it never fills in: it may
	// be about a per-day limit (Reported.Window tells), where the headers
	// are per minute.
	Reported LimitReport
}

// LimitReport is what a 429's message said about the rate limit it hit, in
// OpenAI's words: "Rate limit reached for gpt-4.1 in organization org-x on
// tokens per min (TPM): Limit 100, Used 96, Requested 48. Please try again
// in 26.4s." (compatible servers say the same), or in its older ones: "...
// on requests per day. Limit: 200 / day. Current: 200 / day.".
type LimitReport struct {
	// Kind is "requests" or "tokens"; "" when the message named no rate
	// limit with its allowance, and then every field is zero.
	Kind string
	// Window is the limit's period: time.Minute (per min, RPM, TPM) or
	// 24h (per day, RPD, TPD).
	Window time.Duration
	// Limit is the allowance per Window, at least 1.
	Limit int64
	// Used is what the message says was used of it (Used, or Current in
	// older messages) and Requested what the refused request asked for;
	// -1 when it does not say.
	Used, Requested int64
}

// HasLimits reports whether any x-ratelimit-* (or anthropic-ratelimit-*)
// value was present.
func (f Feedback) HasLimits() bool {
	return f.LimitRequests >= 0 || f.RemainingRequests >= 0 || f.LimitTokens >= 0 ||
		f.RemainingTokens >= 0 || f.ResetRequests >= 0 || f.ResetTokens >= 0 ||
		f.LimitInputTokens >= 0 || f.RemainingInputTokens >= 0 || f.LimitOutputTokens >= 0 || f.RemainingOutputTokens >= 0
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
	f := Feedback{
		Status:            status,
		RetryAfter:        retryAfter(h, now),
		LimitRequests:     parseCount(headerValue(h, "X-Ratelimit-Limit-Requests")),
		RemainingRequests: parseCount(headerValue(h, "X-Ratelimit-Remaining-Requests")),
		LimitTokens:       parseCount(headerValue(h, "X-Ratelimit-Limit-Tokens")),
		RemainingTokens:   parseCount(headerValue(h, "X-Ratelimit-Remaining-Tokens")),
		ResetRequests:     parseReset(headerValue(h, "X-Ratelimit-Reset-Requests")),
		ResetTokens:       parseReset(headerValue(h, "X-Ratelimit-Reset-Tokens")),
	}
	f.LimitInputTokens, f.RemainingInputTokens, f.ResetInputTokens = anthropicLimit(h, anthropicInputTokens, now)
	f.LimitOutputTokens, f.RemainingOutputTokens, f.ResetOutputTokens = anthropicLimit(h, anthropicOutputTokens, now)
	// Anthropic's requests limit stands in for x-ratelimit-*-requests.
	// Its anthropic-ratelimit-tokens-* is not a tokens limit of its own
	// but the most restrictive of the input and output ones, read above:
	// taken as a limit on input plus output it would hold the gateway
	// below what the provider allows.
	l, r, d := anthropicLimit(h, anthropicRequests, now)
	fillAbsent(&f.LimitRequests, l)
	fillAbsent(&f.RemainingRequests, r)
	fillAbsent(&f.ResetRequests, d)
	return f
}

// headerValue is h.Get for a key already in canonical form: every response is
// read for a dozen of them, most absent.
func headerValue(h http.Header, canonicalKey string) string {
	if v := h[canonicalKey]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// fillAbsent sets *dst to v when *dst is absent (-1).
func fillAbsent[T int64 | time.Duration](dst *T, v T) {
	if *dst < 0 {
		*dst = v
	}
}

// anthropicHeaders are the canonical names of one kind of Anthropic's
// anthropic-ratelimit-KIND-limit, -remaining and -reset headers.
type anthropicHeaders struct{ limit, remaining, reset string }

var (
	anthropicInputTokens  = anthropicHeaders{"Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"}
	anthropicOutputTokens = anthropicHeaders{"Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"}
	anthropicRequests     = anthropicHeaders{"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"}
)

// anthropicLimit reads one kind's limit, remaining and reset (an RFC 3339
// time, taken relative to the response's Date when it has one); -1 for
// each value absent or unreadable.
func anthropicLimit(h http.Header, k anthropicHeaders, now time.Time) (limit, remaining int64, reset time.Duration) {
	limit, remaining, reset = parseCount(headerValue(h, k.limit)), parseCount(headerValue(h, k.remaining)), -1
	if v := strings.TrimSpace(headerValue(h, k.reset)); v != "" {
		if at, err := time.Parse(time.RFC3339, v); err == nil {
			if d, err := http.ParseTime(headerValue(h, "Date")); err == nil {
				now = d
			}
			reset = max(clampDuration(float64(at.Sub(now)), maxHint), 0)
		}
	}
	return limit, remaining, reset
}

// retryAfter reads retry-after-ms, else retry-after; 0 if neither is
// readable.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(headerValue(h, "Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && !math.IsInf(ms, 0) {
			return clampDuration(ms*float64(time.Millisecond), maxHint)
		}
	}
	v := strings.TrimSpace(headerValue(h, "Retry-After"))
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
	if d, err := http.ParseTime(headerValue(h, "Date")); err == nil {
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
	kind, quota, _ = rateLimitInfo(body)
	return kind, quota
}

// rateLimitInfo is rateLimitKind with what the message reports about the
// limit (zero for a quota error).
func rateLimitInfo(body []byte) (kind string, quota bool, rep LimitReport) {
	var e errorBody
	// A field of another JSON type (a numeric code, say) is skipped, and
	// the others are still filled: the error can be ignored.
	_ = json.Unmarshal(body, &e)
	kind, quota = errorKind(e)
	if !quota {
		rep = parseLimitReport(e.Error.Message)
	}
	return kind, quota, rep
}

func errorKind(e errorBody) (kind string, quota bool) {
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

// maxReported bounds the numbers read from a message: an allowance above
// it is no allowance anyone has (and the limiter computes up to 2^53).
const maxReported = 1<<53 - 1

// parseLimitReport reads the first "<requests|tokens> per <min|minute|day>"
// of message, then, after it, the limit's numbers: "Limit N" (or "Limit:
// N / min"), "Used N" (or "Current: N"), "Requested N". A period it does
// not know, an abbreviation that contradicts the phrase ("per min (RPD)"),
// a unit after a number that is not the period's, or no readable Limit
// leave it zero. It never fails.
func parseLimitReport(message string) LimitReport {
	for i := 0; ; {
		j := strings.Index(message[i:], " per ")
		if j < 0 {
			return LimitReport{}
		}
		at := i + j
		i = at + len(" per ")
		kind := ""
		switch w := lastWord(message[:at]); {
		case strings.HasPrefix(w, "requests"):
			kind = "requests"
		case strings.HasPrefix(w, "tokens"):
			kind = "tokens"
		default:
			continue // "30 units per second" and the like
		}
		unit, rest := firstWord(message[i:])
		window := period(unit)
		if window == 0 {
			return LimitReport{}
		}
		rest = strings.TrimLeft(rest, " ")
		if strings.HasPrefix(rest, "(") {
			abbr, _, ok := strings.Cut(rest[1:], ")")
			if ok && !abbrMatches(abbr, kind, window) {
				return LimitReport{} // it says one thing and its abbreviation another
			}
		}
		r := LimitReport{Kind: kind, Window: window, Used: -1, Requested: -1}
		var ok bool
		if r.Limit, ok = reportedNumber(rest, "Limit", window); !ok || r.Limit < 1 {
			return LimitReport{}
		}
		if r.Used, ok = reportedNumber(rest, "Used", window); !ok {
			if r.Used, ok = reportedNumber(rest, "Current", window); !ok {
				r.Used = -1
			}
		}
		if r.Requested, ok = reportedNumber(rest, "Requested", window); !ok {
			r.Requested = -1
		}
		return r
	}
}

// lastWord returns the word that ends s (after its last space).
func lastWord(s string) string {
	return s[strings.LastIndexByte(s, ' ')+1:]
}

// firstWord returns the letters that start s, and what follows them.
func firstWord(s string) (word, rest string) {
	n := 0
	for n < len(s) && isLetter(s[n]) {
		n++
	}
	return s[:n], s[n:]
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// period reads a limit's period: "min", "minute", "day"; 0 if unknown.
func period(unit string) time.Duration {
	switch strings.ToLower(unit) {
	case "min", "minute":
		return time.Minute
	case "day":
		return 24 * time.Hour
	}
	return 0
}

// abbrMatches reports whether an abbreviation such as "RPM" or "TPD" names
// a limit of kind per window. One it does not know (not three letters of
// that shape) is not a contradiction.
func abbrMatches(abbr, kind string, window time.Duration) bool {
	if len(abbr) != 3 || abbr[1] != 'P' || (abbr[0] != 'R' && abbr[0] != 'T') || (abbr[2] != 'M' && abbr[2] != 'D') {
		return true
	}
	return (abbr[0] == 'R') == (kind == "requests") && (abbr[2] == 'M') == (window == time.Minute)
}

// reportedNumber finds the word key in s (not inside another word) and
// reads the number after it ("Limit 5", "Limit: 200 / day"); a unit after
// the number must name window. ok false if there is none, or it is
// unreadable or beyond maxReported.
func reportedNumber(s, key string, window time.Duration) (n int64, ok bool) {
	for from := 0; ; {
		k := strings.Index(s[from:], key)
		if k < 0 {
			return 0, false
		}
		at := from + k
		from = at + len(key)
		if at > 0 && isLetter(s[at-1]) {
			continue
		}
		rest := strings.TrimPrefix(s[from:], ":")
		digits := strings.TrimLeft(rest, " ")
		if len(digits) == len(rest) || len(digits) == 0 || !isDigit(digits[0]) {
			continue // "Limits", "Limit reached", "Used up"
		}
		// Digits, with commas between groups of three ("1,000,000").
		var b []byte
		end := 0
		for end < len(digits) {
			c := digits[end]
			switch {
			case isDigit(c):
				b = append(b, c)
				end++
				continue
			case c == ',' && end+4 <= len(digits) && isDigit(digits[end+1]) && isDigit(digits[end+2]) && isDigit(digits[end+3]) &&
				(end+4 == len(digits) || !isDigit(digits[end+4])):
				end++
				continue
			}
			break
		}
		if len(b) > 16 {
			return 0, false
		}
		v, err := strconv.ParseInt(string(b), 10, 64)
		if err != nil || v > maxReported {
			return 0, false
		}
		// "Limit: 200 / day": the unit, when there is one, is the period's.
		if after := strings.TrimLeft(digits[end:], " "); strings.HasPrefix(after, "/") {
			unit, _ := firstWord(strings.TrimLeft(after[1:], " "))
			if period(unit) != window {
				return 0, false
			}
		}
		return v, true
	}
}

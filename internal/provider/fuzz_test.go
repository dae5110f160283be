package provider

import (
	"net/http"
	"testing"
	"time"
)

// FuzzParseFeedback feeds arbitrary header values: ParseFeedback must never
// panic, and its values stay in their documented ranges.
func FuzzParseFeedback(f *testing.F) {
	for _, s := range [][7]string{
		{"7660", "8", "", "10000", "9999", "6m0s", "7.66s"},
		{"", "Wed, 21 Oct 2015 07:28:00 GMT", "Wed, 21 Oct 2015 07:27:00 GMT", "1", "0", "1m30.5s", "20ms"},
		{"1.5", "-1", "", "500.0", "-3", "0.5s", "60"},
		{"NaN", "Inf", "garbage", "99999999999999999999", "1e300", "-1s", "9223372036854775807ns"},
		{"1e400", "0x1p-2", "Mon, 01 Jan 0001 00:00:00 GMT", " 7 ", "", "2562047h47m16.854775807s", "5000000h"},
	} {
		f.Add(429, s[0], s[1], s[2], s[3], s[4], s[5], s[6])
	}
	f.Fuzz(func(t *testing.T, status int, retryMs, retry, date, limit, remaining, resetReq, resetTok string) {
		h := http.Header{}
		for k, v := range map[string]string{
			"Retry-After-Ms": retryMs, "Retry-After": retry, "Date": date,
			"X-Ratelimit-Limit-Requests": limit, "X-Ratelimit-Remaining-Requests": remaining,
			"X-Ratelimit-Limit-Tokens": remaining, "X-Ratelimit-Remaining-Tokens": limit,
			"X-Ratelimit-Reset-Requests": resetReq, "X-Ratelimit-Reset-Tokens": resetTok,
		} {
			h.Set(k, v)
		}
		fb := ParseFeedback(status, h)
		if fb.Status != status || fb.Kind != "" {
			t.Fatalf("status %d kind %q, want %d and no kind", fb.Status, fb.Kind, status)
		}
		if fb.RetryAfter < 0 || fb.RetryAfter > maxHint {
			t.Fatalf("RetryAfter %v out of [0, %v]", fb.RetryAfter, maxHint)
		}
		for _, n := range []int64{fb.LimitRequests, fb.RemainingRequests, fb.LimitTokens, fb.RemainingTokens} {
			if n < -1 {
				t.Fatalf("count %d below -1: %+v", n, fb)
			}
		}
		for _, d := range []time.Duration{fb.ResetRequests, fb.ResetTokens} {
			if d < -1 || d > maxHint {
				t.Fatalf("reset %v out of [-1, %v]: %+v", d, maxHint, fb)
			}
		}
		if fb.HasLimits() != (fb.LimitRequests >= 0 || fb.RemainingRequests >= 0 || fb.LimitTokens >= 0 ||
			fb.RemainingTokens >= 0 || fb.ResetRequests >= 0 || fb.ResetTokens >= 0) {
			t.Fatalf("HasLimits %v for %+v", fb.HasLimits(), fb)
		}
	})
}

// FuzzRateLimitKind feeds arbitrary 429 bodies: the kind is always one of
// the three documented values, and a quota error has no kind.
func FuzzRateLimitKind(f *testing.F) {
	for _, s := range []string{
		errBody("requests", "rate_limit_exceeded"),
		errBody("insufficient_quota", "insufficient_quota"),
		`{"error":{"message":"on tokens per min (TPM)","type":null,"code":429}}`,
		`{"error":{"type":["a"],"code":{"x":1},"message":7}}`,
		`{"error":null}`, `[]`, `{`, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		kind, quota := rateLimitKind(body)
		switch {
		case kind != "" && kind != "requests" && kind != "tokens":
			t.Fatalf("kind %q", kind)
		case quota && kind != "":
			t.Fatalf("quota error with kind %q", kind)
		}
	})
}

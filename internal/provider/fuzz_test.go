package provider

import (
	"fmt"
	"net/http"
	"strings"
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
		{"", "2025-03-04T05:06:09Z", "Tue, 04 Mar 2025 05:06:07 GMT", "50", "49", "2025-03-04T05:06:08Z", "9999-12-31T23:59:59Z"},
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
			"Anthropic-Ratelimit-Input-Tokens-Limit": limit, "Anthropic-Ratelimit-Input-Tokens-Remaining": remaining,
			"Anthropic-Ratelimit-Input-Tokens-Reset": resetReq, "Anthropic-Ratelimit-Output-Tokens-Reset": retry,
			"Anthropic-Ratelimit-Requests-Reset": resetTok,
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
		for _, n := range []int64{fb.LimitRequests, fb.RemainingRequests, fb.LimitTokens, fb.RemainingTokens,
			fb.LimitInputTokens, fb.RemainingInputTokens, fb.LimitOutputTokens, fb.RemainingOutputTokens} {
			if n < -1 {
				t.Fatalf("count %d below -1: %+v", n, fb)
			}
		}
		for _, d := range []time.Duration{fb.ResetRequests, fb.ResetTokens, fb.ResetInputTokens, fb.ResetOutputTokens} {
			if d < -1 || d > maxHint {
				t.Fatalf("reset %v out of [-1, %v]: %+v", d, maxHint, fb)
			}
		}
		if fb.HasLimits() != (fb.LimitRequests >= 0 || fb.RemainingRequests >= 0 || fb.LimitTokens >= 0 ||
			fb.RemainingTokens >= 0 || fb.ResetRequests >= 0 || fb.ResetTokens >= 0 || fb.LimitInputTokens >= 0 ||
			fb.RemainingInputTokens >= 0 || fb.LimitOutputTokens >= 0 || fb.RemainingOutputTokens >= 0) {
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

// FuzzParseLimitReport feeds arbitrary 429 messages: parseLimitReport never
// panics, and reports either nothing or a rate limit with every value in
// its documented range. A message in OpenAI's format built from the fuzzed
// numbers, with the fuzzed text around it, reads back as those numbers.
func FuzzParseLimitReport(f *testing.F) {
	for _, s := range []string{
		"Rate limit reached for gpt-4.1 in organization org-x on requests per min (RPM): Limit 5, Used 5, Requested 1. Please try again in 12s.",
		"Rate limit reached for gpt-4.1 in organization org-x on tokens per day (TPD): Limit 900000, Used 899990, Requested 40.",
		"Rate limit reached for 10KTPM-200RPM in organization org-x on tokens per min. Limit: 10000 / min. Current: 9000 / min.",
		"on concurrent requests: Limit 2, In flight 2, Requested 1.",
		"on requests per min (RPD): Limit 1,000,000, Used 99999999999999999999",
		" per ", "per per per", "tokens per (", "Limit: / day", "\xff per \x00min", "",
	} {
		f.Add(s, uint64(5), uint64(5), uint64(1), false, false)
	}
	f.Fuzz(func(t *testing.T, msg string, limit, used, requested uint64, tokens, perDay bool) {
		r := parseLimitReport(msg)
		switch {
		case r == LimitReport{}:
		case r.Kind != "requests" && r.Kind != "tokens":
			t.Fatalf("kind %q in %+v", r.Kind, r)
		case r.Window != time.Minute && r.Window != 24*time.Hour:
			t.Fatalf("window %v in %+v", r.Window, r)
		case r.Limit < 1 || r.Limit > maxReported:
			t.Fatalf("limit %d in %+v", r.Limit, r)
		case r.Used < -1 || r.Used > maxReported || r.Requested < -1 || r.Requested > maxReported:
			t.Fatalf("used or requested out of range in %+v", r)
		}

		// Round trip: OpenAI's sentence, after text that names no limit.
		want := LimitReport{Kind: "requests", Window: time.Minute, Limit: int64(1 + limit%maxReported), Used: int64(used % (maxReported + 1)), Requested: int64(requested % (maxReported + 1))}
		abbr := "RPM"
		if tokens {
			want.Kind, abbr = "tokens", "TPM"
		}
		unit := "min"
		if perDay {
			want.Window, unit, abbr = 24*time.Hour, "day", abbr[:2]+"D"
		}
		prefix := strings.ReplaceAll(msg, " per ", " ") // no limit phrase before ours
		sentence := fmt.Sprintf("%s on %s per %s (%s): Limit %d, Used %d, Requested %d. Please try again in 1s.", prefix, want.Kind, unit, abbr, want.Limit, want.Used, want.Requested)
		if strings.Count(sentence, " per ") != 1 {
			return // the prefix made another one ("a per  per b", "requests per" + " on")
		}
		if got := parseLimitReport(sentence); got != want {
			t.Fatalf("parseLimitReport(%q)\n got %+v\nwant %+v", sentence, got, want)
		}
	})
}

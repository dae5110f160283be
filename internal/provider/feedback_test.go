package provider

import (
	"net/http"
	"testing"
	"time"
)

func TestParseFeedback(t *testing.T) {
	date := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	none := Feedback{LimitRequests: -1, RemainingRequests: -1, LimitTokens: -1, RemainingTokens: -1, ResetRequests: -1, ResetTokens: -1,
		LimitInputTokens: -1, RemainingInputTokens: -1, LimitOutputTokens: -1, RemainingOutputTokens: -1, ResetInputTokens: -1, ResetOutputTokens: -1}
	with := func(status int, f func(*Feedback)) Feedback {
		fb := none
		fb.Status = status
		f(&fb)
		return fb
	}
	for _, tc := range []struct {
		name string
		kv   []string
		want Feedback
	}{
		{"none", nil, with(200, func(f *Feedback) {})},
		{"openai 200", []string{
			"x-ratelimit-limit-requests", "10000", "x-ratelimit-limit-tokens", "2000000",
			"x-ratelimit-remaining-requests", "9999", "x-ratelimit-remaining-tokens", "1999985",
			"x-ratelimit-reset-requests", "6ms", "x-ratelimit-reset-tokens", "0s",
		}, with(200, func(f *Feedback) {
			f.LimitRequests, f.LimitTokens, f.RemainingRequests, f.RemainingTokens = 10000, 2000000, 9999, 1999985
			f.ResetRequests, f.ResetTokens = 6*time.Millisecond, 0
		})},
		{"openai 429 tokens", []string{
			"retry-after", "8", "retry-after-ms", "7660",
			"x-ratelimit-limit-tokens", "30000", "x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "7.66s",
			"x-ratelimit-reset-requests", "6m0s",
		}, with(429, func(f *Feedback) {
			f.RetryAfter = 7660 * time.Millisecond
			f.LimitTokens, f.RemainingTokens, f.ResetTokens = 30000, 0, 7660*time.Millisecond
			f.ResetRequests = 6 * time.Minute
		})},
		{"reset formats", []string{"x-ratelimit-reset-requests", "1m30.5s", "x-ratelimit-reset-tokens", "1.5s"},
			with(200, func(f *Feedback) { f.ResetRequests, f.ResetTokens = 90500*time.Millisecond, 1500*time.Millisecond })},
		{"reset half second and 20ms", []string{"x-ratelimit-reset-requests", "0.5s", "x-ratelimit-reset-tokens", "20ms"},
			with(200, func(f *Feedback) { f.ResetRequests, f.ResetTokens = 500*time.Millisecond, 20*time.Millisecond })},
		{"reset in plain seconds", []string{"x-ratelimit-reset-requests", "60", "x-ratelimit-reset-tokens", "0.25"},
			with(200, func(f *Feedback) { f.ResetRequests, f.ResetTokens = time.Minute, 250*time.Millisecond })},
		{"retry-after seconds", []string{"retry-after", "20"}, with(429, func(f *Feedback) { f.RetryAfter = 20 * time.Second })},
		{"retry-after-ms fraction", []string{"retry-after-ms", "1.5"}, with(429, func(f *Feedback) { f.RetryAfter = 1500 * time.Microsecond })},
		{"retry-after HTTP date", []string{"Date", date.Format(http.TimeFormat), "retry-after", date.Add(90 * time.Second).Format(http.TimeFormat)},
			with(503, func(f *Feedback) { f.RetryAfter = 90 * time.Second })},
		{"retry-after date in the past", []string{"Date", date.Format(http.TimeFormat), "retry-after", date.Add(-time.Hour).Format(http.TimeFormat)},
			with(503, func(f *Feedback) {})},
		{"bad retry-after-ms falls back", []string{"retry-after-ms", "soon", "retry-after", "3"}, with(429, func(f *Feedback) { f.RetryAfter = 3 * time.Second })},
		{"huge retry-after capped", []string{"retry-after", "1e30"}, with(429, func(f *Feedback) { f.RetryAfter = maxHint })},
		{"invalid values", []string{
			"retry-after", "-5", "x-ratelimit-limit-requests", "-1", "x-ratelimit-remaining-requests", "lots",
			"x-ratelimit-limit-tokens", "99999999999999999999", "x-ratelimit-remaining-tokens", "NaN",
			"x-ratelimit-reset-requests", "-1s", "x-ratelimit-reset-tokens", "soon",
		}, with(429, func(f *Feedback) {})},
		{"anthropic", []string{
			"Date", date.Format(http.TimeFormat),
			"anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "49",
			"anthropic-ratelimit-requests-reset", date.Add(2 * time.Second).Format(time.RFC3339),
			"anthropic-ratelimit-tokens-limit", "30000", "anthropic-ratelimit-tokens-remaining", "29000",
			"anthropic-ratelimit-tokens-reset", date.Add(3 * time.Second).Format(time.RFC3339),
			"anthropic-ratelimit-input-tokens-limit", "30000", "anthropic-ratelimit-input-tokens-remaining", "29000",
			"anthropic-ratelimit-input-tokens-reset", date.Add(3 * time.Second).Format(time.RFC3339),
			"anthropic-ratelimit-output-tokens-limit", "8000", "anthropic-ratelimit-output-tokens-remaining", "7000",
			"anthropic-ratelimit-output-tokens-reset", date.Add(-time.Second).Format(time.RFC3339),
		}, with(200, func(f *Feedback) {
			f.LimitRequests, f.RemainingRequests, f.ResetRequests = 50, 49, 2*time.Second
			f.LimitInputTokens, f.RemainingInputTokens, f.ResetInputTokens = 30000, 29000, 3*time.Second
			f.LimitOutputTokens, f.RemainingOutputTokens, f.ResetOutputTokens = 8000, 7000, 0
		})},
		{"anthropic bad reset", []string{"anthropic-ratelimit-output-tokens-reset", "soon", "anthropic-ratelimit-output-tokens-limit", "x"},
			with(200, func(f *Feedback) {})},
		{"float counts", []string{"x-ratelimit-limit-requests", "500.0", "x-ratelimit-remaining-requests", " 42 "},
			with(200, func(f *Feedback) { f.LimitRequests, f.RemainingRequests = 500, 42 })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for i := 0; i+1 < len(tc.kv); i += 2 {
				h.Set(tc.kv[i], tc.kv[i+1])
			}
			if got := ParseFeedback(tc.want.Status, h); got != tc.want {
				t.Fatalf("\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	if f := ParseFeedback(200, nil); f != with(200, func(*Feedback) {}) || f.HasLimits() {
		t.Fatalf("nil header: %+v", f)
	}
}

func TestRetryAfterDateWithoutDateHeader(t *testing.T) {
	now := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	h := http.Header{"Retry-After": {now.Add(30 * time.Second).Format(http.TimeFormat)}}
	if got := parseFeedback(429, h, now).RetryAfter; got != 30*time.Second {
		t.Fatalf("retry-after %v, want 30s from now", got)
	}
}

func TestRateLimitKind(t *testing.T) {
	for _, tc := range []struct {
		body  string
		kind  string
		quota bool
	}{
		{errBody("requests", "rate_limit_exceeded"), "requests", false},
		{errBody("tokens", "rate_limit_exceeded"), "tokens", false},
		{errBody("tokens_usage_based", "rate_limit_exceeded"), "tokens", false},
		{errBody("insufficient_quota", "insufficient_quota"), "", true},
		{`{"error":{"message":"Rate limit reached for gpt-4.1 in organization org-x on tokens per min (TPM): Limit 30000, Used 30000, Requested 10.","type":"rate_limit_error","code":"rate_limit_exceeded"}}`, "tokens", false},
		{`{"error":{"message":"Rate limit reached ... on requests per day (RPD): Limit 200","type":null,"code":429}}`, "requests", false},
		{`{"error":{"message":"You exceeded your current quota, please check your plan.","type":"x","code":null}}`, "", true},
		{`{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation have exceeded call rate limit."}}`, "", false},
		{`not json`, "", false},
		{``, "", false},
		{`{"error":"string"}`, "", false},
	} {
		kind, quota := rateLimitKind([]byte(tc.body))
		if kind != tc.kind || quota != tc.quota {
			t.Errorf("%s: kind %q quota %v, want %q %v", tc.body, kind, quota, tc.kind, tc.quota)
		}
	}
}

func TestParseLimitReport(t *testing.T) {
	const day = 24 * time.Hour
	rep := func(kind string, w time.Duration, limit, used, requested int64) LimitReport {
		return LimitReport{Kind: kind, Window: w, Limit: limit, Used: used, Requested: requested}
	}
	for _, tc := range []struct {
		name, msg string
		want      LimitReport
	}{
		{"openai RPM",
			"Rate limit reached for gpt-4.1 in organization org-x on requests per min (RPM): Limit 5, Used 5, Requested 1. Please try again in 12s. Visit https://platform.openai.com/account/rate-limits to learn more.",
			rep("requests", time.Minute, 5, 5, 1)},
		{"openai TPM",
			"Rate limit reached for gpt-4.1 in organization org-x on tokens per min (TPM): Limit 100, Used 96, Requested 48. Please try again in 26.4s.",
			rep("tokens", time.Minute, 100, 96, 48)},
		{"openai TPM, real",
			"Rate limit reached for gpt-4o in organization org-uOtiSEwvUnroadaOnJJquBEC on tokens per min (TPM): Limit 30000, Used 29937, Requested 385. Please try again in 644ms.",
			rep("tokens", time.Minute, 30000, 29937, 385)},
		{"RPD is per day",
			"Rate limit reached for gpt-4.1 in organization org-x on requests per day (RPD): Limit 200, Used 200, Requested 1. Please try again in 7m12s.",
			rep("requests", day, 200, 200, 1)},
		{"TPD is per day",
			"Rate limit reached for gpt-4.1 in organization org-x on tokens per day (TPD): Limit 900000, Used 899990, Requested 40.",
			rep("tokens", day, 900000, 899990, 40)},
		{"request too large: no Used",
			"Request too large for gpt-4.1 in organization org-sim on tokens per min (TPM): Limit 100, Requested 500. The input or output tokens must be reduced in order to run successfully.",
			rep("tokens", time.Minute, 100, -1, 500)},
		{"older format",
			"Rate limit reached for 10KTPM-200RPM in organization org-x on tokens per min. Limit: 10000 / min. Please try again in 6ms. Contact us through our help center at help.openai.com if you continue to have issues.",
			rep("tokens", time.Minute, 10000, -1, -1)},
		{"older format with Current",
			"Rate limit reached for default-gpt-3.5-turbo in organization org-x on requests per min. Limit: 3 / min. Current: 3 / min. Contact us through our help center.",
			rep("requests", time.Minute, 3, 3, -1)},
		{"older format per day",
			"Rate limit reached for default-text-davinci-003 in organization org-x on requests per day. Limit: 200 / day. Please try again in 7m12s.",
			rep("requests", day, 200, -1, -1)},
		{"groq: per minute, tiers in backticks",
			"Rate limit reached for model `llama3-70b-8192` in organization `org_01` service tier `on_demand` on tokens per minute (TPM): Limit 6000, Used 5963, Requested 240. Please try again in 2.03s.",
			rep("tokens", time.Minute, 6000, 5963, 240)},
		{"tokens_usage_based",
			"Rate limit reached for gpt-4 in organization org-x on tokens_usage_based per min: Limit 150000, Used 149000, Requested 2000.",
			rep("tokens", time.Minute, 150000, 149000, 2000)},
		{"thousands separators",
			"Rate limit reached on tokens per min (TPM): Limit 1,000,000, Used 999,500, Requested 1,200.",
			rep("tokens", time.Minute, 1_000_000, 999_500, 1200)},

		{"concurrency is no rate", "Rate limit reached for gpt-4.1 in organization org-sim on concurrent requests: Limit 2, In flight 2, Requested 1. Please try again once a request completes.", LimitReport{}},
		{"abbreviation contradicts the period", "Rate limit reached on requests per min (RPD): Limit 200, Used 200, Requested 1.", LimitReport{}},
		{"abbreviation contradicts the kind", "Rate limit reached on requests per min (TPM): Limit 200, Used 200, Requested 1.", LimitReport{}},
		{"unit after the number contradicts", "Rate limit reached on requests per min. Limit: 200 / day.", LimitReport{}},
		{"unknown period", "Rate limit reached on requests per hour (RPH): Limit 200, Used 200.", LimitReport{}},
		{"no limit number", "Rate limit reached on requests per min (RPM). Please try again in 1s.", LimitReport{}},
		{"limit 0", "Rate limit reached on requests per min (RPM): Limit 0, Used 0, Requested 1.", LimitReport{}},
		{"limit too big", "Rate limit reached on tokens per min (TPM): Limit 99999999999999999999, Used 1.", LimitReport{}},
		{"limit negative", "Rate limit reached on tokens per min (TPM): Limit -5, Used 1.", LimitReport{}},
		{"anthropic: no Limit word", "This request would exceed the rate limit for your organization of 20,000 input tokens per minute.", LimitReport{}},
		{"azure", "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-02-01 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 86400 seconds.", LimitReport{}},
		{"Limits is not Limit", "Rate limit reached on requests per min. See Limits 5 and RateLimit 7.", LimitReport{}},
		{"empty", "", LimitReport{}},
		{"per at the end", "on tokens per", LimitReport{}},
		{"per at the start", " per min: Limit 5", LimitReport{}},
		{"unreadable Used is absent", "on requests per min (RPM): Limit 5, Used lots, Requested 1.", rep("requests", time.Minute, 5, -1, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseLimitReport(tc.msg); got != tc.want {
				t.Fatalf("parseLimitReport(%q)\n got %+v\nwant %+v", tc.msg, got, tc.want)
			}
		})
	}
}

// TestRateLimitInfo: the report comes from the error body's message, and a
// quota error has none.
func TestRateLimitInfo(t *testing.T) {
	body := `{"error":{"message":"Rate limit reached for gpt-4.1 in organization org-x on requests per min (RPM): Limit 5, Used 5, Requested 1. Please try again in 12s.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
	kind, quota, rep := rateLimitInfo([]byte(body))
	if kind != "requests" || quota || rep != (LimitReport{Kind: "requests", Window: time.Minute, Limit: 5, Used: 5, Requested: 1}) {
		t.Fatalf("rateLimitInfo = %q %v %+v", kind, quota, rep)
	}
	quotaBody := `{"error":{"message":"You exceeded your current quota on requests per min (RPM): Limit 5, Used 5.","type":"insufficient_quota","code":"insufficient_quota"}}`
	if _, quota, rep := rateLimitInfo([]byte(quotaBody)); !quota || rep != (LimitReport{}) {
		t.Fatalf("quota error: quota %v, report %+v; want no report", quota, rep)
	}
	if _, _, rep := rateLimitInfo([]byte(`{"error":{"message":7}}`)); rep != (LimitReport{}) {
		t.Fatalf("numeric message: %+v", rep)
	}
}

package provider

import (
	"net/http"
	"testing"
	"time"
)

func TestParseFeedback(t *testing.T) {
	date := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	none := Feedback{LimitRequests: -1, RemainingRequests: -1, LimitTokens: -1, RemainingTokens: -1, ResetRequests: -1, ResetTokens: -1}
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

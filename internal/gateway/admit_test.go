package gateway

import (
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/ratelimit"
)

func TestSetRateHeaders(t *testing.T) {
	reqs := func(limit, remaining int64, reset time.Duration) ratelimit.Status {
		return ratelimit.Status{Kind: ratelimit.Requests, Limit: limit, Remaining: remaining, Reset: reset}
	}
	toks := func(limit, remaining int64, reset time.Duration) ratelimit.Status {
		return ratelimit.Status{Kind: ratelimit.Tokens, Limit: limit, Remaining: remaining, Reset: reset}
	}
	cases := []struct {
		name string
		st   []ratelimit.Status
		want http.Header
	}{
		{"none", nil, http.Header{}},
		{"the lowest remaining of each kind", []ratelimit.Status{
			reqs(500, 499, 120*time.Millisecond), toks(150000, 149000, 1500*time.Millisecond),
			reqs(100, 7, 36*time.Second), toks(50000, 49999, time.Millisecond),
			{Kind: ratelimit.Concurrency, Limit: 5, Remaining: 0},
		}, http.Header{
			"X-Ratelimit-Limit-Requests": {"100"}, "X-Ratelimit-Remaining-Requests": {"7"}, "X-Ratelimit-Reset-Requests": {"36s"},
			"X-Ratelimit-Limit-Tokens": {"50000"}, "X-Ratelimit-Remaining-Tokens": {"49999"}, "X-Ratelimit-Reset-Tokens": {"1ms"},
		}},
		{"tokens only", []ratelimit.Status{toks(1000, 0, 6*time.Minute)}, http.Header{
			"X-Ratelimit-Limit-Tokens": {"1000"}, "X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"6m0s"},
		}},
		{"the stand-in for no limit is not shown", []ratelimit.Status{reqs(unlimitedRPM, unlimitedRPM-1, 0)}, http.Header{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			setRateHeaders(h, tc.st)
			if !reflect.DeepEqual(h, tc.want) {
				t.Fatalf("headers = %v; want %v", h, tc.want)
			}
			// Each value is its own one-element slice: appending to one
			// must not change another.
			for k := range h {
				h[k] = append(h[k], "x")
			}
			for k, v := range tc.want {
				if h[k][0] != v[0] {
					t.Fatalf("%s = %q after appending to the others; want %q", k, h[k][0], v[0])
				}
			}
		})
	}
}

// TestWindowReused: the cached budget window is the one Budget.Window
// gives, across a month's end, a change of period and of time zone.
func TestWindowReused(t *testing.T) {
	g := &Gateway{}
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no time zone data:", err)
	}
	month := budget.Budget{Tenant: "a", Period: budget.Month}
	day := budget.Budget{Tenant: "a", Period: budget.Day}
	inParis := budget.Budget{Tenant: "a", Period: budget.Month, Location: paris}
	end := time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC)
	for _, tc := range []struct {
		b  budget.Budget
		at time.Time
	}{
		{month, end.Add(-time.Hour)},
		{month, end},                  // the cached window
		{month, end.Add(time.Second)}, // December
		{day, end.Add(time.Second)},
		{inParis, end.Add(-30 * time.Minute)}, // already December in Paris
		{month, end.Add(-30 * time.Minute)},
	} {
		got, err := g.window(tc.b, tc.at)
		want, werr := tc.b.Window(tc.at)
		if err != nil || werr != nil || got != want {
			t.Fatalf("window(%s in %v, %v) = %+v, %v; want %+v, %v", tc.b.Period, tc.b.Location, tc.at, got, err, want, werr)
		}
	}
}

package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestQuantile(t *testing.T) {
	// 10 observations at or under 0.1, 10 more under 1, none above.
	h := &hist{upper: []float64{0.1, 1, 10}, counts: []float64{10, 20, 20}, total: 20}
	for _, tc := range []struct{ q, want float64 }{{0.25, 0.05}, {0.5, 0.1}, {0.75, 0.55}, {1, 1}} {
		if got := h.quantile(tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := (&hist{}).quantile(0.5); got != 0 {
		t.Errorf("empty quantile = %v", got)
	}
	// The last minute only: what the first sample had is taken out.
	old := map[string]*hist{"chat": {upper: []float64{0.1, 1}, counts: []float64{10, 10}, total: 10}}
	now := map[string]*hist{"chat": {upper: []float64{0.1, 1}, counts: []float64{10, 20}, total: 20}}
	if l := latencies(old, now); len(l) != 1 || l[0].Count != 10 || l[0].P50 != 0.55 {
		t.Errorf("latencies = %+v; want 10 requests, all between 0.1 and 1", l)
	}
}

// TestEvents: a page gets the history, then a sample per interval that
// follows the registry; the sampler runs only while a page is open.
func TestEvents(t *testing.T) {
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgate_requests_total"}, []string{"outcome"})
	reg.MustRegister(requests)
	requests.WithLabelValues("ok").Add(3)
	d := New(Config{Gatherer: reg, Every: 10 * time.Millisecond, Replica: "r1",
		State: func(context.Context) State {
			return State{Deployments: []Deployment{{Name: "dep", RPM: Quota{Limit: 60, Used: 5}}}}
		}})
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)

	page, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	page.Body.Close()
	if page.StatusCode != 200 || !strings.Contains(page.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Fatalf("page: %d, CSP %q", page.StatusCode, page.Header.Get("Content-Security-Policy"))
	}

	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	next := func() Snapshot {
		t.Helper()
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				var s Snapshot
				if err := json.Unmarshal([]byte(data), &s); err != nil {
					t.Fatal(err)
				}
				return s
			}
		}
	}
	s := next()
	if s.Requests != 3 || s.Replica != "r1" || len(s.Deployments) != 1 || s.Deployments[0].RPM.Used != 5 {
		t.Fatalf("first sample %+v", s)
	}
	requests.WithLabelValues("upstream_error").Add(2)
	for s.Requests != 5 {
		s = next()
	}
	if s.Outcomes["upstream_error"] != 2 {
		t.Errorf("outcomes %v", s.Outcomes)
	}
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.mu.Lock()
		running, history := d.stop != nil, len(d.history)
		d.mu.Unlock()
		if !running {
			if history < 2 {
				t.Errorf("history of %d samples", history)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sampler still runs with no page open")
		}
		time.Sleep(time.Millisecond)
	}
}

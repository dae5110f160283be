package simrun

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

func TestPercentiles(t *testing.T) {
	var v []float64
	for i := 1; i <= 100; i++ {
		v = append(v, float64(i))
	}
	p := percentiles(v)
	if p.P50 != 50 || p.P95 != 95 || p.P99 != 99 || p.Max != 100 {
		t.Errorf("percentiles(1..100) = %+v", p)
	}
	if (percentiles(nil) != Percentiles{}) {
		t.Error("percentiles of nothing are not zero")
	}
}

func TestHistogram(t *testing.T) {
	h := histogram([]float64{3, 15, 15, 180, 900, 4000})
	total := 0
	for i, b := range h {
		total += b.Count
		if i > 0 && b.UpToMS <= h[i-1].UpToMS {
			t.Errorf("bounds not increasing: %+v", h)
		}
	}
	if total != 6 || h[len(h)-1].UpToMS < 4000 {
		t.Errorf("histogram = %+v; want 6 latencies, the last bucket above 4000ms", h)
	}
}

// TestReportSelfContained: the HTML has nothing to fetch, carries the
// result as JSON, and escapes what a scenario file controls.
func TestReportSelfContained(t *testing.T) {
	r := &Result{Scenario: "x", Description: `</script><img src=x onerror=alert(1)>`, Replicas: 1, Store: "memory", Arms: []Arm{
		{Name: ArmDirect, Requests: 3, Succeeded: 2, Series: []Point{{0, 1, 1, 0.5}, {1, 1, 0, 0}}, Histogram: []Bucket{{100, 2}}},
		{Name: ArmLlmgate, Requests: 3, Succeeded: 3, Series: []Point{{0, 2, 0, 1}, {1, 1, 0, 0}}, Histogram: []Bucket{{100, 3}}},
	}}
	var b bytes.Buffer
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	if regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//`).MatchString(html) || strings.Contains(html, "<img") {
		t.Errorf("the report refers to something outside itself, or lets markup through:\n%s", html)
	}
	for _, want := range []string{`id="series-direct"`, `id="series-llmgate"`, `id="latency-llmgate"`, `data-values="2,1"`, `data-count="3"`, `id="summary"`} {
		if !strings.Contains(html, want) {
			t.Errorf("the report lacks %s", want)
		}
	}
	m := regexp.MustCompile(`(?s)<script type="application/json" id="result">(.*?)</script>`).FindStringSubmatch(html)
	if m == nil {
		t.Fatal("no embedded result")
	}
	var back Result
	if err := json.Unmarshal([]byte(m[1]), &back); err != nil || back.Description != r.Description {
		t.Errorf("embedded JSON: %v, %q", err, back.Description)
	}
}

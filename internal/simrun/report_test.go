package simrun

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/llmgate/llmgate/internal/testutil/browser"
)

// domArm is what the page shows of one arm.
type domArm struct {
	Attrs    map[string]string   `json:"attrs"`
	Series   map[string][]string `json:"series"`
	Seconds  string              `json:"seconds"`
	Buckets  []map[string]string `json:"buckets"`
	HasChart bool                `json:"has_chart"`
}

const readDOM = `(() => {
  const out = {};
  for (const el of document.querySelectorAll('.arm[data-arm]')) {
    const name = el.dataset.arm, a = {attrs: {}, series: {}, buckets: []};
    for (const k of Object.keys(el.dataset)) a.attrs[k] = el.dataset[k];
    const svg = document.getElementById('series-' + name);
    a.has_chart = !!svg && svg.getBoundingClientRect().width > 0;
    a.seconds = svg ? svg.dataset.seconds : '';
    for (const pl of (svg ? svg.querySelectorAll('polyline') : [])) {
      a.series[pl.getAttribute('class')] = pl.dataset.values.split(',');
    }
    const lat = document.getElementById('latency-' + name);
    for (const r of (lat ? lat.querySelectorAll('rect') : [])) {
      a.buckets.push({up: r.dataset.upToMs, count: r.dataset.count, h: String(r.getBoundingClientRect().height)});
    }
    out[name] = a;
  }
  return JSON.stringify({arms: out, rows: document.querySelectorAll('#summary tbody tr').length,
    external: document.querySelectorAll('script[src],link[href],img[src]').length,
    json: document.getElementById('result').textContent});
})()`

// TestReportInChromium renders the report of a real (short) run in
// headless Chromium and checks that the charts exist and carry the
// numbers of the JSON result.
func TestReportInChromium(t *testing.T) {
	ctx := browser.Start(t, 2*time.Minute)
	sc := builtin(t, "burst")
	sc.Provider.RPM = 60
	sc.Provider.TTFT = 100 * time.Millisecond
	sc.Clients.Callers = 70
	sc.Clients.Deadline = 8 * time.Second
	sc.Gateway.MaxWait = 0
	sc.SetDefaults()
	sc.Duration = 10 * time.Second
	res := run(t, sc, 1)
	path := filepath.Join(t.TempDir(), "report.html")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteReport(f, res); err != nil {
		t.Fatal(err)
	}
	f.Close()

	if err := chromedp.Do(ctx, chromedp.Navigate("file://"+path), chromedp.WaitVisible(chromedp.ID("summary"))); err != nil {
		t.Fatal(err)
	}
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](readDOM))
	if err != nil {
		t.Fatal(err)
	}
	var dom struct {
		Arms     map[string]domArm `json:"arms"`
		Rows     int               `json:"rows"`
		External int               `json:"external"`
		JSON     string            `json:"json"`
	}
	if err := json.Unmarshal([]byte(raw), &dom); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	if dom.External != 0 {
		t.Errorf("the report loads %d external resources; want none", dom.External)
	}
	if dom.Rows < 10 {
		t.Errorf("the table has %d rows", dom.Rows)
	}
	var embedded Result
	if err := json.Unmarshal([]byte(dom.JSON), &embedded); err != nil || embedded.Scenario != res.Scenario || len(embedded.Arms) != 2 {
		t.Errorf("the embedded JSON does not hold the result: %v", err)
	}
	for _, a := range res.Arms {
		d, ok := dom.Arms[a.Name]
		if !ok || !d.HasChart {
			t.Errorf("%s: no visible series chart", a.Name)
			continue
		}
		// dataset keys are the data-* names in camelCase.
		for key, want := range map[string]string{
			"requests": fmt.Sprint(a.Requests), "succeeded": fmt.Sprint(a.Succeeded),
			"provider-429": fmt.Sprint(a.Provider429), "client-429": fmt.Sprint(a.Client429),
			"upstreamCalls": fmt.Sprint(a.UpstreamCalls), "tokensBilled": fmt.Sprint(a.TokensBilled),
			"p50": fmt.Sprint(a.LatencyMS.P50), "p95": fmt.Sprint(a.LatencyMS.P95), "p99": fmt.Sprint(a.LatencyMS.P99),
			"quotaUsed": fmt.Sprint(a.QuotaUsed), "successRate": fmt.Sprint(a.SuccessRate),
		} {
			if got, ok := d.Attrs[key]; !ok || got != want {
				t.Errorf("%s: data attribute %s = %q; the JSON says %s (attributes: %v)", a.Name, key, got, want, d.Attrs)
			}
		}
		if d.Seconds != strconv.Itoa(len(a.Series)) {
			t.Errorf("%s: chart of %s seconds; the JSON has %d", a.Name, d.Seconds, len(a.Series))
		}
		for class, get := range map[string]func(Point) float64{
			"admitted": func(p Point) float64 { return float64(p.Admitted) },
			"rejected": func(p Point) float64 { return float64(p.Got429) },
			"queued":   func(p Point) float64 { return p.Queued },
		} {
			vals := d.Series[class]
			if len(vals) != len(a.Series) {
				t.Errorf("%s: %s line has %d points; the JSON %d", a.Name, class, len(vals), len(a.Series))
				continue
			}
			for i, p := range a.Series {
				if v, err := strconv.ParseFloat(vals[i], 64); err != nil || v != get(p) {
					t.Errorf("%s: %s at %ds is %q; the JSON says %v", a.Name, class, i, vals[i], get(p))
				}
			}
		}
		if len(d.Buckets) != len(a.Histogram) {
			t.Errorf("%s: %d latency bars; the JSON has %d buckets", a.Name, len(d.Buckets), len(a.Histogram))
		}
		for i := range min(len(d.Buckets), len(a.Histogram)) {
			if d.Buckets[i]["count"] != strconv.Itoa(a.Histogram[i].Count) {
				t.Errorf("%s: bar %d counts %s; the JSON %d", a.Name, i, d.Buckets[i]["count"], a.Histogram[i].Count)
			}
		}
	}
}

// TestReportScreenshot writes a PNG of the report at $LLMGATE_SIM_REPORT
// (an HTML report, or the --json output of a run, rendered first) to
// $LLMGATE_SIM_SCREENSHOT: how docs/sim-report.png is made. It does
// nothing without them.
func TestReportScreenshot(t *testing.T) {
	in, out := os.Getenv("LLMGATE_SIM_REPORT"), os.Getenv("LLMGATE_SIM_SCREENSHOT")
	if in == "" || out == "" {
		t.Skip("set LLMGATE_SIM_REPORT=report.html and LLMGATE_SIM_SCREENSHOT=out.png to take one")
	}
	ctx := browser.Start(t, 2*time.Minute)
	if strings.HasSuffix(in, ".json") {
		data, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		var r Result
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		in = filepath.Join(t.TempDir(), "report.html")
		f, err := os.Create(in)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteReport(f, &r); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	abs, err := filepath.Abs(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate("file://"+abs), chromedp.WaitVisible(chromedp.ID("summary"))); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

package simrun

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"strings"
)

// The report is one HTML file with nothing to fetch: inline CSS, inline
// SVG charts drawn here, and the result as JSON in a data block (not a
// script that runs). Every chart element carries its numbers in data-*
// attributes so that a test, or a reader's tool, can check them against
// the JSON.

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 560.0, 200.0
	padL, padR     = 44.0, 10.0
	padT, padB     = 10.0, 24.0
)

var reportTmpl = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>llmgate sim {{.R.Scenario}}</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#1d2330;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:16px;margin:24px 0 8px}
.sub{color:#5b6475;margin:0 0 16px}
table{border-collapse:collapse;margin:8px 0}
th,td{padding:4px 12px;border-bottom:1px solid #e3e6ec;text-align:right}
th:first-child,td:first-child{text-align:left;color:#5b6475}
thead th{border-bottom:2px solid #c9ced8}
.arms{display:flex;flex-wrap:wrap;gap:24px}
.arm{flex:1 1 520px}
.arm h3{font-size:15px;margin:8px 0 4px}
svg{background:#fafbfc;border:1px solid #e3e6ec;border-radius:4px}
svg text{font-size:11px;fill:#5b6475}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:12px;height:3px;vertical-align:middle;margin-right:4px}
.admitted{stroke:#2a7de1}.rejected{stroke:#e0453a}.queued{stroke:#e0a03a}
.bar{fill:#2a7de1}
</style>
</head>
<body>
<h1>llmgate sim: {{.R.Scenario}}</h1>
<p class="sub">{{.R.Description}} &middot; {{.R.Replicas}} replica(s) on the {{.R.Store}} store &middot; seed {{.R.Seed}}</p>

<h2>Results</h2>
<table id="summary">
<thead><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>{{range .Body}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>{{end}}</tbody>
</table>

<h2>Per second: admitted by the provider, 429s received by clients, requests waiting</h2>
<p class="legend"><span><i style="background:#2a7de1"></i>admitted</span><span><i style="background:#e0453a"></i>429s</span><span><i style="background:#e0a03a"></i>waiting (gateway queue or client backoff)</span></p>
<div class="arms">
{{range .Arms}}<div class="arm" id="arm-{{.Name}}" data-arm="{{.Name}}" data-requests="{{.A.Requests}}" data-succeeded="{{.A.Succeeded}}" data-success-rate="{{.A.SuccessRate}}" data-client-429="{{.A.Client429}}" data-provider-429="{{.A.Provider429}}" data-upstream-calls="{{.A.UpstreamCalls}}" data-tokens-billed="{{.A.TokensBilled}}" data-cost-usd="{{.A.CostUSD}}" data-quota-used="{{.A.QuotaUsed}}" data-p50="{{.A.LatencyMS.P50}}" data-p95="{{.A.LatencyMS.P95}}" data-p99="{{.A.LatencyMS.P99}}">
<h3>{{.Name}}</h3>
{{.Series}}
</div>
{{end}}</div>

<h2>Latency of the requests served (ms, log scale buckets)</h2>
<div class="arms">
{{range .Arms}}<div class="arm"><h3>{{.Name}}: p50 {{.A.LatencyMS.P50}} ms, p95 {{.A.LatencyMS.P95}} ms, p99 {{.A.LatencyMS.P99}} ms</h3>
{{.Latency}}
</div>
{{end}}</div>

<script type="application/json" id="result">{{.JSON}}</script>
</body>
</html>
`))

type reportArm struct {
	Name            string
	A               *Arm
	Series, Latency template.HTML
}

// WriteReport writes r as one self-contained HTML page.
func WriteReport(w io.Writer, r *Result) error {
	rows := r.Rows()
	js, err := json.Marshal(r)
	if err != nil {
		return err
	}
	// The arms share the time axis, so that their lengths compare at a
	// glance; each has its own vertical scale (a burst of 429s would
	// flatten the other arm's lines).
	maxT := 1
	for _, a := range r.Arms {
		maxT = max(maxT, len(a.Series))
	}
	data := struct {
		R    *Result
		Head []string
		Body [][]string
		Arms []reportArm
		JSON template.JS
	}{R: r, Head: rows[0], Body: rows[1:], JSON: template.JS(js)}
	for i := range r.Arms {
		a := &r.Arms[i]
		maxY := 1.0
		for _, p := range a.Series {
			maxY = max(maxY, float64(p.Admitted), float64(p.Got429), p.Queued)
		}
		data.Arms = append(data.Arms, reportArm{Name: a.Name, A: a,
			Series: seriesSVG(a, maxT, niceCeil(maxY)), Latency: latencySVG(a)})
	}
	var b bytes.Buffer
	if err := reportTmpl.Execute(&b, data); err != nil {
		return err
	}
	_, err = w.Write(b.Bytes())
	return err
}

// seriesSVG draws an arm's per-second series as three polylines.
func seriesSVG(a *Arm, maxT int, maxY float64) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="series-%s" class="series" data-seconds="%d" data-max-y="%g" width="%g" height="%g" viewBox="0 0 %g %g" role="img" aria-label="per-second series of %s">`,
		a.Name, len(a.Series), maxY, chartW, chartH, chartW, chartH, a.Name)
	axes(&b, float64(maxT), maxY, "s")
	x := func(t int) float64 { return padL + (chartW-padL-padR)*float64(t)/float64(max(maxT-1, 1)) }
	y := func(v float64) float64 { return chartH - padB - (chartH-padT-padB)*v/maxY }
	for _, s := range []struct {
		class string
		get   func(Point) float64
	}{
		{"admitted", func(p Point) float64 { return float64(p.Admitted) }},
		{"rejected", func(p Point) float64 { return float64(p.Got429) }},
		{"queued", func(p Point) float64 { return p.Queued }},
	} {
		var pts, vals []string
		total := 0.0
		for i, p := range a.Series {
			v := s.get(p)
			total += v
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(v)))
			vals = append(vals, strconv.FormatFloat(v, 'g', -1, 64))
		}
		fmt.Fprintf(&b, `<polyline class="%s" fill="none" stroke-width="2" points="%s" data-values="%s" data-total="%g"/>`,
			s.class, strings.Join(pts, " "), strings.Join(vals, ","), total)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// latencySVG draws an arm's latency histogram as bars.
func latencySVG(a *Arm) template.HTML {
	var b strings.Builder
	n := len(a.Histogram)
	maxC := 1
	for _, h := range a.Histogram {
		maxC = max(maxC, h.Count)
	}
	top := niceCeil(float64(maxC))
	fmt.Fprintf(&b, `<svg id="latency-%s" class="latency" data-buckets="%d" width="%g" height="%g" viewBox="0 0 %g %g" role="img" aria-label="latency histogram of %s">`,
		a.Name, n, chartW, chartH, chartW, chartH, a.Name)
	axes(&b, 0, top, "")
	bw := (chartW - padL - padR) / float64(max(n, 1))
	for i, h := range a.Histogram {
		hgt := (chartH - padT - padB) * float64(h.Count) / top
		x := padL + bw*float64(i)
		fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" data-up-to-ms="%g" data-count="%d"><title>≤ %g ms: %d</title></rect>`,
			x+1, chartH-padB-hgt, bw-2, hgt, h.UpToMS, h.Count, h.UpToMS, h.Count)
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">≤%s</text>`, x+bw/2, chartH-8, shortMS(h.UpToMS))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// axes draws the frame, the y ticks, and x ticks when maxX > 0.
func axes(b *strings.Builder, maxX, maxY float64, unit string) {
	fmt.Fprintf(b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#c9ced8"/>`, padL, chartH-padB, chartW-padR, chartH-padB)
	fmt.Fprintf(b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#c9ced8"/>`, padL, padT, padL, chartH-padB)
	for i := 0; i <= 4; i++ {
		v := maxY * float64(i) / 4
		yy := chartH - padB - (chartH-padT-padB)*float64(i)/4
		fmt.Fprintf(b, `<text x="%g" y="%.1f" text-anchor="end">%s</text>`, padL-4, yy+4, strconv.FormatFloat(math.Round(v*10)/10, 'g', -1, 64))
	}
	if maxX > 0 {
		for i := 0; i <= 5; i++ {
			t := math.Round((maxX - 1) * float64(i) / 5)
			xx := padL + (chartW-padL-padR)*float64(i)/5
			fmt.Fprintf(b, `<text x="%.1f" y="%g" text-anchor="middle">%g%s</text>`, xx, chartH-8, t, unit)
		}
	}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func shortMS(v float64) string {
	if v >= 1000 {
		return strconv.FormatFloat(v/1000, 'g', -1, 64) + "s"
	}
	return strconv.FormatFloat(v, 'g', -1, 64) + "ms"
}

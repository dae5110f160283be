package app

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/internal/config"
)

// registeredNames starts a server on the embedded default configuration
// and returns the name of every metric its registry can export: those of
// every collector registered, vectors without a series yet included.
func registeredNames(t *testing.T) map[string]bool {
	t.Helper()
	getenv := func(string) string { return "" }
	cfg := config.Default(getenv)
	cfg.StateDir = t.TempDir()
	if err := cfg.Validate(getenv); err != nil {
		t.Fatal(err)
	}
	a := &App{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard, Getenv: getenv, Environ: func() []string { return nil }}
	log := newLogger(io.Discard, cfg.Log, nil)
	s, err := a.startServer(cfg, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.gw.Close(ctx)
		s.close()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s.httpServer(cfg, ln, log) // registers the connection metrics

	descs := make(chan *prometheus.Desc, 64)
	go func() {
		s.registry.Describe(descs)
		close(descs)
	}()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for d := range descs {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	// The Go collector describes its runtime/metrics series only when
	// gathered.
	fams, err := s.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		names[f.GetName()] = true
	}
	return names
}

// promQLWords are PromQL's functions, aggregations and keywords: every
// other identifier outside braces, brackets, strings and by/without lists
// is a metric name.
var promQLWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "stddev": true, "topk": true, "bottomk": true, "quantile": true, "group": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true,
	"rate": true, "irate": true, "increase": true, "delta": true, "deriv": true, "histogram_quantile": true, "clamp_min": true, "clamp_max": true,
	"abs": true, "ceil": true, "floor": true, "round": true, "time": true, "vector": true, "scalar": true, "absent": true, "label_replace": true,
	"avg_over_time": true, "max_over_time": true, "min_over_time": true, "sum_over_time": true, "changes": true, "resets": true,
}

var (
	reBraces   = regexp.MustCompile(`\{[^}]*\}`)
	reBrackets = regexp.MustCompile(`\[[^\]]*\]`)
	reStrings  = regexp.MustCompile(`"[^"]*"`)
	reGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	reIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	reNumber   = regexp.MustCompile(`\b[0-9]+(\.[0-9]+)?([eE][0-9]+)?\b`)
)

// metricNames returns the metric names an expression uses.
func metricNames(expr string) []string {
	e := reStrings.ReplaceAllString(expr, " ")
	e = reBraces.ReplaceAllString(e, " ")
	e = reBrackets.ReplaceAllString(e, " ")
	e = reGrouping.ReplaceAllString(e, " ")
	e = reNumber.ReplaceAllString(e, " ")
	var out []string
	for _, w := range reIdent.FindAllString(e, -1) {
		if !promQLWords[w] {
			out = append(out, w)
		}
	}
	return out
}

// TestGrafanaDashboard: docs/grafana/llmgate.json parses, and every
// expression of every panel names only metrics the gateway exports.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../../docs/grafana/llmgate.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("the dashboard lacks a title, uid or panels")
	}
	names := registeredNames(t)
	exprs := 0
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs++
			ms := metricNames(tg.Expr)
			if len(ms) == 0 {
				t.Errorf("panel %q: %q names no metric", p.Title, tg.Expr)
			}
			for _, m := range ms {
				base := m
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if s, ok := strings.CutSuffix(m, suf); ok && names[s] {
						base = s
					}
				}
				if !names[base] {
					t.Errorf("panel %q: %q names %s, which the gateway does not export", p.Title, tg.Expr, m)
				}
			}
		}
	}
	t.Logf("%d panels, %d expressions, %d metrics exported", len(dash.Panels), exprs, len(names))
}

func TestMetricNames(t *testing.T) {
	got := metricNames(`histogram_quantile(0.95, sum by (deployment, le) (rate(llmgate_x_bucket{result="ok"}[5m]))) * 60 - max(llmgate_y)`)
	if strings.Join(got, ",") != "llmgate_x_bucket,llmgate_y" {
		t.Fatalf("metricNames = %v", got)
	}
}

// TestMetricsDocumented: every llmgate_ metric the gateway exports is in
// docs/metrics.md.
func TestMetricsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range registeredNames(t) {
		if strings.HasPrefix(name, "llmgate_") && !strings.Contains(string(b), "`"+name+"`") {
			t.Errorf("%s is not documented in docs/metrics.md", name)
		}
	}
}

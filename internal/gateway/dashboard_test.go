package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/dashboard"
	"github.com/llmgate/llmgate/internal/testutil/browser"
)

// TestDashboardInChromium: the dashboard, opened in headless Chromium
// through its login form with the admin token, shows a gateway that served
// requests: its totals equal /metrics's, each deployment's answers and
// tokens equal its series there, its quota is the shared limiter's (what
// is in use there refills as the test runs, so it is only bounded),
// and the tenant's spend is the budget store's. With
// LLMGATE_DASHBOARD_SCREENSHOT=FILE it also saves a screenshot.
func TestDashboardInChromium(t *testing.T) {
	b := budget.Budget{Tenant: "team-a", Period: budget.Month, MicroUSD: 5_000_000}
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		for i := range o.Deployments {
			o.Deployments[i].Limits = Limits{RPM: 1200, TPM: 200_000}
		}
		h.teamA.Budget = &b
		o.ReplicaName = "gateway-1"
		o.Replicas = func(context.Context) ([]dashboard.Replica, error) {
			return []dashboard.Replica{{Name: "gateway-1", LastSeen: time.Now()}}, nil
		}
	}})
	// Started after the gateway, so stopped before it: its event stream
	// would hold the test server's Close.
	ctx := browser.Start(t, 2*time.Minute)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(h.url+"/dashboard/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), "wrong"),
		chromedp.Click(chromedp.ID("login")),
		// The refusal is a new page: typing before it loads would type
		// into the old one.
		chromedp.WaitVisible(chromedp.ID("refused")),
		chromedp.SendKeys(chromedp.ID("token"), adminToken),
		chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("requests-total")),
	); err != nil {
		t.Fatal(err)
	}
	if title, err := chromedp.Run(ctx, chromedp.Title()); err != nil || title != "llmgate dashboard" {
		t.Fatalf("title %q, %v", title, err)
	}

	// Load while the page is open, for a few of its updates: at least 40
	// requests and 3 seconds, at most 300 requests (a quarter of the RPM).
	client := h.client(tenantKey)
	start := time.Now()
	for i := 0; i < 300 && (i < 40 || time.Since(start) < 3*time.Second); i++ {
		model := "gpt-4.1"
		if i%4 == 0 {
			model = "gpt-4.1-mini"
		}
		if _, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model:    model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("question %d", i))},
		}); err != nil {
			t.Fatal(err)
		}
	}
	// A request the gateway refuses: a model that does not exist is 404.
	resp := h.post("/v1/chat/completions", tenantKey, `{"model":"nope","messages":[{"role":"user","content":"x"}]}`)
	resp.Body.Close()

	var (
		want scraped
		dom  pageState
	)
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Scraped afresh each time: a request is counted just after its
		// client has the answer.
		want = scrape(t, h)
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](readDashboard))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(raw), &dom); err != nil {
			t.Fatal(err)
		}
		st, err := h.budgets.Spend(t.Context(), b, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		// The page catches up within a second; the settles may too.
		if dom.Requests == want.requests && dom.Tenants["team-a"].SpentUSD == float64(st.Spent.MicroUSD)/1e6 && st.Holds == 0 {
			if dom.Deployments["sim/gpt-4.1"].Tokens == want.tokens["sim/gpt-4.1"] {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page shows %+v; /metrics has %v requests", dom, want.requests)
		}
		time.Sleep(100 * time.Millisecond) // the page updates once a second
	}
	if dom.Replicas != "gateway-1" {
		t.Errorf("replicas shown %q, want this one", dom.Replicas)
	}
	if dom.Store != "true" {
		t.Errorf("store shown %q, want up", dom.Store)
	}
	if dom.Upstream429 != 0 || dom.Limited != 0 {
		t.Errorf("429s shown: %v by llmgate, %v by the provider; want none", dom.Limited, dom.Upstream429)
	}
	for _, d := range []string{"sim/gpt-4.1", "sim/gpt-4.1-mini"} {
		got, ok := dom.Deployments[d]
		switch {
		case !ok:
			t.Errorf("no row for %s: %+v", d, dom.Deployments)
			continue
		case got.OK != want.answers[d] || got.Tokens != want.tokens[d]:
			t.Errorf("%s shows %v answers and %v tokens; /metrics has %v and %v", d, got.OK, got.Tokens, want.answers[d], want.tokens[d])
		case got.RPMLimit != 1200 || got.TPMLimit != 200_000:
			t.Errorf("%s shows limits %v RPM, %v TPM; want 1200 and 200000", d, got.RPMLimit, got.TPMLimit)
		case got.RPMUsed < 0 || got.RPMUsed > want.answers[d] || got.TPMUsed < 0 || got.TPMUsed > want.tokens[d]:
			t.Errorf("%s shows %v requests and %v tokens of its quota in use; it served %v and %v", d, got.RPMUsed, got.TPMUsed, want.answers[d], want.tokens[d])
		}
	}
	st, err := h.budgets.Spend(t.Context(), b, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if tn := dom.Tenants["team-a"]; tn.CapUSD != 5 || tn.SpentUSD != float64(st.Spent.MicroUSD)/1e6 || st.Spent.MicroUSD == 0 {
		t.Errorf("team-a shows $%v of $%v; the store has %d µUSD spent", tn.SpentUSD, tn.CapUSD, st.Spent.MicroUSD)
	}
	if len(dom.Latency) == 0 || dom.LatencyCount == 0 {
		t.Errorf("latency rows %v with %v requests; want the load's", dom.Latency, dom.LatencyCount)
	}
	if dom.MaxRate <= 0 {
		t.Error("the requests chart never rose above zero under load")
	}
	if path := os.Getenv("LLMGATE_DASHBOARD_SCREENSHOT"); path != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// pageState is what the dashboard shows, read from its DOM.
type pageState struct {
	Requests    float64 `json:"requests"`
	Limited     float64 `json:"limited"`
	Upstream429 float64 `json:"upstream429"`
	Store       string  `json:"store"`
	Replicas    string  `json:"replicas"`
	Points      int     `json:"points"`
	Deployments map[string]struct {
		OK       float64 `json:"ok"`
		Tokens   float64 `json:"tokens"`
		RPMLimit float64 `json:"rpm_limit"`
		RPMUsed  float64 `json:"rpm_used"`
		TPMLimit float64 `json:"tpm_limit"`
		TPMUsed  float64 `json:"tpm_used"`
	} `json:"deployments"`
	Tenants map[string]struct {
		SpentUSD float64 `json:"spent_usd"`
		CapUSD   float64 `json:"cap_usd"`
	} `json:"tenants"`
	Latency      []string `json:"latency"`
	LatencyCount float64  `json:"latency_count"`
	MaxRate      float64  `json:"max_rate"`
}

const readDashboard = `(() => {
  const num = (el, k) => el ? Number(el.dataset[k || "value"]) : NaN;
  const out = {
    requests: num(document.getElementById("requests-total")),
    limited: num(document.getElementById("limited-total")),
    upstream429: num(document.getElementById("upstream429-total")),
    store: document.getElementById("store").dataset.up,
    replicas: document.getElementById("replicas").dataset.names,
    points: (document.querySelector("#chart-requests polyline").dataset.values || "").split(",").filter(Boolean).length,
    deployments: {}, tenants: {}, latency: [], latency_count: 0,
    max_rate: Math.max(0, ...(document.querySelector("#chart-requests polyline").dataset.values || "0").split(",").map(Number)),
  };
  for (const tr of document.querySelectorAll("#deployments tbody tr")) {
    const td = tr.querySelectorAll("td");
    out.deployments[tr.dataset.deployment] = {
      rpm_limit: num(td[1], "limit"), rpm_used: num(td[1], "used"),
      tpm_limit: num(td[2], "limit"), tpm_used: num(td[2], "used"),
      ok: num(td[3], "ok"), tokens: num(td[4]),
    };
  }
  for (const tr of document.querySelectorAll("#tenants tbody tr")) {
    const td = tr.querySelectorAll("td");
    out.tenants[tr.dataset.tenant] = {spent_usd: num(td[1], "spentUsd"), cap_usd: num(td[1], "capUsd")};
  }
  for (const tr of document.querySelectorAll("#latency tbody tr")) {
    out.latency.push(tr.dataset.name);
    out.latency_count += num(tr.querySelectorAll("td")[1]);
  }
  return JSON.stringify(out);
})()`

// scraped is what /metrics says, for the comparison.
type scraped struct {
	requests        float64
	answers, tokens map[string]float64
}

// scrape reads /metrics the way Prometheus does.
func scrape(t *testing.T, h *harness) scraped {
	t.Helper()
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	s := scraped{answers: map[string]float64{}, tokens: map[string]float64{}}
	for _, line := range strings.Split(string(body), "\n") {
		name, rest, ok := strings.Cut(line, "{")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		dep := ""
		if _, after, ok := strings.Cut(labels, `deployment="`); ok {
			dep, _, _ = strings.Cut(after, `"`)
		}
		switch {
		case name == "llmgate_requests_total":
			s.requests += v
		case name == "llmgate_upstream_responses_total" && strings.Contains(labels, `status="2xx"`):
			s.answers[dep] += v
		case name == "llmgate_tokens_total":
			s.tokens[dep] += v
		}
	}
	return s
}

package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/lock"
	lockmemory "github.com/llmgate/llmgate/lock/memory"
)

// gathered returns the gateway's metric families by name.
func gathered(t *testing.T, g *Gateway) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := g.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// series returns the metric of family name whose labels include want.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// TestOpsMetrics: upstream latency and time to first token per
// deployment, breaker state, limits, budget remaining, session locks and
// the tenants in force are exported.
func TestOpsMetrics(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		h.teamA.Budget = &budget.Budget{Tenant: "team-a", Period: budget.Month, MicroUSD: 5_000_000}
		o.Sessions = SessionOptions{Locker: lock.New(lockmemory.New(clock.Real{}))}
		o.Deployments[0].Limits = Limits{RPM: 1000, TPM: 100000}
	}})
	dep := h.gw.deps[0].Name
	model := h.gw.deps[0].Model
	for _, body := range []string{
		`{"model":"` + model + `","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"` + model + `","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		resp := h.post("/v1/chat/completions", tenantKey, body, "X-Session-Id", "s1")
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d for %s", resp.StatusCode, body)
		}
	}
	waitIdle(t, h.gw) // relays observe their latency as they end, after the answer
	fams := gathered(t, h.gw)
	if m := series(fams, "llmgate_upstream_duration_seconds", map[string]string{"deployment": dep}); m == nil || m.GetHistogram().GetSampleCount() != 2 {
		t.Errorf("upstream duration of %s: %v, want 2 samples", dep, m)
	}
	if m := series(fams, "llmgate_upstream_time_to_first_token_seconds", map[string]string{"deployment": dep}); m == nil || m.GetHistogram().GetSampleCount() != 1 {
		t.Errorf("time to first token of %s: %v, want 1 sample (the stream)", dep, m)
	}
	if m := series(fams, "llmgate_breaker_state", map[string]string{"deployment": dep, "state": "closed"}); m == nil || m.GetGauge().GetValue() != 1 {
		t.Errorf("breaker closed: %v", m)
	}
	if m := series(fams, "llmgate_breaker_state", map[string]string{"deployment": dep, "state": "open"}); m == nil || m.GetGauge().GetValue() != 0 {
		t.Errorf("breaker open: %v", m)
	}
	if m := series(fams, "llmgate_deployment_limit", map[string]string{"deployment": dep, "kind": "rpm"}); m == nil || m.GetGauge().GetValue() != 1000 {
		t.Errorf("deployment rpm limit: %v", m)
	}
	rem := series(fams, "llmgate_budget_remaining_usd", map[string]string{"tenant": "team-a"})
	if rem == nil || !(rem.GetGauge().GetValue() > 0 && rem.GetGauge().GetValue() < 5) {
		t.Errorf("team-a's remaining budget: %v, want below the 5 USD cap after two requests", rem)
	}
	if m := series(fams, "llmgate_session_locks_acquired_total", nil); m == nil || m.GetCounter().GetValue() != 2 {
		t.Errorf("session locks acquired: %v, want 2", m)
	}
	if m := series(fams, "llmgate_tenants", nil); m == nil || m.GetGauge().GetValue() != 2 {
		t.Errorf("tenants: %v, want 2", m)
	}
	if m := series(fams, "llmgate_queue_depth", nil); m != nil && m.GetGauge().GetValue() != 0 {
		t.Errorf("queue depth %v with nothing waiting", m)
	}
	if m := series(fams, "llmgate_store_ping_seconds", nil); m == nil {
		t.Error("no store ping")
	}
	for name, f := range fams {
		if !strings.HasPrefix(name, "llmgate_") {
			t.Errorf("metric %s outside the llmgate_ namespace", name)
		}
		if f.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
	}
}

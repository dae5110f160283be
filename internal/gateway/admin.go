package gateway

import (
	"net/http"
	"slices"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/openai"
)

// tenantUsage is one tenant's usage in a window, for GET /admin/usage.
type tenantUsage struct {
	Tenant string            `json:"tenant"`
	Window string            `json:"window"`
	Rows   []budget.UsageRow `json:"rows"`
	// Budget is the tenant's budget state when it has one.
	Budget *budgetState `json:"budget,omitempty"`
}

type budgetState struct {
	Period      string `json:"period"`
	SpentUSD    string `json:"spent_usd"`
	SpentTokens int64  `json:"spent_tokens"`
	CapUSD      string `json:"cap_usd,omitempty"`
	CapTokens   int64  `json:"cap_tokens,omitempty"`
	Reserved    int    `json:"live_reservations"`
}

// serveAdminUsage answers GET /admin/usage[?tenant=NAME][&window=2026-11]:
// usage per tenant, model and deployment, with cost.
func (g *Gateway) serveAdminUsage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	tenants := g.tenantList()
	if name := q.Get("tenant"); name != "" {
		tenants = slices.DeleteFunc(tenants, func(t *Tenant) bool { return t.Name != name })
		if len(tenants) == 0 {
			errf(http.StatusNotFound, openai.TypeNotFound, "unknown_tenant", "tenant", "No tenant is named %q.", name).Write(w)
			return
		}
	}
	window := q.Get("window")
	if window != "" {
		if _, err := budget.ParseWindowID(window); err != nil {
			openai.BadRequest("window", "Invalid window %q: use a month (2026-11) or a day (2026-11-29).", window).Write(w)
			return
		}
	}
	out := []tenantUsage{}
	for _, t := range tenants {
		b := t.accountingBudget()
		id := window
		if id == "" {
			win, err := b.Window(time.Now())
			if err != nil {
				internalError(g, &call{id: "admin"}, "admin window", err).Write(w)
				return
			}
			id = win.ID
		}
		tu := tenantUsage{Tenant: t.Name, Window: id}
		// The budget first, the rows after: both reads charge the holds
		// that expired, so what the budget shows spent is in the rows
		// even when a hold expires between the two.
		if t.Budget != nil && window == "" {
			if st, err := g.opt.Budgets.Spend(r.Context(), b, time.Now()); err == nil {
				tu.Budget = &budgetState{
					Period: string(b.Period), SpentUSD: budget.FormatUSD(st.Spent.MicroUSD), SpentTokens: st.Spent.Tokens,
					CapTokens: b.Tokens, Reserved: st.Holds,
				}
				if b.MicroUSD > 0 {
					tu.Budget.CapUSD = budget.FormatUSD(b.MicroUSD)
				}
			}
		}
		rows, err := g.opt.Budgets.Usage(r.Context(), t.Name, id)
		if err != nil {
			g.log.Error("admin usage failed", "err", err)
			errf(http.StatusServiceUnavailable, openai.TypeUnavailable, "store_unavailable", "", "The usage store cannot be read right now.").Write(w)
			return
		}
		tu.Rows = rows
		if rows == nil {
			tu.Rows = []budget.UsageRow{}
		}
		out = append(out, tu)
	}
	writeJSON(w, http.StatusOK, out)
}

// tenantList returns the tenants in force (or the anonymous one), in name
// order.
func (g *Gateway) tenantList() []*Tenant {
	return slices.Clone(g.tenants.Load().list)
}

type deploymentState struct {
	Name      string  `json:"name"`
	Provider  string  `json:"provider"`
	Model     string  `json:"model"`
	Breaker   string  `json:"breaker"`
	TimeoutMs int64   `json:"timeout_ms"`
	Headroom  float64 `json:"headroom"`
	Limits    struct {
		RPM         int64 `json:"rpm"`
		TPM         int64 `json:"tpm"`
		Concurrency int64 `json:"concurrency"`
	} `json:"limits"`
	// Learned are the per-minute limits the provider reported to this
	// replica and still in force (0: none); admission uses the lower of
	// them and the configured ones.
	Learned struct {
		RPM int64 `json:"rpm"`
		TPM int64 `json:"tpm"`
	} `json:"learned"`
}

// serveAdminDeployments answers GET /admin/deployments: each deployment's
// breaker state, adaptive timeout, last known headroom, and limits
// configured and learned from the provider.
func (g *Gateway) serveAdminDeployments(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	out := make([]deploymentState, 0, len(g.deps))
	for _, d := range g.deps {
		s := deploymentState{
			Name: d.Name, Provider: d.Provider, Model: d.Model,
			Breaker:   g.opt.Upstream.State(d.Name),
			TimeoutMs: g.opt.Upstream.Timeout(d.Name).Milliseconds(),
			Headroom:  float64(d.headroom.Load()) / 1e6,
		}
		s.Limits.RPM, s.Limits.TPM, s.Limits.Concurrency = d.Limits.RPM, d.Limits.TPM, d.Limits.Concurrency
		s.Learned.RPM, s.Learned.TPM = d.learned[learnedRequests].get(now), d.learned[learnedTokens].get(now)
		out = append(out, s)
	}
	writeJSON(w, http.StatusOK, out)
}

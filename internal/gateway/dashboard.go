package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	"github.com/llmgate/llmgate/internal/dashboard"
	"github.com/llmgate/llmgate/ratelimit"
)

// dashboardCookie holds a browser's proof that it was given the admin
// token: an HMAC of a fixed text keyed with the token's hash, so that the
// token itself never sits in the browser and nothing needs storing here.
const dashboardCookie = "llmgate_dashboard"

// routeDashboard mounts the live dashboard at /dashboard/, behind the admin
// token: as a bearer token, or as the cookie its login form sets.
func (g *Gateway) routeDashboard(mux *http.ServeMux) {
	d := dashboard.New(dashboard.Config{Gatherer: g.registry, State: g.dashboardState, Replica: g.opt.ReplicaName,
		LatencyMetric: "llmgate_upstream_duration_seconds", LatencyLabel: "deployment"})
	h := http.StripPrefix("/dashboard", d.Handler())
	mux.HandleFunc("GET /dashboard", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/dashboard/", http.StatusSeeOther)
	})
	mux.HandleFunc("POST /dashboard/login", g.serveDashboardLogin)
	mux.HandleFunc("GET /dashboard/", func(w http.ResponseWriter, r *http.Request) {
		setRequestID(w, r)
		switch {
		case g.opt.AdminTokenSHA256 == "":
			errf(http.StatusNotFound, "not_found_error", "admin_disabled", "",
				"The dashboard is disabled: set the admin token (admin_token_env) to enable it.").Write(w)
		case tokenMatches(r, g.opt.AdminTokenSHA256) || g.dashboardCookieOK(r):
			h.ServeHTTP(w, r)
		case r.URL.Path == "/dashboard/":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
			w.WriteHeader(http.StatusUnauthorized)
			page := dashboardLogin
			if r.URL.Query().Has("refused") {
				page = strings.Replace(page, "<button", dashboardRefused+"<button", 1)
			}
			_, _ = w.Write([]byte(page))
		default:
			errf(http.StatusUnauthorized, "authentication_error", "invalid_admin_token", "",
				"The dashboard needs the admin token: log in at /dashboard/.").Write(w)
		}
	})
}

// dashboardProof is the cookie value for the admin token.
func (g *Gateway) dashboardProof() string {
	key, _ := hex.DecodeString(g.opt.AdminTokenSHA256)
	m := hmac.New(sha256.New, key)
	m.Write([]byte("llmgate dashboard session"))
	return hex.EncodeToString(m.Sum(nil))
}

func (g *Gateway) dashboardCookieOK(r *http.Request) bool {
	c, err := r.Cookie(dashboardCookie)
	return err == nil && subtle.ConstantTimeCompare([]byte(c.Value), []byte(g.dashboardProof())) == 1
}

// serveDashboardLogin checks the admin token posted by the login form and
// sets the dashboard's cookie.
func (g *Gateway) serveDashboardLogin(w http.ResponseWriter, r *http.Request) {
	setRequestID(w, r)
	if g.opt.AdminTokenSHA256 == "" {
		errf(http.StatusNotFound, "not_found_error", "admin_disabled", "", "The dashboard is disabled.").Write(w)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	tok := r.PostFormValue("token")
	sum := sha256.Sum256([]byte(tok))
	want, _ := hex.DecodeString(g.opt.AdminTokenSHA256)
	if tok == "" || subtle.ConstantTimeCompare(sum[:], want) != 1 {
		g.log.Warn("dashboard login refused")
		http.Redirect(w, r, "/dashboard/?refused", http.StatusSeeOther)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: dashboardCookie, Value: g.dashboardProof(), Path: "/dashboard/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
		MaxAge: int((12 * time.Hour).Seconds()),
	})
	http.Redirect(w, r, "/dashboard/", http.StatusSeeOther)
}

const dashboardLogin = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>llmgate dashboard</title>
<style>body{font:14px system-ui,sans-serif;display:grid;place-items:center;height:100vh;margin:0;background:#f8fafc}
form{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:1.5rem;display:grid;gap:.6rem;min-width:300px}</style></head>
<body><form method="post" action="/dashboard/login">
<b>llmgate dashboard</b><label>Admin token <input id="token" name="token" type="password" autocomplete="current-password" required autofocus></label>
<button id="login" type="submit">Log in</button></form></body></html>
`

// dashboardRefused tells a person, and a test, that the last token typed
// was wrong.
const dashboardRefused = `<p id="refused" role="alert" style="color:#b91c1c;margin:0">That token was refused.</p>
`

// dashboardState is the store's view of every deployment's quota and every
// tenant's spend, for the dashboard.
func (g *Gateway) dashboardState(ctx context.Context) dashboard.State {
	var st dashboard.State
	for _, d := range g.deps {
		dd := dashboard.Deployment{Name: d.Name, Breaker: g.opt.Upstream.State(d.Name)}
		if limits, err := g.opt.Limiter.Peek(ctx, d.charges(nil, 0)); err == nil {
			for _, s := range limits {
				if s.Scope != d.scope || s.Limit >= unlimitedRPM {
					continue
				}
				q := dashboard.Quota{Limit: s.Limit, Used: max(s.Limit-s.Remaining, 0)}
				switch s.Kind {
				case ratelimit.Requests:
					dd.RPM = q
				case ratelimit.Tokens:
					dd.TPM = q
				}
			}
		}
		st.Deployments = append(st.Deployments, dd)
	}
	if g.opt.Replicas != nil {
		if reps, err := g.opt.Replicas(ctx); err == nil {
			st.Replicas = reps
		}
	}
	now := time.Now()
	for _, t := range g.tenantList() {
		b := t.accountingBudget()
		s, err := g.opt.Budgets.Spend(ctx, b, now)
		if err != nil {
			continue
		}
		st.Tenants = append(st.Tenants, dashboard.Tenant{
			Name: t.Name, Period: string(b.Period),
			SpentUSD: float64(s.Spent.MicroUSD) / 1e6, CapUSD: float64(b.MicroUSD) / 1e6,
			SpentTokens: s.Spent.Tokens, CapTokens: b.Tokens, Holds: s.Holds,
		})
	}
	return st
}

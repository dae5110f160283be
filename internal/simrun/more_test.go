package simrun

import (
	"testing"
	"time"
)

// TestModels: four models with their own quotas behind one endpoint,
// interactive and batch mixed. Through 3 replicas no model's quota is
// exceeded at the provider, and every class of the mix is served.
func TestModels(t *testing.T) {
	sc := builtin(t, "models")
	for i := range sc.Provider.Models { // a run of seconds: a fifth of the quotas
		sc.Provider.Models[i].RPM /= 5
		sc.Provider.Models[i].TPM /= 5
	}
	sc.Clients.Callers = 40
	sc.Clients.Think = time.Second
	sc.Clients.Spread = time.Second
	sc.Clients.Deadline = 6 * time.Second
	sc.Gateway.MaxWait = 0
	sc.SetDefaults()
	sc.Duration = 10 * time.Second
	res := run(t, sc, 3)
	g, d := res.Arm(ArmLlmgate), res.Arm(ArmDirect)
	if g.Provider429 != 0 {
		t.Errorf("llmgate: %d 429s at the provider; want 0", g.Provider429)
	}
	if len(g.Classes) != 5 {
		t.Fatalf("llmgate: %d classes; want 5", len(g.Classes))
	}
	for _, c := range g.Classes {
		if c.Succeeded == 0 && c.Priority == "interactive" {
			t.Errorf("llmgate: no %s %s request served", c.Model, c.Priority)
		}
	}
	if d.Provider429 == 0 {
		t.Errorf("direct: no 429 at the provider; the load does not exceed the quotas")
	}
	if g.CostUSD <= 0 {
		t.Errorf("llmgate: cost %v", g.CostUSD)
	}
}

// TestOutage: the provider answers 503 for a while; through 3 replicas
// the gateway falls back to the second provider and serves nearly every
// request, while straight to the provider the requests of the outage fail.
func TestOutage(t *testing.T) {
	sc := builtin(t, "outage")
	sc.Provider.Outage.Start = 3 * time.Second
	sc.Provider.Outage.Length = 4 * time.Second
	sc.Clients.Callers = 20
	sc.Clients.Deadline = 6 * time.Second
	sc.Gateway.MaxWait = 0
	sc.SetDefaults()
	sc.Duration = 10 * time.Second
	res := run(t, sc, 3)
	g, d := res.Arm(ArmLlmgate), res.Arm(ArmDirect)
	if g.SuccessRate < 0.99 {
		t.Errorf("llmgate: %.1f%% served through the outage; want at least 99%%", 100*g.SuccessRate)
	}
	if d.SuccessRate >= g.SuccessRate || d.ProviderErrors == 0 {
		t.Errorf("direct: %.1f%% served, %d provider errors; want the outage to show", 100*d.SuccessRate, d.ProviderErrors)
	}
}

// TestBudget: a tenant's token cap reached mid-run. Through 3 replicas the
// spend stops at the cap; straight to the provider it runs past it.
func TestBudget(t *testing.T) {
	sc := builtin(t, "budget")
	sc.Gateway.Budget.Tokens = 8000
	sc.Clients.Callers = 20
	sc.Duration = 8 * time.Second
	res := run(t, sc, 3)
	g, d := res.Arm(ArmLlmgate), res.Arm(ArmDirect)
	if g.Budget == nil || g.Budget.Over != 0 || g.TokensBilled > sc.Gateway.Budget.Tokens {
		t.Errorf("llmgate billed %d tokens against a cap of %d (%+v); want at most the cap", g.TokensBilled, sc.Gateway.Budget.Tokens, g.Budget)
	}
	if g.TokensBilled < sc.Gateway.Budget.Tokens/2 {
		t.Errorf("llmgate billed only %d tokens of a %d cap: the cap was not reached", g.TokensBilled, sc.Gateway.Budget.Tokens)
	}
	if d.Budget.Over <= 0 {
		t.Errorf("direct: spend %d did not pass the cap %d", d.TokensBilled, sc.Gateway.Budget.Tokens)
	}
}

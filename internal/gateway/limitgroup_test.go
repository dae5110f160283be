package gateway

import "testing"

// TestLimitGroup: every scope of a deployment is in the deployment's group
// (its name may hold "#" and "/"), a tenant's own and per-model scopes in
// the tenant's.
func TestLimitGroup(t *testing.T) {
	dep := newDeployment(&Deployment{Name: "openai#1/gpt-4o"}, 4)
	for _, scope := range []string{dep.scope, dep.inScope, dep.outScope, dep.slowStartScope()} {
		if g := LimitGroup(scope); g != "dep:openai#1/gpt-4o" {
			t.Errorf("LimitGroup(%q) = %q, want the deployment's group", scope, g)
		}
	}
	for scope, want := range map[string]string{
		"tenant:team-a":                        "tenant:team-a",
		"tenant-model:team-a/gpt-4o":           "tenant:team-a",
		"tenant-model:team-a/meta/llama-3-70b": "tenant:team-a",
		"dep:x#input#input":                    "dep:x#input",
		"llmgate-peek":                         "default",
	} {
		if g := LimitGroup(scope); g != want {
			t.Errorf("LimitGroup(%q) = %q, want %q", scope, g, want)
		}
	}
}

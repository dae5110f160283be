package gateway

import "strings"

// LimitGroup is the rate-limit group of one of the gateway's scopes, for
// ratelimit.Sharded: a deployment's limits (its requests and tokens, its
// input and output tokens, its slow start, cooldowns and learned limits)
// are in the group "dep:<name>", a tenant's (its own and its per-model
// limits) in "tenant:<name>". So a request of a tenant without limits is
// decided in its deployment's group alone, and one with limits spans two.
// Other scopes share the group "default".
func LimitGroup(scope string) string {
	switch {
	case strings.HasPrefix(scope, "dep:"):
		for _, suffix := range [...]string{inputSuffix, outputSuffix, slowStartSuffix} {
			if g, ok := strings.CutSuffix(scope, suffix); ok {
				return g
			}
		}
		return scope
	case strings.HasPrefix(scope, "tenant:"):
		return scope
	case strings.HasPrefix(scope, "tenant-model:"):
		// Tenant names hold no "/"; model names may.
		name, _, _ := strings.Cut(scope[len("tenant-model:"):], "/")
		return "tenant:" + name
	}
	return "default"
}

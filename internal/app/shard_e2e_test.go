//go:build unix

package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestE2EReplicasShardLimitsOverCluster: two replicas on a 3+3 Redis
// Cluster. Each deployment's limits and each tenant's are a group (a hash
// tag) of their own, so their keys land on more than one master; a
// tenant's limit, in a group apart from the deployments its requests go
// to, is still one limit for both replicas: its fifth request in the
// minute is refused, whichever deployment and replica it comes through.
func TestE2EReplicasShardLimitsOverCluster(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	cl := testutil.StartCluster3(t)
	models := []string{"gpt-4.1", "gpt-4.1-mini", "gpt-4o", "gpt-4o-mini"}
	s := newE2ESim(t, sim.Config{Models: models, APIKeys: []string{e2eutil.ProviderKey}})
	const teamBKey = "sk-e2e-team-b-3c9d0a7e61"
	sum := sha256.Sum256([]byte(teamBKey))
	cfg := gatewayConfig{
		Store: cl.URL(), SimURL: s.url, Limits: "{rpm: 1000}", Models: models, MaxWait: "0s", LogLevel: "info",
		// team-b has no limits of its own: its requests stay in their
		// deployment's group.
		Extra: "  - name: team-b\n    api_key_sha256: " + hex.EncodeToString(sum[:]) + "\n",
	}
	reps := e2eutil.StartReplicasYAML(t, 2, e2eutil.TenantYAML(t, cfg, "    limits: {rpm: 4}\n"))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	chat := func(i int, key, model string) (int, string) {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"request %d"}],"max_tokens":4}`, model, i)
		resp, b := reps[i%len(reps)].Post(t, ctx, "/v1/chat/completions", key, body)
		return resp.StatusCode, string(b)
	}
	for i, m := range models {
		if code, body := chat(i, teamBKey, m); code != http.StatusOK {
			t.Fatalf("team-b on %s: %d %s", m, code, body)
		}
		if code, body := chat(i, e2eutil.TenantKey, m); code != http.StatusOK {
			t.Fatalf("team-a's request %d on %s: %d %s", i, m, code, body)
		}
	}
	for i := range 2 {
		code, body := chat(i, e2eutil.TenantKey, models[i])
		if code != http.StatusTooManyRequests || !strings.Contains(body, "rate_limit_exceeded") || !strings.Contains(body, "this API key's limit") {
			t.Fatalf("team-a's request past its 4 a minute, via replica %d: %d %s; want 429 on the tenant's limit", i, code, body)
		}
	}

	perMaster, err := cl.KeysPerMaster(ctx, "llmgate:rl:*")
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	var counts []string
	for m, n := range perMaster {
		counts = append(counts, fmt.Sprintf("%s: %d", m.Addr, n))
		if n > 0 {
			used++
		}
	}
	t.Logf("rate-limit keys per master: %s", strings.Join(counts, ", "))
	if used < 2 {
		t.Fatalf("the rate-limit keys of 4 deployments and 2 tenants are on %d master(s), want at least 2", used)
	}
	for pattern, want := range map[string]bool{
		"llmgate:rl:{tenant:team-a}:*":   true,  // the tenant's limits, apart
		"llmgate:rl:{dep:sim/gpt-4o}:*":  true,  // a deployment's
		"llmgate:rl:{tenant:team-b}:*":   false, // no limits, no keys
		"llmgate:rl:{default}:*":         false, // the one group of a single server
		"llmgate:rl:{dep:sim/gpt-4.1}:*": true,
	} {
		perMaster, err := cl.KeysPerMaster(ctx, pattern)
		if err != nil {
			t.Fatal(err)
		}
		n, on := 0, 0
		for _, k := range perMaster {
			n += k
			if k > 0 {
				on++
			}
		}
		if (n > 0) != want || on > 1 {
			t.Errorf("%d keys match %s, on %d masters; want them there: %v, on one master", n, pattern, on, want)
		}
	}
}

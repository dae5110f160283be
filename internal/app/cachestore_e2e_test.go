//go:build unix

package app

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3/option"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestE2ECacheOwnStore: with cache.store naming a second Redis (with a
// password, maxmemory and allkeys-lru, as docs/cache.md says), hits are
// served from it and the coordination Redis holds no cache key. Once the
// cache Redis is killed, requests are still served, as misses that go
// upstream, and /metrics counts the cache store's errors under its own
// label; /readyz still answers 200.
func TestE2ECacheOwnStore(t *testing.T) {
	e2eutil.LogRuntime(t)
	coord := testutil.StartRedis(t)
	cacheRedis := testutil.StartRedisArgs(t, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru", "--requirepass", e2eutil.RedisPass)
	s := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
	cacheURL := "redis://:" + e2eutil.RedisPass + "@" + cacheRedis.Addr
	reps := e2eutil.StartReplicasYAML(t, 1, e2eutil.TenantYAML(t,
		gatewayConfig{Store: coord.URL(), SimURL: s.URL, LogLevel: "info", Extra: "cache: {store: \"" + cacheURL + "\"}\n"},
		"    cache: {ttl: 1m}\n"))
	r := reps[0]
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	client := r.SDK(e2eutil.TenantKey)
	// ask sends one chat completion with the official SDK and returns the
	// answer's x-llmgate-cache.
	ask := func(prompt string) string {
		t.Helper()
		var resp *http.Response
		c, err := client.Chat.Completions.New(ctx, chatParams(prompt, 64), option.WithResponseInto(&resp))
		if err != nil || len(c.Choices) == 0 {
			t.Fatalf("%q: %v", prompt, err)
		}
		return resp.Header.Get("X-Llmgate-Cache")
	}
	keys := func(c *testutil.Redis, pattern string) int {
		t.Helper()
		out, err := c.Command(ctx, "KEYS", pattern)
		if err != nil {
			t.Fatal(err)
		}
		ks, err := out.AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		return len(ks)
	}
	metric := func(series string) float64 {
		t.Helper()
		v, err := r.Metric(ctx, series)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got := ask("cache me"); got != "miss" {
		t.Fatalf("first request: x-llmgate-cache %q, want miss", got)
	}
	waitUntil(t, 10*time.Second, "the answer is in the cache store", func() bool { return keys(cacheRedis, "llmgate:cache:*:e:*") == 1 })
	if got := ask("cache me"); got != "hit" || s.Count() != 1 {
		t.Fatalf("second request: x-llmgate-cache %q, %d upstream calls; want a hit and 1", got, s.Count())
	}
	if n := keys(coord, "llmgate:cache:*"); n != 0 {
		t.Errorf("the coordination Redis holds %d cache keys", n)
	}
	if up := metric(`llmgate_store_up{store="cache"}`); up != 1 {
		t.Errorf(`llmgate_store_up{store="cache"} = %v, want 1`, up)
	}

	cacheRedis.Stop()
	// New prompts: "cache me" would follow its finished flight, kept for
	// dedup.retain, without going upstream.
	for i, prompt := range []string{"another question", "a third question"} {
		if got := ask(prompt); got != "miss" {
			t.Fatalf("with the cache store down, request %d: x-llmgate-cache %q, want miss", i, got)
		}
	}
	if s.Count() != 3 {
		t.Errorf("%d upstream calls, want 3: both requests went upstream", s.Count())
	}
	if n := metric(`llmgate_store_errors_total{component="cache",store="cache"}`); n < 1 {
		t.Errorf(`llmgate_store_errors_total{component="cache",store="cache"} = %v, want at least 1`, n)
	}
	if up := metric(`llmgate_store_up{store="cache"}`); up != 0 {
		t.Errorf(`llmgate_store_up{store="cache"} = %v with the cache store down, want 0`, up)
	}
	if up := metric(`llmgate_store_up{store="coordination"}`); up != 1 {
		t.Errorf(`llmgate_store_up{store="coordination"} = %v, want 1`, up)
	}
	var ready struct{ Status, Cache string }
	if err := r.Get(ctx, "/readyz", "", &ready); err != nil || ready.Status != "ready" || ready.Cache != "off" {
		t.Errorf("/readyz with the cache store down: %+v %v; want ready, cache off", ready, err)
	}
	if out := r.Stderr.String(); !strings.Contains(out, "cache lookup failed") {
		t.Errorf("the failed lookup was not logged:\n%s", out)
	}
}

package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
	rlredis "github.com/llmgate/llmgate/ratelimit/redis"
)

// TestAdmissionsMetric: /metrics counts the limiter's admissions by path,
// local (from a block) and store, and they add up to the requests sent.
func TestAdmissionsMetric(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, _ *harness) {
		// A long window: blocks start whatever the machine's speed.
		o.Limiter = ratelimit.New(rlmemory.New(clock.Real{}), ratelimit.WithLocalQuota(ratelimit.LocalQuota{Window: time.Minute}))
	}})
	client := h.client(tenantKey)
	const n = 20
	for i := range n {
		if _, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model:    "gpt-4.1",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("q%d", i))},
		}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var local, store float64
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, `llmgate_rate_limit_admissions_total{path="local"} `); ok {
			_, _ = fmt.Sscan(v, &local)
		}
		if v, ok := strings.CutPrefix(line, `llmgate_rate_limit_admissions_total{path="store"} `); ok {
			_, _ = fmt.Sscan(v, &store)
		}
	}
	if local+store != n || local == 0 || store == 0 {
		t.Fatalf("admissions local %v + store %v, want %d with some of each:\n%s", local, store, n, b)
	}
}

// metricValue returns the value of series in h's /metrics, or -1.
func metricValue(t *testing.T, h *harness, series string) float64 {
	t.Helper()
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// TestStoreHealthMetrics: with the rate-limit store on a real Redis that
// goes away, /metrics says the store is down, counts the failed store
// calls and the requests admitted without a limit check (fail open), and
// says it is up again once Redis is back.
func TestStoreHealthMetrics(t *testing.T) {
	rds := testutil.StartRedis(t)
	client := rds.Client(t)
	h := newHarness(t, harnessConfig{edit: func(o *Options, _ *harness) {
		o.Limiter = ratelimit.New(rlredis.New(client, rlredis.Config{}))
		o.Ready = func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }
	}})
	sdk := h.client(tenantKey)
	ask := func() {
		t.Helper()
		if _, err := sdk.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model:    "gpt-4.1",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
		}); err != nil {
			t.Fatal(err)
		}
	}
	ask()
	if up, open := metricValue(t, h, `llmgate_store_up{store="coordination"}`), metricValue(t, h, `llmgate_fail_open_total{check="ratelimit"}`); up != 1 || open != 0 {
		t.Fatalf("store up: llmgate_store_up %v, fail_open %v; want 1, 0", up, open)
	}

	rds.Stop()
	ask() // rate limits fail open by default
	if up := metricValue(t, h, `llmgate_store_up{store="coordination"}`); up != 0 {
		t.Errorf("store down: llmgate_store_up %v, want 0", up)
	}
	if open := metricValue(t, h, `llmgate_fail_open_total{check="ratelimit"}`); open < 1 {
		t.Errorf("store down: llmgate_fail_open_total{check=\"ratelimit\"} %v, want >= 1", open)
	}
	if errs := metricValue(t, h, `llmgate_store_errors_total{component="ratelimit",store="coordination"}`); errs < 1 {
		t.Errorf("store down: llmgate_store_errors_total{component=\"ratelimit\"} %v, want >= 1", errs)
	}

	if err := rds.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return metricValue(t, h, `llmgate_store_up{store="coordination"}`) == 1 })
}

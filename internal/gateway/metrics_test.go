package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
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

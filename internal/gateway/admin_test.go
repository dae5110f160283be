package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	budgetmemory "github.com/llmgate/llmgate/budget/memory"
	"github.com/llmgate/llmgate/clock"
)

// expireAfterUsage is a budget store whose clock steps past every hold's
// TTL right after each read of the usage rows: a dead replica's hold
// expires between the two reads of GET /admin/usage.
type expireAfterUsage struct {
	budget.Backend
	clk *clock.Fake
}

func (b *expireAfterUsage) Usage(ctx context.Context, key budget.Key) ([]budget.UsageRow, error) {
	rows, err := b.Backend.Usage(ctx, key)
	b.clk.Advance(2 * budget.DefaultTTL)
	return rows, err
}

// TestAdminUsageRowsCountWhatIsSpent: what the budget shows spent is in the
// usage rows of the same answer, also when a hold expires (and is charged)
// while the answer is put together.
func TestAdminUsageRowsCountWhatIsSpent(t *testing.T) {
	clk := clock.NewFake(time.Now()) // the admin API reads the window of the real time
	bb, err := budgetmemory.Open(budgetmemory.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	bm, err := budget.New(&expireAfterUsage{Backend: bb, clk: clk}, budget.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	b := budget.Budget{Tenant: "team-a", Period: budget.Month, Tokens: 1_000_000}
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		o.Budgets, h.budgets = bm, bm
		h.teamA.Budget = &b
	}})
	// The hold of a replica that died: nobody settles it.
	if _, err := bm.Reserve(t.Context(), b, "", "gpt-4.1", budget.Usage{PromptTokens: 100}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		req, _ := http.NewRequest("GET", h.url+"/admin/usage?tenant=team-a", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out []tenantUsage
		if err := json.Unmarshal(body, &out); err != nil || len(out) != 1 || out[0].Budget == nil {
			t.Fatalf("answer %d: %d %s", i, resp.StatusCode, body)
		}
		var tokens, expired int64
		for _, r := range out[0].Rows {
			tokens += r.PromptTokens + r.CompletionTokens
			expired += r.Expired
		}
		if spent := out[0].Budget.SpentTokens; tokens < spent {
			t.Fatalf("answer %d: the budget shows %d tokens spent, the rows count %d: %s", i, spent, tokens, body)
		}
		if i == 1 && (out[0].Budget.Reserved != 0 || expired != 1 || tokens != 100) {
			t.Fatalf("answer %d: the expired hold is not charged and counted: %s", i, body)
		}
	}
}

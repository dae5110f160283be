package app

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestE2EBudgetUsedUnderOverDemand: a 2,500-token budget under three times
// the demand it allows, through three replicas on one Redis, with requests
// that do not set max_tokens (so each reserves an estimate, not a bound).
// Requests that do not fit while others are in flight wait, in one line
// across the replicas, for them to settle instead of being refused, and
// every replica reserves with the completion estimate learned in the store
// from all their answers, so at least 90% of the budget is used, and the
// spend is never above it, although every request is sent at once and
// never retried (insufficient_quota says not to). What is left unused is
// less than one estimate (prompt + learned completion): the first waiter
// that cannot fit once nothing is in flight is refused, and so is
// everyone behind it.
func TestE2EBudgetUsedUnderOverDemand(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		budgetTokens = 2500
		// 180 requests at once, each about 45 tokens: three times what
		// the budget allows. Each client sends one.
		perReplica = 60
		perClient  = 1
	)
	rds := testutil.StartRedis(t)
	// Slow enough tokens that requests overlap and hold estimates at once.
	s := newE2ESim(t, sim.Config{Models: []string{"gpt-4.1"}, TokenDelay: 2 * time.Millisecond, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{
		Store: rds.URL(), SimURL: s.url, LogLevel: "info",
		Budget: fmt.Sprintf("{period: day, tokens: %d}", budgetTokens),
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	stopObs := e2eutil.ObserveSpend(ctx, reps, "team-a")

	var answered, refused, served atomic.Int64
	errs := make(chan error, len(reps)*perReplica)
	var wg sync.WaitGroup
	for ri, r := range reps {
		c := r.SDK(e2eutil.TenantKey)
		for k := range perReplica {
			wg.Go(func() {
				for n := range perClient {
					resp, err := c.Chat.Completions.New(ctx, chatParams(fmt.Sprintf("over-demand %d/%d/%d", ri, k, n), 0))
					if err == nil {
						answered.Add(1)
						served.Add(resp.Usage.TotalTokens)
						continue
					}
					if e := sdkError(err); e == nil || e.StatusCode != http.StatusTooManyRequests || e.Code != "insufficient_quota" {
						errs <- fmt.Errorf("%s: %w", r.Name, err)
						return
					}
					// x-should-retry: false; a client gives up.
					refused.Add(1)
					return
				}
			})
		}
	}
	wg.Wait()
	maxSeen, _ := stopObs()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	spent, holds := e2eutil.WaitSettled(t, ctx, reps[0], "team-a")
	total := int64(len(reps) * perReplica * perClient)
	t.Logf("%d of %d requests answered (%d tokens), %d refused; spent %d of %d tokens (%.1f%%), highest sample %d",
		answered.Load(), total, served.Load(), refused.Load(), spent, budgetTokens, 100*float64(spent)/budgetTokens, maxSeen)
	if refused.Load() == 0 {
		t.Fatalf("no request was refused: the demand (%d tokens served) was not above the budget", served.Load())
	}
	if spent > budgetTokens || maxSeen > budgetTokens {
		t.Errorf("spent %d (highest sample %d) of a %d-token budget", spent, maxSeen, budgetTokens)
	}
	if spent < budgetTokens*9/10 {
		t.Errorf("spent %d of %d tokens: less than 90%% of the budget used under over-demand", spent, budgetTokens)
	}
	if holds != 0 {
		t.Errorf("%d reservations still live", holds)
	}
	if spent != served.Load() {
		t.Errorf("the clients were served %d tokens, the budget charged %d", served.Load(), spent)
	}
}

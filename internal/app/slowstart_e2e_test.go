package app

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestE2EColdBurstOverConfiguredLimit: the provider's key really allows 120
// requests per minute and says so in its x-ratelimit-* headers; the three
// replicas are configured with 600. A cold burst of 300 requests through
// them reaches the provider only as fast as slow start lets it until the
// provider's first answers report the real limit, which every replica then
// keeps to: at most 5 requests are answered 429 by the provider, where
// without slow start 180 were. The requests beyond the real quota wait and
// get the gateway's own 429 after their max wait: 30s, so that a loaded
// machine, where 300 requests under the race detector take seconds to go
// through three cold replicas, still serves the whole quota within it.
func TestE2EColdBurstOverConfiguredLimit(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		realRPM    = 120
		perReplica = 100
	)
	rds := testutil.StartRedis(t)
	s := newE2ESim(t, sim.Config{Models: []string{"gpt-4.1"}, RPM: realRPM, TTFT: 20 * time.Millisecond, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{
		Store: rds.URL(), SimURL: s.url, Limits: fmt.Sprintf("{rpm: %d}", 5*realRPM), MaxWait: "30s", LogLevel: "info",
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	statuses := make(chan int, len(reps)*perReplica)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, r := range reps {
		for k := range perReplica {
			wg.Go(func() {
				<-start
				resp, _, err := r.TryPost(ctx, "/v1/chat/completions", e2eutil.TenantKey,
					fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":3,"messages":[{"role":"user","content":"burst %s %d"}]}`, r.Name, k))
				if err != nil {
					t.Errorf("%s: %v", r.Name, err)
					return
				}
				statuses <- resp.StatusCode
			})
		}
	}
	close(start)
	wg.Wait()
	close(statuses)
	byStatus := map[int]int{}
	for st := range statuses {
		byStatus[st]++
	}
	st := s.Stats().Total
	t.Logf("clients got %v; the provider had %d calls, answered %d of them 429", byStatus, st.Calls, st.RateLimited)
	if st.RateLimited > 5 {
		t.Errorf("the provider answered %d requests 429; want at most 5", st.RateLimited)
	}
	// The quota is used: nearly all of the provider's 120 went to clients.
	if ok := byStatus[http.StatusOK]; ok < realRPM*9/10 {
		t.Errorf("%d requests served, want at least %d of the provider's %d per minute", ok, realRPM*9/10, realRPM)
	}
	if n := byStatus[http.StatusOK] + byStatus[http.StatusTooManyRequests]; n != len(reps)*perReplica {
		t.Errorf("statuses %v: want only 200s and the gateway's 429s", byStatus)
	}
}

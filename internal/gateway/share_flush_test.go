package gateway

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/dedup"
	dedupmemory "github.com/llmgate/llmgate/dedup/memory"
)

// stallingFinish is a dedup backend whose Finish waits until release is
// closed: a store that is slow to record the end of a flight.
type stallingFinish struct {
	dedup.Backend
	release chan struct{}
}

func (s *stallingFinish) Finish(ctx context.Context, key string, gen uint64, retain time.Duration) error {
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Backend.Finish(ctx, key, gen, retain)
}

// TestLeaderAnswerNotHeldByFinish: a leader's client has its whole answer
// before the store has recorded the end of the flight, however long that
// takes.
func TestLeaderAnswerNotHeldByFinish(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		o.Dedup.Group = dedup.New(&stallingFinish{Backend: dedupmemory.New(clock.Real{}), release: release}, dedup.Options{LeaseTTL: time.Second})
	}})
	defer close(release)
	type answer struct {
		status int
		role   string
		body   []byte
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		resp := h.post("/v1/chat/completions", tenantKey, `{"model":"gpt-4.1","temperature":0,"messages":[{"role":"user","content":"flush me"}]}`)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- answer{resp.StatusCode, resp.Header.Get("X-Llmgate-Dedup"), b, err}
	}()
	select {
	case a := <-got:
		if a.err != nil || a.status != http.StatusOK || a.role != "leader" || len(a.body) == 0 {
			t.Fatalf("%d %q %v %s", a.status, a.role, a.err, a.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the leader's client did not get its answer while the store was finishing the flight")
	}
}

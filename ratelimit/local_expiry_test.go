package ratelimit_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/memory"
)

// deadBackend stands for a store this replica can no longer reach
// because the replica died: once dead, every call fails.
type deadBackend struct {
	ratelimit.Backend
	dead atomic.Bool
}

var errGone = ratelimit.ErrStoreUnavailable

func (d *deadBackend) Admit(ctx context.Context, r *ratelimit.Request) (ratelimit.Decision, error) {
	if d.dead.Load() {
		return ratelimit.Decision{}, errGone
	}
	return d.Backend.Admit(ctx, r)
}

func (d *deadBackend) Settle(ctx context.Context, id string, actual []int64) error {
	if d.dead.Load() {
		return errGone
	}
	return d.Backend.Settle(ctx, id, actual)
}

func (d *deadBackend) Extend(ctx context.Context, id string, hold time.Duration, used []int64) error {
	if d.dead.Load() {
		return errGone
	}
	return d.Backend.Extend(ctx, id, hold, used)
}

// TestLocalQuotaBlockExpiresAtUsage: a replica admits a stream from a
// local block, extends it with its usage so far, and dies. When the
// block's reservation expires in the store, it is settled at what the
// block's requests used as of that Extend: the stream's usage, and nothing
// of the part of the block never handed out.
func TestLocalQuotaBlockExpiresAtUsage(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	mem := memory.New(clk)
	b := &deadBackend{Backend: mem}
	l := ratelimit.New(b, ratelimit.WithLocalQuota(ratelimit.LocalQuota{}), ratelimit.WithClock(clk))
	other := ratelimit.New(mem) // another replica, alive
	const requests, tokens, est = 100_000, 1_000_000, 100
	req := gatewayLike(requests, tokens, est)
	for i := range req.Charges {
		req.Charges[i].Limit.Window = 100_000 * time.Hour // a unit of refill takes longer than the test's clock moves
	}

	// Requests go to the store until the demand calls for a block.
	var stored []ratelimit.Decision
	var stream ratelimit.Decision
	for {
		d, err := l.Allow(ctx, req)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		if strings.HasPrefix(d.ID, "local-") {
			stream = d
			break
		}
		stored = append(stored, d)
		if err := l.Settle(ctx, d.ID, []int64{1, 5, 1}); err != nil {
			t.Fatal(err)
		}
		if len(stored) > 10 {
			t.Fatal("no block after 10 requests")
		}
	}
	atDeath := probe(t, other, req, "probe-before-death")
	if err := l.Extend(ctx, stream.ID, time.Minute, 1, 30, 1); err != nil {
		t.Fatalf("Extend with usage: %v", err)
	}
	b.dead.Store(true)
	clk.Advance(2 * time.Minute) // past the hold and the block's return margin

	wantTokens := tokens - 5*int64(len(stored)) - 30
	wantRequests := requests - int64(len(stored)) - 1
	got := probe(t, other, req, "probe-after-expiry")
	if got[0] != wantRequests || got[1] != wantTokens || got[2] != wantRequests {
		t.Fatalf("after the dead replica's block expired: %v left (%v before it died), want %d requests and %d tokens (%d settled at 5, the stream at 30, the unused part of the block back)",
			got, atDeath, wantRequests, wantTokens, len(stored))
	}
}

//go:build unix

package e2eutil

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// UsageOf reads a tenant's budget state from r's GET /admin/usage: what it
// spent and how many reservations are live.
func UsageOf(ctx context.Context, r *Replica, tenant string) (spent int64, holds int, err error) {
	var out []struct {
		Tenant string `json:"tenant"`
		Budget *struct {
			SpentTokens int64 `json:"spent_tokens"`
			CapTokens   int64 `json:"cap_tokens"`
			Reserved    int   `json:"live_reservations"`
		} `json:"budget"`
	}
	if err := r.Get(ctx, "/admin/usage?tenant="+tenant, AdminToken, &out); err != nil {
		return 0, 0, err
	}
	if len(out) != 1 || out[0].Budget == nil {
		return 0, 0, fmt.Errorf("admin usage of %s has no budget: %+v", tenant, out)
	}
	return out[0].Budget.SpentTokens, out[0].Budget.Reserved, nil
}

// WaitSettled polls the admin API until tenant has no live reservation,
// or 15s pass, and returns what it spent.
func WaitSettled(t testing.TB, ctx context.Context, r *Replica, tenant string) (spent int64, holds int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		spent, holds, err := UsageOf(ctx, r, tenant)
		if err != nil {
			t.Fatal(err)
		}
		if holds == 0 || time.Now().After(deadline) {
			return spent, holds
		}
		time.Sleep(20 * time.Millisecond) // polling the admin API: nothing to wait on
	}
}

// ObserveSpend samples tenant's spend on every replica in turn, every
// 20ms, until the returned func is called; that returns the highest spend
// seen and the number of samples.
func ObserveSpend(ctx context.Context, reps []*Replica, tenant string) (stop func() (highest int64, samples int)) {
	stopc, done := make(chan struct{}), make(chan struct{})
	var highest int64
	var samples int
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			if spent, _, err := UsageOf(ctx, reps[i%len(reps)], tenant); err == nil {
				highest = max(highest, spent)
				samples++
			}
			select {
			case <-stopc:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (int64, int) {
		close(stopc)
		<-done
		return highest, samples
	}
}

package redis

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/testutil"
)

func settleReq(key budget.Key, id string, tokens int64) budget.SettleRequest {
	return budget.SettleRequest{
		Key: key, ID: id,
		Record:   budget.Record{Model: "m", Deployment: "d", Usage: budget.Usage{PromptTokens: tokens}, MicroUSD: 2 * tokens},
		Remember: time.Hour, Keep: time.Now().Add(time.Hour),
	}
}

// TestSettlesQueuedBehindACallGoTogether: settles of one window that
// arrive while one is in flight go in the next call, all of them, each
// with its own result; a repeated ID in the batch is charged once; and the
// first caller giving up does not fail the others it carries.
func TestSettlesQueuedBehindACallGoTogether(t *testing.T) {
	b := New(testutil.StartRedis(t).Client(t), Config{})
	key := budget.Key{Tenant: "acme", WindowID: "2026-11"}

	var (
		mu      sync.Mutex
		batches []int
		queued  sync.WaitGroup
	)
	held, release := make(chan struct{}), make(chan struct{})
	b.beforeBatch = func(batch []*settleCall) {
		mu.Lock()
		batches = append(batches, len(batch))
		first := len(batches) == 1
		mu.Unlock()
		if first {
			close(held)
			<-release // hold the first call until the others queued behind it
		}
	}
	b.onQueued = func() { queued.Done() }

	firstCtx, cancelFirst := context.WithCancel(t.Context())
	firstDone := make(chan error, 1)
	go func() {
		_, err := b.Settle(firstCtx, settleReq(key, "first", 1))
		firstDone <- err
	}()
	select {
	case <-held:
	case err := <-firstDone:
		t.Fatalf("first settle returned before its call was sent: %v", err)
	}

	const n = 50
	queued.Add(n + 1)
	results := make([]budget.SettleResult, n+1)
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := range n + 1 {
		id := "r" + strconv.Itoa(i)
		if i == n {
			id = "r0" // a repeat: charged once
		}
		wg.Go(func() { results[i], errs[i] = b.Settle(t.Context(), settleReq(key, id, 10)) })
	}
	queued.Wait()
	cancelFirst() // the first caller leaves; the batches it sends still run
	close(release)
	if err := <-firstDone; err != nil && err != context.Canceled {
		t.Fatalf("first settle: %v", err)
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(batches) != 2 || batches[0] != 1 || batches[1] != n+1 {
		t.Fatalf("batches %v, want [1 %d]", batches, n+1)
	}
	applied := 0
	for i := range n + 1 {
		if errs[i] != nil {
			t.Fatalf("settle %d: %v", i, errs[i])
		}
		if results[i].Applied {
			applied++
		}
	}
	if applied != n {
		t.Errorf("%d applied, want %d (r0 twice counts once)", applied, n)
	}
	tot, err := b.Totals(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if want := (budget.Amount{Tokens: 1 + 10*n, MicroUSD: 2 + 20*n}); tot.Spent != want {
		t.Errorf("spent %+v, want %+v", tot.Spent, want)
	}
	rows, err := b.Usage(t.Context(), key)
	if err != nil || len(rows) != 1 || rows[0].Requests != n+1 {
		t.Errorf("usage rows %+v, %v; want one row of %d requests", rows, err, n+1)
	}
}

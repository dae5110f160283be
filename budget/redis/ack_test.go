package redis_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/budget/redis"
	"github.com/llmgate/llmgate/internal/testutil"
)

var ackPrices = budget.PriceTable{"m": {InputPerMTok: 1}}

func ackManager(t testing.TB, c rueidis.Client, cfg redis.Config) *budget.Manager {
	m, err := budget.New(redis.New(c, cfg), budget.Config{Prices: ackPrices})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func reserveSettle(ctx context.Context, m *budget.Manager, b budget.Budget) error {
	res, err := m.Reserve(ctx, b, "", "m", budget.Usage{PromptTokens: 10})
	if err != nil {
		return err
	}
	_, err = m.Settle(ctx, res, budget.Record{Tenant: b.Tenant, Model: "m", Usage: budget.Usage{PromptTokens: 10}, Requests: 1})
	return err
}

// TestAckReplicasSentinel: with AckReplicas 2, writes succeed while both
// replicas answer; with the replicas paused a reserve fails closed with
// ErrNotReplicated and leaves no hold behind; resumed, writes succeed again.
func TestAckReplicasSentinel(t *testing.T) {
	s := testutil.SharedSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	m := ackManager(t, s.Client(t), redis.Config{AckReplicas: 2, AckTimeout: 300 * time.Millisecond})
	b := budget.Budget{Tenant: "ack-" + strconv.FormatInt(time.Now().UnixNano(), 36), Period: budget.Month, Tokens: 1 << 40}
	for range 5 {
		if err := reserveSettle(ctx, m, b); err != nil {
			t.Fatalf("acknowledged write: %v", err)
		}
	}
	master, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var reps []*testutil.Redis
	for _, r := range s.Data {
		if r != master {
			reps = append(reps, r)
		}
	}
	for _, r := range reps {
		if err := r.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	_, err = m.Reserve(ctx, b, "", "m", budget.Usage{PromptTokens: 10})
	for _, r := range reps {
		if err := r.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	if !errors.Is(err, redis.ErrNotReplicated) || !errors.Is(err, budget.ErrStoreUnavailable) {
		t.Fatalf("reserve with the replicas paused: %v, want ErrNotReplicated and ErrStoreUnavailable", err)
	}
	st, err := m.Spend(ctx, b, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.Spent.Tokens != 50 || st.Holds != 0 {
		t.Errorf("spend %d tokens with %d holds, want 50 and no hold: the refused reserve must be undone", st.Spent.Tokens, st.Holds)
	}
	if err := reserveSettle(ctx, m, b); err != nil {
		t.Fatalf("write after the replicas resumed: %v", err)
	}
	if err := s.WaitStable(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAckReplicasCluster: WAIT goes to the node of the budget's slot: with
// one master's replica paused, budgets on that master fail closed and
// budgets on the others do not.
func TestAckReplicasCluster(t *testing.T) {
	c := testutil.SharedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	m := ackManager(t, c.Client(t), redis.Config{AckReplicas: 1, AckTimeout: 300 * time.Millisecond})
	slots, err := c.Slots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	target, rep := slots[0].Master, slots[0].Replicas[0]
	w, err := budget.Budget{Tenant: "x", Period: budget.Month, Tokens: 1}.Window(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var on, off []budget.Budget // budgets on target, and elsewhere
	for i := 0; len(on) < 3 || len(off) < 3; i++ {
		tenant := "ack-" + run + "-" + strconv.Itoa(i)
		mm, err := c.MasterOf(ctx, "{"+tenant+":"+w.ID+"}")
		if err != nil {
			t.Fatal(err)
		}
		b := budget.Budget{Tenant: tenant, Period: budget.Month, Tokens: 1 << 40}
		if mm == target {
			on = append(on, b)
		} else {
			off = append(off, b)
		}
	}
	for _, b := range append(on, off...) {
		if err := reserveSettle(ctx, m, b); err != nil {
			t.Fatalf("acknowledged write: %v", err)
		}
	}
	if err := rep.Pause(); err != nil {
		t.Fatal(err)
	}
	var onErrs, offErrs []error
	for _, b := range on {
		onErrs = append(onErrs, reserveSettle(ctx, m, b))
	}
	for _, b := range off {
		offErrs = append(offErrs, reserveSettle(ctx, m, b))
	}
	if err := rep.Resume(); err != nil {
		t.Fatal(err)
	}
	for i, err := range onErrs {
		if !errors.Is(err, redis.ErrNotReplicated) {
			t.Errorf("budget %d on the master whose replica is paused: %v, want ErrNotReplicated", i, err)
		}
	}
	for i, err := range offErrs {
		if err != nil {
			t.Errorf("budget %d on another master: %v", i, err)
		}
	}
	if err := c.WaitStable(ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkReserveSettleSentinel: one reserve and one settle, one after the
// other, through the Sentinel client, without and with waiting for both
// replicas.
func BenchmarkReserveSettleSentinel(b *testing.B) {
	s := testutil.SharedSentinel(b)
	for _, ack := range []int{0, 2} {
		b.Run("ack="+strconv.Itoa(ack), func(b *testing.B) {
			m := ackManager(b, s.Client(b), redis.Config{AckReplicas: ack})
			bud := budget.Budget{Tenant: "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36), Period: budget.Month, Tokens: 1 << 50}
			for b.Loop() {
				if err := reserveSettle(b.Context(), m, bud); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

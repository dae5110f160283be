package memory

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/ratelimit"
)

// TestSettledMarksLeaveWithTheHold: a settled reservation leaves the
// reservation map and expiry heap at once, its mark (a second Settle is a
// no-op) stays until its hold ends, and then nothing of it is left.
func TestSettledMarksLeaveWithTheHold(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	b := New(clk)
	l := ratelimit.New(b)
	lim := ratelimit.Limit{Kind: ratelimit.Concurrency, Limit: 1000}
	var ids []string
	for i := range 100 {
		d, err := l.Allow(t.Context(), ratelimit.Request{
			Charges: []ratelimit.Charge{{Scope: "s", Limit: lim, Cost: 1}},
			Hold:    time.Duration(10+i%3) * time.Second,
		})
		if err != nil || !d.Allowed {
			t.Fatalf("Allow %d = %+v, %v", i, d, err)
		}
		ids = append(ids, d.ID)
	}
	for _, id := range ids[:60] {
		if err := l.Settle(t.Context(), id, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids[:60] {
		if err := l.Settle(t.Context(), id, nil); err != nil {
			t.Fatalf("second Settle of %s within the hold = %v, want a no-op", id, err)
		}
	}
	b.mu.Lock()
	got := fmt.Sprint(len(b.reservations), len(b.expiries), len(b.settled), len(b.settledExps))
	b.mu.Unlock()
	if got != "40 40 60 60" {
		t.Fatalf("reservations, expiries, settled marks, their heap = %s; want 40 40 60 60", got)
	}
	if err := l.Extend(t.Context(), ids[0], time.Minute); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Errorf("Extend of a settled reservation = %v, want ErrUnknownReservation", err)
	}
	clk.Advance(13 * time.Second)
	if _, err := l.Allow(t.Context(), ratelimit.Request{Charges: []ratelimit.Charge{{Scope: "s", Limit: lim, Cost: 1}}}); err != nil {
		t.Fatal(err) // any decision sweeps what expired
	}
	b.mu.Lock()
	got = fmt.Sprint(len(b.reservations), len(b.expiries), len(b.settled), len(b.settledExps))
	b.mu.Unlock()
	if got != "1 1 0 0" {
		t.Fatalf("after the holds: %s; want 1 1 0 0 (the new reservation only)", got)
	}
	for _, id := range []string{ids[0], ids[99]} {
		if err := l.Settle(t.Context(), id, nil); !errors.Is(err, ratelimit.ErrUnknownReservation) {
			t.Errorf("Settle of %s after its hold = %v, want ErrUnknownReservation", id, err)
		}
	}
}

package testutil

import (
	"context"
	"slices"
	"testing"
	"time"
)

// RoundTrip returns the median time of a PING to r over one connection
// (of 11, after one to connect): the unit in which tests on a busy machine
// state how late something may happen.
func (r *Redis) RoundTrip(tb testing.TB) time.Duration {
	tb.Helper()
	c := r.Client(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ping := func() time.Duration {
		start := time.Now()
		if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
			tb.Fatalf("PING %s: %v", r.Addr, err)
		}
		return time.Since(start)
	}
	ping()
	rtts := make([]time.Duration, 11)
	for i := range rtts {
		rtts[i] = ping()
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2]
}

// LateBound is how late a test may see something happen on r that should
// happen at once: n round trips (RoundTrip), but never less than floor,
// which is what the scheduling stalls of a busy 2-core machine under -race
// must not reach.
func (r *Redis) LateBound(tb testing.TB, n int, floor time.Duration) time.Duration {
	tb.Helper()
	rtt := r.RoundTrip(tb)
	late := max(floor, time.Duration(n)*rtt)
	tb.Logf("redis round trip %v: allowing %v", rtt, late)
	return late
}

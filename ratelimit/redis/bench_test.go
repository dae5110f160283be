package redis_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/redis"
)

// Figures and the commands that produce them are in BENCHMARKS.md; the
// `llmgate bench ratelimit` command measures the same decisions with
// latency percentiles, round trips and a GCRA baseline on top.

// BenchmarkPing is the unit for the others: one PING round trip on the same
// kind of client.
func BenchmarkPing(b *testing.B) { testutil.BenchPing(b) }

// threeLimits is a gateway request's admission: the deployment's RPM and
// TPM and the tenant's RPM, all high enough that every decision admits
// (refusals are cheaper: they write nothing).
func threeLimits() ratelimit.Request {
	return ratelimit.Request{Charges: []ratelimit.Charge{
		{Scope: "deployment:key1/gpt-4.1", Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: 1 << 40, Window: time.Minute}},
		{Scope: "deployment:key1/gpt-4.1", Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 1 << 45, Window: time.Minute}, Cost: 1500},
		{Scope: "tenant:team-a", Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: 1 << 40, Window: time.Minute}},
	}}
}

// BenchmarkAllow3Limits is one admission over three limits: from one
// goroutine (the latency of a decision, in PINGs) and from 16 sharing one
// client (throughput, as a busy gateway replica would see it).
func BenchmarkAllow3Limits(b *testing.B) {
	r := testutil.StartRedis(b)
	l := ratelimit.New(redis.New(r.Client(b), redis.Config{}))
	ctx := context.Background()
	req := threeLimits()
	if d, err := l.Allow(ctx, req); err != nil || d.Degraded { // loads the script
		b.Fatalf("Allow = %+v, %v", d, err)
	}
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			d, err := l.Allow(ctx, req)
			if err != nil || !d.Allowed || d.Degraded {
				b.Fatalf("Allow = %+v, %v", d, err)
			}
		}
	})
	b.Run("parallel16", func(b *testing.B) {
		b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				d, err := l.Allow(ctx, req)
				if err != nil || !d.Allowed || d.Degraded {
					b.Errorf("Allow = %+v, %v", d, err)
					return
				}
			}
		})
	})
}

// BenchmarkAllowSettle3Limits is a request's whole store traffic: the
// admission and its Settle, two round trips.
func BenchmarkAllowSettle3Limits(b *testing.B) {
	r := testutil.StartRedis(b)
	l := ratelimit.New(redis.New(r.Client(b), redis.Config{}))
	ctx := context.Background()
	req := threeLimits()
	actual := []int64{1, 900, 1}
	for b.Loop() {
		d, err := l.Allow(ctx, req)
		if err != nil || !d.Allowed || d.Degraded {
			b.Fatalf("Allow = %+v, %v", d, err)
		}
		if err := l.Settle(ctx, d.ID, actual); err != nil {
			b.Fatal(err)
		}
	}
}

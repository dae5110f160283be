package redis_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

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

// BenchmarkSharded is the cost of spanning groups (ratelimit.Sharded): a
// gateway request's three limits in one group (a tenant without limits of
// its own: the deployment's RPM and TPM, and a third deployment limit in
// its place) against the same three over two groups (the tenant's RPM in
// the tenant's group), one Redis. Serial: the latency of a decision, and
// of a decision and its settle; parallel16: throughput. scripts/op counts
// the scripts the server ran per operation.
func BenchmarkSharded(b *testing.B) {
	r := testutil.StartRedis(b)
	c := r.Client(b) // one client for every group, as the gateway has
	sh := ratelimit.NewSharded(gatewayGroup, func(g string) ratelimit.Backend { return redis.New(c, redis.Config{Group: g}) })
	l := ratelimit.New(sh)
	ctx := context.Background()
	one := threeLimits()
	one.Charges[2].Scope = "deployment:key1/gpt-4.1#slow"
	for _, tc := range []struct {
		name string
		req  ratelimit.Request
	}{{"one-group", one}, {"two-groups", threeLimits()}} {
		if d, err := l.Allow(ctx, tc.req); err != nil || !d.Allowed { // loads the script
			b.Fatalf("Allow = %+v, %v", d, err)
		}
		b.Run(tc.name+"/serial", func(b *testing.B) {
			defer scriptsPerOp(b, r)()
			for b.Loop() {
				d, err := l.Allow(ctx, tc.req)
				if err != nil || !d.Allowed {
					b.Fatalf("Allow = %+v, %v", d, err)
				}
			}
		})
		b.Run(tc.name+"/serial-settle", func(b *testing.B) {
			defer scriptsPerOp(b, r)()
			actual := []int64{1, 900, 1}
			for b.Loop() {
				d, err := l.Allow(ctx, tc.req)
				if err != nil || !d.Allowed {
					b.Fatalf("Allow = %+v, %v", d, err)
				}
				if err := l.Settle(ctx, d.ID, actual); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/parallel16", func(b *testing.B) {
			defer scriptsPerOp(b, r)()
			b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if d, err := l.Allow(ctx, tc.req); err != nil || !d.Allowed {
						b.Errorf("Allow = %+v, %v", d, err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkShardedRTT is BenchmarkSharded's serial decisions over a link
// of 1 ms round trip (a delay proxy), in PINGs over the same link: a
// request over two groups still takes one round trip of wall time, its
// parts being sent at once.
func BenchmarkShardedRTT(b *testing.B) {
	r := testutil.StartRedis(b)
	p := testutil.StartDelayProxy(b, r.Addr, time.Millisecond)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{p.Addr}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	l := ratelimit.New(ratelimit.NewSharded(gatewayGroup, func(g string) ratelimit.Backend { return redis.New(c, redis.Config{Group: g}) }))
	ctx := context.Background()
	var ping float64 // ns a PING took
	b.Run("ping", func(b *testing.B) {
		for b.Loop() {
			if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
				b.Fatal(err)
			}
		}
		ping = float64(b.Elapsed()) / float64(b.N)
	})
	one := threeLimits()
	one.Charges[2].Scope = "deployment:key1/gpt-4.1#slow"
	for _, tc := range []struct {
		name string
		req  ratelimit.Request
	}{{"one-group", one}, {"two-groups", threeLimits()}} {
		if _, err := l.Allow(ctx, tc.req); err != nil { // loads the script
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if d, err := l.Allow(ctx, tc.req); err != nil || !d.Allowed {
					b.Fatalf("Allow = %+v, %v", d, err)
				}
			}
			if ping > 0 {
				b.ReportMetric(float64(b.Elapsed())/float64(b.N)/ping, "pings/op")
			}
		})
	}
}

// gatewayGroup groups scopes as the gateway does: a deployment's
// ("deployment:X", "deployment:X#...") in one group, a tenant's in another.
func gatewayGroup(scope string) string {
	g, _, _ := strings.Cut(scope, "#")
	return g
}

// scriptsPerOp reads the scripts r ran, and returns a func that reports
// those run since per operation of b.
func scriptsPerOp(b *testing.B, r *testutil.Redis) func() {
	start := scripts(b, r)
	return func() { b.ReportMetric(float64(scripts(b, r)-start)/float64(b.N), "scripts/op") }
}

func scripts(b *testing.B, r *testutil.Redis) int64 {
	res, err := r.Command(context.Background(), "INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	info, err := res.ToString()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			calls, _, _ := strings.Cut(rest, ",")
			n, _ = strconv.ParseInt(calls, 10, 64)
		}
	}
	return n
}

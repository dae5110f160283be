package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/memory"
)

// A request checked against a deployment's RPM and TPM and its tenant's
// RPM at once, then settled with the tokens the provider really used.
func ExampleLimiter_Allow() {
	ctx := context.Background()
	l := ratelimit.New(memory.New(nil))
	rpm := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 500, Window: time.Minute}
	tpm := ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 10_000, Window: time.Minute}
	tenantRPM := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 2, Window: time.Minute}
	req := func() ratelimit.Request {
		return ratelimit.Request{Charges: []ratelimit.Charge{
			{Scope: "deployment:key1/gpt-4.1", Limit: rpm},
			{Scope: "deployment:key1/gpt-4.1", Limit: tpm, Cost: 4_000}, // prompt + max_tokens
			{Scope: "tenant:team-a", Limit: tenantRPM},
		}}
	}

	d, _ := l.Allow(ctx, req())
	fmt.Println("first:", d.Allowed, "tokens left:", d.Limits[1].Remaining)
	_ = l.Settle(ctx, d.ID, []int64{1, 1_500, 1}) // it used 1,500 tokens, not 4,000

	d, _ = l.Allow(ctx, req())
	fmt.Println("second:", d.Allowed)

	d, _ = l.Allow(ctx, req())
	fmt.Println("third:", d.Allowed, "denied by:", d.DeniedBy, "retry in about a minute:", d.RetryAfter > 29*time.Second)
	// Output:
	// first: true tokens left: 6000
	// second: true
	// third: false denied by: tenant:team-a retry in about a minute: true
}

// Wait queues instead of failing, up to the context's deadline.
func ExampleLimiter_Wait() {
	l := ratelimit.New(memory.New(nil))
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 1, Window: time.Hour}
	req := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: "deployment:slow", Limit: lim}}}

	d, err := l.Wait(context.Background(), req)
	fmt.Println("first:", d.Allowed, err)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = l.Wait(ctx, req)
	fmt.Println("second gave up:", errors.Is(err, ratelimit.ErrLimited), errors.Is(err, context.DeadlineExceeded))
	// Output:
	// first: true <nil>
	// second gave up: true true
}

// A Limiter with a local quota: far from its limits, most admissions come
// from blocks reserved in the store ahead of time, without a round trip (it
// pays with a remote store such as ratelimit/redis; memory is used here so
// that the example runs anywhere).
func ExampleWithLocalQuota() {
	ctx := context.Background()
	l := ratelimit.New(memory.New(nil), ratelimit.WithLocalQuota(ratelimit.LocalQuota{}))
	defer l.Close(ctx) // returns the unused part of the blocks
	rpm := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 10_000, Window: time.Minute}
	for range 20 {
		d, err := l.Allow(ctx, ratelimit.Request{Charges: []ratelimit.Charge{{Scope: "deployment:key1/gpt-4.1", Limit: rpm}}})
		if err != nil || !d.Allowed {
			fmt.Println(d, err)
			return
		}
		_ = l.Settle(ctx, d.ID, []int64{1})
	}
	st := l.Stats()
	fmt.Println("admitted:", st.Admitted, "some from blocks:", st.Local > 0)
	// Output: admitted: 20 some from blocks: true
}

// A provider that really allows 5 requests a minute, on a key configured
// for 1,000: its 429 said "Limit 5, Used 5". Once learned, every replica
// sharing the store holds the key to 5 a minute, starting from none left,
// so requests go out one every 12 seconds instead of as a burst.
func ExampleLimiter_Learn() {
	ctx := context.Background()
	l := ratelimit.New(memory.New(nil))
	rpm := ratelimit.Limit{Kind: ratelimit.Requests, Limit: 1_000, Window: time.Minute}
	req := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: "deployment:key1/gpt-4.1", Limit: rpm}}}

	_ = l.Learn(ctx, "deployment:key1/gpt-4.1", rpm, ratelimit.Learned{Limit: 5, Remaining: 0}) // all 5 used
	d, _ := l.Allow(ctx, req)
	fmt.Println("allowed:", d.Allowed, "retry in about 12s:", d.RetryAfter > 11*time.Second && d.RetryAfter <= 12*time.Second)
	// Output: allowed: false retry in about 12s: true
}

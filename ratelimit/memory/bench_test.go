package memory

import (
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/ratelimit"
)

// BenchmarkWaitSettle is one gateway admission on this backend: Wait for
// a request's four charges (requests and tokens per minute on a
// deployment and on a tenant, never limiting), then its Settle. Settled
// reservations stay until their hold ends (a second Settle is a no-op),
// so the expiry heap grows with b.N: compare runs of equal -benchtime.
func BenchmarkWaitSettle(b *testing.B) {
	l := ratelimit.New(New(clock.Real{}))
	big := int64(1) << 40
	req := ratelimit.Request{
		Charges: []ratelimit.Charge{
			{Scope: "deployment:sim/gpt-4.1-mini", Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: big, Window: time.Minute}, Cost: 1},
			{Scope: "deployment:sim/gpt-4.1-mini", Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: big, Window: time.Minute}, Cost: 300},
			{Scope: "tenant:bench", Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: big, Window: time.Minute}, Cost: 1},
			{Scope: "tenant:bench", Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: big, Window: time.Minute}, Cost: 300},
		},
		Hold:    2 * time.Minute,
		MaxWait: 30 * time.Second,
	}
	actual := []int64{1, 46, 1, 46}
	ctx := b.Context()
	b.ReportAllocs()
	for range b.N {
		d, err := l.Wait(ctx, req)
		if err != nil || !d.Allowed {
			b.Fatalf("Wait = %+v, %v", d, err)
		}
		if err := l.Settle(ctx, d.ID, actual); err != nil {
			b.Fatal(err)
		}
	}
}

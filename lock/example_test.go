package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/memory"
)

// Do holds the lock while the function runs, renews it in the background,
// and releases it afterwards. The function's context is cancelled if the lock
// is lost.
func ExampleLocker_Do() {
	l := lock.New(memory.New(nil))
	ctx := context.Background()

	err := l.Do(ctx, "nightly-report", lock.Options{TTL: 5 * time.Second}, func(ctx context.Context, lease *lock.Lease) error {
		fmt.Println("holding", lease.Key)
		// ... work; stop when ctx is cancelled ...
		return ctx.Err()
	})
	fmt.Println("done:", err)

	// Output:
	// holding nightly-report
	// done: <nil>
}

// TryAcquire never waits: while someone holds the lock it returns
// ErrNotObtained.
func ExampleLocker_TryAcquire() {
	l := lock.New(memory.New(nil))
	ctx := context.Background()

	first, err := l.TryAcquire(ctx, "session-42", lock.Options{})
	if err != nil {
		panic(err)
	}
	_, err = l.TryAcquire(ctx, "session-42", lock.Options{})
	fmt.Println("second:", err, errors.Is(err, lock.ErrNotObtained))

	if err := first.Release(ctx); err != nil {
		panic(err)
	}
	third, err := l.TryAcquire(ctx, "session-42", lock.Options{})
	fmt.Println("after release:", err)
	_ = third.Release(ctx)

	// Output:
	// second: lock: not obtained true
	// after release: <nil>
}

// Every acquisition carries a fencing token that is larger than any earlier
// one for the key; storage that checks it can refuse writes from a holder
// whose lease ran out.
func ExampleLease_fencing() {
	l := lock.New(memory.New(nil))
	ctx := context.Background()

	a, err := l.TryAcquire(ctx, "ledger", lock.Options{})
	if err != nil {
		panic(err)
	}
	if err := a.Release(ctx); err != nil {
		panic(err)
	}
	b, err := l.TryAcquire(ctx, "ledger", lock.Options{})
	if err != nil {
		panic(err)
	}
	defer b.Release(ctx)

	fmt.Println("fence increased:", b.Fence > a.Fence)

	// The store side keeps the highest fence it has seen and rejects older ones.
	highest := b.Fence
	accept := func(fence uint64) bool { return fence >= highest }
	fmt.Println("write with the old fence accepted:", accept(a.Fence))

	// Output:
	// fence increased: true
	// write with the old fence accepted: false
}

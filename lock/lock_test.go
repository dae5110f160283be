package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/memory"
)

// releaseFailer wraps a Backend whose Release fails with a transient error
// (the store was briefly unreachable), counting Extends.
type releaseFailer struct {
	lock.Backend
	extends atomic.Int32
}

var errUnreachable = errors.New("injected: store unreachable")

func (f *releaseFailer) Release(context.Context, string, string) error { return errUnreachable }

func (f *releaseFailer) Extend(ctx context.Context, key, token string, ttl time.Duration) (time.Time, error) {
	f.extends.Add(1)
	return f.Backend.Extend(ctx, key, token, ttl)
}

// TestDoReleaseFailureLetsLockExpire: when Do's final Release fails with a
// transient error, nobody will ever release the lock, so Do must at least
// stop renewing it: the lock then frees itself after its TTL. A watchdog that
// keeps running after Do has returned holds the lock for as long as the
// process lives.
func TestDoReleaseFailureLetsLockExpire(t *testing.T) {
	ctx := t.Context()
	store := memory.New(nil)
	f := &releaseFailer{Backend: store}
	const ttl = 150 * time.Millisecond
	const key = "job"

	err := lock.New(f).Do(ctx, key, lock.Options{TTL: ttl}, func(context.Context, *lock.Lease) error { return nil })
	if !errors.Is(err, errUnreachable) {
		t.Fatalf("Do = %v, want the Release error", err)
	}
	extendsAtReturn := f.extends.Load()

	// The lock must free itself once its TTL is over: a watchdog still
	// renewing it would keep it held for good. The bound is far above the
	// TTL, only against a test that never ends.
	const bound = 10 * time.Second
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	lease, err := lock.New(store).Acquire(wctx, key, lock.Options{TTL: time.Second})
	if err != nil {
		t.Fatalf("lock still held %v after Do returned (renewed %d more times by a watchdog nobody can stop): %v",
			bound, f.extends.Load()-extendsAtReturn, err)
	}
	_ = lease.Release(ctx)
}

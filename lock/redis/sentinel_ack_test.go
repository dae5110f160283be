package redis_test

// These tests use Sentinel clients, and a Backend's wake-up subscription on
// a closed Sentinel client is not ended (a rueidis connection stays in
// background mode): the file sorts after redis_test.go so that
// TestCancellableContextKeepsFastPath, which counts such connections in
// the whole process, runs before them.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/locktest"
	"github.com/llmgate/llmgate/lock/redis"
)

// TestConformanceSentinelAck runs the suite through a Sentinel client with
// every acquisition and extension acknowledged by both replicas.
func TestConformanceSentinelAck(t *testing.T) {
	s := testutil.SharedSentinel(t)
	locktest.Run(t, func(t *testing.T) lock.Backend {
		return redis.New(s.Client(t), redis.Config{AckReplicas: 2})
	})
}

// TestAckReplicasFailClosed: with the replicas paused, TryAcquire and
// Extend fail with ErrNotReplicated, and the refused acquisition leaves the
// lock free once they resume.
func TestAckReplicasFailClosed(t *testing.T) {
	s := testutil.SharedSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	l := lock.New(redis.New(s.Client(t), redis.Config{AckReplicas: 2, AckTimeout: 300 * time.Millisecond}))
	held, err := l.TryAcquire(ctx, newKey(t)+"-held", lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
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
	key := newKey(t)
	_, acqErr := l.TryAcquire(ctx, key, lock.Options{TTL: time.Minute})
	extErr := held.Extend(ctx, 0)
	for _, r := range reps {
		if err := r.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	if !errors.Is(acqErr, redis.ErrNotReplicated) {
		t.Errorf("TryAcquire with the replicas paused: %v, want ErrNotReplicated", acqErr)
	}
	if !errors.Is(extErr, redis.ErrNotReplicated) {
		t.Errorf("Extend with the replicas paused: %v, want ErrNotReplicated", extErr)
	}
	other := lock.New(redis.New(s.Client(t), redis.Config{AckReplicas: 2}))
	if _, err := other.TryAcquire(ctx, key, lock.Options{TTL: time.Second}); err != nil {
		t.Errorf("the refused acquisition was not undone: %v", err)
	}
	if err := held.Extend(ctx, 0); err != nil {
		t.Errorf("Extend after the replicas resumed: %v", err)
	}
	if err := s.WaitStable(ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkAcquireReleaseSentinel: TryAcquire then Release of one key
// through the Sentinel client, without and with waiting for both replicas
// (only the acquisition waits).
func BenchmarkAcquireReleaseSentinel(b *testing.B) {
	s := testutil.SharedSentinel(b)
	for _, ack := range []int{0, 2} {
		b.Run(map[int]string{0: "ack=0", 2: "ack=2"}[ack], func(b *testing.B) {
			l := lock.New(redis.New(s.Client(b), redis.Config{AckReplicas: ack}))
			key := "bench/" + lock.NewToken()[:8]
			for b.Loop() {
				lease, err := l.TryAcquire(b.Context(), key, lock.Options{TTL: 10 * time.Second})
				if err != nil {
					b.Fatal(err)
				}
				if err := lease.Release(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

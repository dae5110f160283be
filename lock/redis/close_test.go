package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/redis"
)

// TestCloseEndsSubscription: once the backend and then its client are
// closed, no connection of theirs is left on the server; the wake-up
// subscription's dedicated connection used to stay open.
func TestCloseEndsSubscription(t *testing.T) {
	r := testutil.StartRedis(t)
	checkCloseEndsSubscription(t, func(name string) rueidis.ClientOption {
		return rueidis.ClientOption{InitAddress: []string{r.Addr}, DisableCache: true, ClientName: name}
	}, []*testutil.Redis{r})
}

func TestCloseEndsSubscriptionCluster3(t *testing.T) {
	c := testutil.SharedCluster(t)
	checkCloseEndsSubscription(t, func(name string) rueidis.ClientOption {
		return rueidis.ClientOption{InitAddress: c.Addrs(), DisableCache: true, ClientName: name}
	}, c.Nodes)
}

func TestCloseEndsSubscriptionSentinel(t *testing.T) {
	s := testutil.SharedSentinel(t)
	checkCloseEndsSubscription(t, func(name string) rueidis.ClientOption {
		o := s.Option()
		o.ClientName = name
		return o
	}, s.Data)
}

// checkCloseEndsSubscription subscribes a backend to wake-ups (one
// contended Acquire), closes it and its client, and counts the client's
// connections (by name) on every node until none is left.
func checkCloseEndsSubscription(t *testing.T, option func(name string) rueidis.ClientOption, nodes []*testutil.Redis) {
	ctx := testCtx(t, time.Minute)
	name := "closetest" + lock.NewToken()[:8]
	c, err := rueidis.NewClient(option(name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := redis.New(c, redis.Config{})
	l := lock.New(b)
	key := newKey(t)
	held, err := l.TryAcquire(ctx, key, lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		// Fair: the waiter queues in Redis and waits on the subscription
		// (unfair, it would wait in this process for the local holder).
		lease, err := l.Acquire(ctx, key, lock.Options{TTL: time.Minute, Fair: true})
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	waitUntil(t, ctx, "the waiter queued", func() bool {
		n, err := b.Waiters(ctx, key)
		return err == nil && n == 1
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if subs := connections(t, ctx, nodes, name, "sub=1"); subs != 1 {
		t.Fatalf("%d subscribed connections named %s before Close, want 1", subs, name)
	}

	b.Close()
	if _, err := l.Acquire(ctx, key, lock.Options{TTL: time.Minute}); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Acquire after Close: %v; want ErrClosed", err)
	}
	lease, err := l.TryAcquire(ctx, key, lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatalf("TryAcquire after Close: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release after Close: %v", err)
	}
	c.Close()
	b.Close() // twice is fine
	waitUntil(t, ctx, "no connection left", func() bool { return connections(t, ctx, nodes, name, "") == 0 })
}

// connections counts the connections named name, among those whose CLIENT
// LIST line holds field, on the running nodes.
func connections(t *testing.T, ctx context.Context, nodes []*testutil.Redis, name, field string) int {
	t.Helper()
	n := 0
	for _, r := range nodes {
		if !r.Running() {
			continue
		}
		m, err := r.Command(ctx, "CLIENT", "LIST")
		if err != nil {
			t.Fatal(err)
		}
		list, err := m.ToString()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(list) {
			if strings.Contains(line, " name="+name+" ") && strings.Contains(line, field) {
				n++
			}
		}
	}
	return n
}

// waitUntil polls cond (server state, nothing to wait on) until it holds
// or ctx ends.
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

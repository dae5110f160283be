package redis_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/dedup/deduptest"
	"github.com/llmgate/llmgate/dedup/redis"
	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
)

func TestConformance(t *testing.T) {
	r := testutil.StartRedis(t)
	deduptest.Run(t, func(t *testing.T) dedup.Backend {
		return redis.New(r.Client(t), redis.Config{})
	})
}

func newKey(t *testing.T) string {
	return "redistest/" + strings.ReplaceAll(t.Name(), "/", ".") + "/" + lock.NewToken()[:8]
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// pttl returns a key's PTTL (-2 missing, -1 no expiry).
func pttl(t *testing.T, r *testutil.Redis, key string) time.Duration {
	t.Helper()
	n := r.Int(t, "PTTL", key)
	if n < 0 {
		return time.Duration(n)
	}
	return time.Duration(n) * time.Millisecond
}

// TestLayoutAndTTLs checks the keys a flight leaves in Redis and their
// lives: while running they expire with keep, after Finish with retain
// (record and frames together), and the free lock soon after.
func TestLayoutAndTTLs(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	b := redis.New(r.Client(t), redis.Config{})
	const lease, retain = time.Second, 3 * time.Second
	g := dedup.New(b, dedup.Options{LeaseTTL: lease})
	key := newKey(t)
	l, _, err := g.Join(ctx, key, "fp", retain)
	if err != nil || l == nil {
		t.Fatalf("Join: leader=%v err=%v", l != nil, err)
	}
	rec, stream, lk := b.Key(key), b.StreamKey(key, l.Fence()), b.LockKey(key)
	if want := "llmgate:dedup:{" + key + "}"; rec != want {
		t.Fatalf("record key %q, want %q", rec, want)
	}
	if want := "llmgate:dedup:lock:{" + key + "}"; lk != want {
		t.Fatalf("lock key %q, want %q", lk, want)
	}
	keep := 6 * lease
	if d := pttl(t, r, rec); d <= keep-time.Second || d > keep {
		t.Fatalf("running record PTTL %v, want about %v", d, keep)
	}
	if err := l.Publish(ctx, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if d := pttl(t, r, stream); d <= keep-time.Second || d > keep {
		t.Fatalf("running stream PTTL %v, want about %v", d, keep)
	}
	if n := r.Int(t, "XLEN", stream); n != 1 {
		t.Fatalf("XLEN %d, want 1", n)
	}
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{rec, stream} {
		if d := pttl(t, r, k); d <= retain-time.Second || d > retain {
			t.Fatalf("PTTL %s after Finish = %v, want about %v", k, d, retain)
		}
	}
	if n := r.Int(t, "XLEN", stream); n != 2 {
		t.Fatalf("XLEN after Finish %d, want 2 (frame, end)", n)
	}
	if n := r.Int(t, "EXISTS", lk); n != 0 {
		t.Fatalf("the free lock's key still exists")
	}
	if d := pttl(t, r, lk+":f"); d <= 0 || d > time.Minute {
		t.Fatalf("free lock's fence counter PTTL %v, want at most a minute (not lock/redis's week)", d)
	}

	// Abort: the record goes and the stream is a lone tombstone.
	key2 := newKey(t)
	l2, _, err := g.Join(ctx, key2, "fp", 0)
	if err != nil || l2 == nil {
		t.Fatalf("Join: leader=%v err=%v", l2 != nil, err)
	}
	for range 5 {
		if err := l2.Publish(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := l2.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if n := r.Int(t, "EXISTS", b.Key(key2)); n != 0 {
		t.Fatal("record still there after Abort")
	}
	if n := r.Int(t, "XLEN", b.StreamKey(key2, l2.Fence())); n != 1 {
		t.Fatalf("XLEN after Abort %d, want 1 (the tombstone)", n)
	}
	if d := pttl(t, r, b.StreamKey(key2, l2.Fence())); d <= 0 || d > keep {
		t.Fatalf("tombstone PTTL %v, want at most %v", d, keep)
	}
}

// TestRetainedKeysExpire: after retain, nothing of a finished flight is
// left but its (short-lived) free lock.
func TestRetainedKeysExpire(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	b := redis.New(r.Client(t), redis.Config{})
	g := dedup.New(b, dedup.Options{})
	key := newKey(t)
	const retain = 200 * time.Millisecond
	l, _, err := g.Join(ctx, key, "fp", retain)
	if err != nil || l == nil {
		t.Fatalf("Join: leader=%v err=%v", l != nil, err)
	}
	if err := l.Publish(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.Int(t, "EXISTS", b.Key(key), b.StreamKey(key, l.Fence())) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("finished flight's keys still there 10s after retain")
		}
		time.Sleep(10 * time.Millisecond) // expiry inside Redis: nothing to select on
	}
}

// TestExternalLockDeleteEndsFlight: a DEL of the leader's lock from outside
// ends the flight: the leader's Lost() closes, its followers get
// ErrLeaderGone, and one of them leads next.
func TestExternalLockDeleteEndsFlight(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	const lease = 900 * time.Millisecond
	late := r.LateBound(t, 50, 2*time.Second) // how late a busy machine may be
	newGroup := func() (*dedup.Group, *redis.Backend) {
		b := redis.New(r.Client(t), redis.Config{})
		return dedup.New(b, dedup.Options{LeaseTTL: lease}), b
	}
	g1, b1 := newGroup()
	g2, _ := newGroup()
	key := newKey(t)
	l, _, err := g1.Join(ctx, key, "fp", 0)
	if err != nil || l == nil {
		t.Fatalf("Join: leader=%v err=%v", l != nil, err)
	}
	defer func() { _ = l.Abort(ctx) }()
	_, f, err := g2.Join(ctx, key, "fp", 0)
	if err != nil || f == nil {
		t.Fatalf("Join: follower=%v err=%v", f != nil, err)
	}
	defer f.Close()
	if err := l.Publish(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if fr, err := f.Next(ctx); err != nil || string(fr) != "a" {
		t.Fatalf("Next = %q, %v", fr, err)
	}
	if n := r.Int(t, "DEL", b1.LockKey(key)); n != 1 {
		t.Fatalf("DEL of the lock key removed %d keys, want 1 (key layout changed?)", n)
	}
	deleted := time.Now()
	if _, err := f.Next(ctx); !errors.Is(err, dedup.ErrLeaderGone) {
		t.Fatalf("Next after the lock was deleted = %v, want ErrLeaderGone", err)
	}
	bound := lease/3 + late // one check period
	if d := time.Since(deleted); d > bound {
		t.Fatalf("follower learned of the lost lock after %v, want within %v", d, bound)
	}
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("leader's Lost() not closed after its lock was deleted")
	}
	if err := l.Publish(ctx, []byte("b")); !errors.Is(err, dedup.ErrLost) {
		t.Fatalf("Publish after the loss = %v, want ErrLost", err)
	}
	l2, _, err := g2.Join(ctx, key, "fp", 0)
	if err != nil || l2 == nil {
		t.Fatalf("re-Join: leader=%v err=%v", l2 != nil, err)
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("new fence %d, want > %d", l2.Fence(), l.Fence())
	}
	_ = l2.Abort(ctx)
}

// Environment of the helper process (see TestHelperProcess).
const (
	envKey   = "LLMGATE_DEDUP_HELPER_KEY"
	envLease = "LLMGATE_DEDUP_HELPER_LEASE"
)

// TestHelperProcess is not a test: it is the body of the child processes
// the other tests start (testutil.StartHelper) in mode lead.
func TestHelperProcess(t *testing.T) {
	mode, ctx, c := testutil.Helper(t)
	lease, err := time.ParseDuration(os.Getenv(envLease))
	if err != nil {
		t.Fatal(err)
	}
	g := dedup.New(redis.New(c, redis.Config{}), dedup.Options{LeaseTTL: lease})
	switch mode {
	case "lead":
		l, _, err := g.Join(ctx, os.Getenv(envKey), "fp", 0)
		if err != nil || l == nil {
			t.Fatalf("Join: leader=%v err=%v", l != nil, err)
		}
		for i := range 2 {
			if err := l.Publish(ctx, fmt.Appendf(nil, "frame-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Say("leading %d", l.Fence())
		<-ctx.Done() // until killed
	default:
		t.Fatalf("unknown helper mode %q", mode)
	}
}

// TestKilledLeaderIsReplaced: a leader process killed with SIGKILL mid-flight
// never aborts; its followers in two other processes get ErrLeaderGone
// within the lease plus one check period, and one of them leads the next
// generation, whose result they all receive.
func TestKilledLeaderIsReplaced(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 60*time.Second)
	key := newKey(t)
	const lease = time.Second
	late := r.LateBound(t, 50, 2*time.Second) // how late a busy machine may be
	child := testutil.StartHelper(t, ctx, r, "lead", envKey+"="+key, envLease+"="+lease.String())
	var childFence uint64
	line := child.Line(t, 30*time.Second)
	if _, err := fmt.Sscanf(line, "leading %d", &childFence); err != nil {
		t.Fatalf("helper said %q: %v", line, err)
	}
	groups := []*dedup.Group{
		dedup.New(redis.New(r.Client(t), redis.Config{}), dedup.Options{LeaseTTL: lease}),
		dedup.New(redis.New(r.Client(t), redis.Config{}), dedup.Options{LeaseTTL: lease}),
	}
	type result struct {
		err error
		at  time.Time
	}
	var followers []*dedup.Follower
	results := make(chan result, 4)
	for _, g := range groups {
		for range 2 {
			_, f, err := g.Join(ctx, key, "fp", 0)
			if err != nil || f == nil {
				t.Fatalf("Join: follower=%v err=%v", f != nil, err)
			}
			defer f.Close()
			followers = append(followers, f)
			go func() {
				for i := 0; ; i++ {
					fr, err := f.Next(ctx)
					if err != nil {
						results <- result{err, time.Now()}
						return
					}
					if want := "frame-" + strconv.Itoa(i); string(fr) != want {
						results <- result{fmt.Errorf("frame %d = %q, want %q", i, fr, want), time.Now()}
						return
					}
				}
			}()
		}
	}
	child.Kill()
	killed := time.Now()
	bound := lease + min(lease/3, time.Second) + late // the lease and one check period
	for range followers {
		select {
		case res := <-results:
			if !errors.Is(res.err, dedup.ErrLeaderGone) {
				t.Fatalf("follower of the killed leader: %v, want ErrLeaderGone", res.err)
			}
			if d := res.at.Sub(killed); d > bound {
				t.Fatalf("follower learned of the killed leader after %v, want within %v", d, bound)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("follower of the killed leader still waiting after 30s")
		}
	}

	leaders := 0
	var next []*dedup.Follower
	var leader *dedup.Leader
	for _, g := range groups {
		for range 2 {
			l, f, err := g.Join(ctx, key, "fp", 0)
			switch {
			case err != nil:
				t.Fatal(err)
			case l != nil:
				leaders++
				leader = l
				defer func() { _ = l.Abort(ctx) }()
			default:
				defer f.Close()
				next = append(next, f)
			}
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders after the takeover, want 1", leaders)
	}
	if leader.Fence() <= childFence {
		t.Fatalf("new fence %d, want > the killed leader's %d", leader.Fence(), childFence)
	}
	for i := range 3 {
		if err := leader.Publish(ctx, fmt.Appendf(nil, "frame-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := leader.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	for _, f := range next {
		// Each had consumed 2 frames of the dead generation: skip those.
		var got []string
		for {
			fr, err := f.Next(ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, string(fr))
		}
		if strings.Join(got, ",") != "frame-0,frame-1,frame-2" {
			t.Fatalf("new generation's frames %q", got)
		}
	}
}

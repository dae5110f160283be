package redis_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/dedup/redis"
	"github.com/llmgate/llmgate/internal/testutil"
)

// BenchmarkPing is the unit for the others: one PING round trip on the same
// kind of client.
func BenchmarkPing(b *testing.B) { testutil.BenchPing(b) }

// BenchmarkFlight20 is one whole flight across two processes (two clients):
// the leader joins (lock + claim), publishes 20 frames of 100 bytes and
// finishes (finish + release + tidy); a follower in the other process joins
// while it runs and reads the 20 frames live from the stream, then io.EOF.
// ns/op is the flight's wall time, follower done.
func BenchmarkFlight20(b *testing.B) {
	r := testutil.StartRedis(b)
	opts := dedup.Options{Retain: time.Second}
	lead := dedup.New(redis.New(r.Client(b), redis.Config{}), opts)
	follow := dedup.New(redis.New(r.Client(b), redis.Config{}), opts)
	ctx := context.Background()
	frame := make([]byte, 100)
	const frames = 20
	i := 0
	for b.Loop() {
		i++
		key := "bench/" + strconv.Itoa(i)
		l, _, err := lead.Join(ctx, key, "fp", 0)
		if err != nil || l == nil {
			b.Fatalf("Join: leader=%v err=%v", l != nil, err)
		}
		_, f, err := follow.Join(ctx, key, "fp", 0)
		if err != nil || f == nil {
			b.Fatalf("Join: follower=%v err=%v", f != nil, err)
		}
		done := make(chan error, 1)
		go func() {
			defer f.Close()
			for got := 0; ; got++ {
				if _, err := f.Next(ctx); err != nil {
					if errors.Is(err, io.EOF) && got == frames {
						err = nil
					}
					done <- err
					return
				}
			}
		}()
		for range frames {
			if err := l.Publish(ctx, frame); err != nil {
				b.Fatal(err)
			}
		}
		if err := l.Finish(ctx); err != nil {
			b.Fatal(err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPublish is one frame of 100 bytes appended by a leader with
// nobody following: one append.lua round trip.
func BenchmarkPublish(b *testing.B) {
	r := testutil.StartRedis(b)
	g := dedup.New(redis.New(r.Client(b), redis.Config{}), dedup.Options{MaxFrames: 1 << 30, MaxBytes: 1 << 40})
	ctx := context.Background()
	l, _, err := g.Join(ctx, "bench/publish", "fp", 0)
	if err != nil || l == nil {
		b.Fatalf("Join: leader=%v err=%v", l != nil, err)
	}
	defer func() { _ = l.Abort(ctx) }()
	frame := make([]byte, 100)
	for b.Loop() {
		if err := l.Publish(ctx, frame); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay20 is a late joiner replaying a retained 20-frame result
// from another process: Join (lock attempt, claim answers "finished",
// release) and one read of all frames.
func BenchmarkReplay20(b *testing.B) {
	r := testutil.StartRedis(b)
	lead := dedup.New(redis.New(r.Client(b), redis.Config{}), dedup.Options{})
	replay := dedup.New(redis.New(r.Client(b), redis.Config{}), dedup.Options{})
	ctx := context.Background()
	l, _, err := lead.Join(ctx, "bench/replay", "fp", 0)
	if err != nil || l == nil {
		b.Fatalf("Join: leader=%v err=%v", l != nil, err)
	}
	for i := range 20 {
		if err := l.Publish(ctx, fmt.Appendf(make([]byte, 0, 100), "%0100d", i)); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Finish(ctx); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		_, f, err := replay.Join(ctx, "bench/replay", "fp", 0)
		if err != nil || f == nil {
			b.Fatalf("Join: follower=%v err=%v", f != nil, err)
		}
		for got := 0; ; got++ {
			if _, err := f.Next(ctx); err != nil {
				if !errors.Is(err, io.EOF) || got != 20 {
					b.Fatalf("after %d frames: %v", got, err)
				}
				break
			}
		}
		f.Close()
	}
}

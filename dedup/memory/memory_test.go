package memory_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/dedup/deduptest"
	"github.com/llmgate/llmgate/dedup/memory"
)

func TestConformance(t *testing.T) {
	b := memory.New(nil)
	deduptest.Run(t, func(t *testing.T) dedup.Backend { return b })
}

// TestRetainOnFakeClock: a finished result is replayed until exactly retain
// has passed on the backend's clock, then the key is free.
func TestRetainOnFakeClock(t *testing.T) {
	ctx := t.Context()
	// At the real time: the leader's lease is kept alive on the real clock
	// (see lock/memory.New); set in the past, the lease looked expired to
	// the watchdog, which ended the leadership before Publish now and then.
	clk := clock.NewFake(time.Now())
	g := dedup.New(memory.New(clk), dedup.Options{})
	const retain = 5 * time.Second
	l, _, err := g.Join(ctx, "k", "fp", retain)
	if err != nil || l == nil {
		t.Fatalf("Join: leader=%v err=%v", l != nil, err)
	}
	if err := l.Publish(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Advance(retain - time.Millisecond)
	_, f, err := g.Join(ctx, "k", "fp", retain)
	if err != nil || f == nil {
		t.Fatalf("Join just before expiry: follower=%v err=%v", f != nil, err)
	}
	if fr, err := f.Next(ctx); err != nil || string(fr) != "a" {
		t.Fatalf("Next = %q, %v", fr, err)
	}
	if _, err := f.Next(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("Next = %v, want io.EOF", err)
	}
	f.Close()
	if _, _, err := g.Join(ctx, "k", "other", 0); !errors.Is(err, dedup.ErrConflict) {
		t.Fatalf("Join with another fingerprint before expiry = %v, want ErrConflict", err)
	}
	clk.Advance(time.Millisecond)
	l, _, err = g.Join(ctx, "k", "other", 0)
	if err != nil || l == nil {
		t.Fatalf("Join after expiry: leader=%v err=%v", l != nil, err)
	}
	_ = l.Abort(ctx)
}

// TestRunningRecordExpires: a running generation that is neither refreshed
// nor written to is dropped after keep, and its readers see it gone.
func TestRunningRecordExpires(t *testing.T) {
	ctx := t.Context()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	b := memory.New(clk)
	fl, err := b.Claim(ctx, "k", "fp", 7, time.Minute)
	if err != nil || fl.State != dedup.StateRunning || fl.Gen != 7 {
		t.Fatalf("Claim = %+v, %v", fl, err)
	}
	if err := b.Append(ctx, "k", 7, []byte("x"), time.Minute); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute - time.Millisecond)
	if fl, _ := b.Lookup(ctx, "k"); fl.State != dedup.StateRunning {
		t.Fatalf("Lookup before keep ran out = %+v", fl)
	}
	clk.Advance(time.Millisecond)
	if fl, _ := b.Lookup(ctx, "k"); fl.State != dedup.StateNone {
		t.Fatalf("Lookup after keep ran out = %+v, want none", fl)
	}
	batch, err := b.Read(ctx, "k", 7, "", 10, 0)
	if err != nil || batch.State != dedup.StateNone {
		t.Fatalf("Read after expiry = %+v, %v", batch, err)
	}
	if err := b.Append(ctx, "k", 7, []byte("y"), time.Minute); !errors.Is(err, dedup.ErrLost) {
		t.Fatalf("Append after expiry = %v, want ErrLost", err)
	}
}

// TestReadWaitsForAppend: a blocked Read returns as soon as a frame is
// appended, and a Read past its wait reports the generation still running.
func TestReadWaitsForAppend(t *testing.T) {
	ctx := t.Context()
	b := memory.New(nil)
	if _, err := b.Claim(ctx, "k", "fp", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	batch, err := b.Read(ctx, "k", 1, "", 10, 10*time.Millisecond)
	if err != nil || batch.State != dedup.StateRunning || len(batch.Frames) != 0 {
		t.Fatalf("Read with nothing appended = %+v, %v", batch, err)
	}
	got := make(chan dedup.Batch, 1)
	go func() {
		batch, _ := b.Read(ctx, "k", 1, "", 10, time.Minute)
		got <- batch
	}()
	if err := b.Append(ctx, "k", 1, []byte("x"), time.Minute); err != nil {
		t.Fatal(err)
	}
	select {
	case batch := <-got:
		if len(batch.Frames) != 1 || string(batch.Frames[0]) != "x" || batch.Cursor != "1" {
			t.Fatalf("Read = %+v", batch)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("blocked Read not woken by Append")
	}
	if _, err := b.Read(ctx, "k", 1, "x", 10, 0); err == nil {
		t.Fatal("Read with a malformed cursor succeeded")
	}
	if _, err := b.Read(ctx, "k", 1, "5", 10, 0); err == nil {
		t.Fatal("Read with a cursor past the end succeeded")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Read(cctx, "k", 1, "1", 10, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("Read with a cancelled context = %v", err)
	}
}

// TestRetainedResultsBounded: finished results kept for late joiners are
// bounded in bytes; the oldest go first.
func TestRetainedResultsBounded(t *testing.T) {
	b := memory.New(clock.NewFake(time.Unix(1e9, 0)), memory.WithMaxRetainedBytes(100))
	ctx := t.Context()
	finish := func(key string) {
		t.Helper()
		if _, err := b.Claim(ctx, key, "fp", 1, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := b.Append(ctx, key, 1, make([]byte, 60), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := b.Finish(ctx, key, 1, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	state := func(key string) dedup.State {
		f, err := b.Lookup(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return f.State
	}
	finish("a")
	if state("a") != dedup.StateFinished {
		t.Fatal("a not retained")
	}
	finish("b") // 120 bytes > 100: a goes
	if state("a") != dedup.StateNone || state("b") != dedup.StateFinished {
		t.Fatalf("a %v, b %v; want a forgotten, b kept", state("a"), state("b"))
	}
	for i := range 200 { // the bookkeeping stays bounded too
		finish(fmt.Sprint("k", i))
	}
	if state("k199") != dedup.StateFinished || state("k198") != dedup.StateNone {
		t.Fatal("only the newest result fits")
	}
}

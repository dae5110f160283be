package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/dedup/memory"
)

// Two identical requests: the first joiner leads and publishes the answer
// frame by frame; the second follows and receives the same frames; a retry
// after the end replays the retained result.
func Example() {
	g := dedup.New(memory.New(nil), dedup.Options{}) // dedup/redis for many processes
	ctx := context.Background()
	key, fingerprint := "tenant-a/5d41402abc4b2a76", "sha256:body-hash"

	leader, _, err := g.Join(ctx, key, fingerprint, time.Minute)
	if err != nil {
		panic(err)
	}
	_, follower, err := g.Join(ctx, key, fingerprint, time.Minute)
	if err != nil {
		panic(err)
	}
	defer follower.Close()

	// The leader makes the upstream call and publishes as it goes.
	for _, frame := range []string{"200 OK", "Hello", ", world"} {
		if err := leader.Publish(ctx, []byte(frame)); err != nil {
			panic(err)
		}
	}
	if err := leader.Finish(ctx); err != nil {
		panic(err)
	}

	for {
		frame, err := follower.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			panic(err)
		}
		fmt.Printf("follower: %s\n", frame)
	}

	// A retry of the same request after the end: served from the store.
	l, replay, err := g.Join(ctx, key, fingerprint, 0)
	fmt.Println("retry leads:", l != nil, "err:", err)
	defer replay.Close()
	frame, _ := replay.Next(ctx)
	fmt.Printf("replay starts with: %s\n", frame)

	// The same key with another request is a conflict.
	_, _, err = g.Join(ctx, key, "sha256:other-body", 0)
	fmt.Println(errors.Is(err, dedup.ErrConflict))

	// Output:
	// follower: 200 OK
	// follower: Hello
	// follower: , world
	// retry leads: false err: <nil>
	// replay starts with: 200 OK
	// true
}

// A caller handles both roles, including a takeover: when the leader is
// gone, it joins again; leading, it produces only what its client has not
// received yet; following, it skips as many frames (the request is
// deterministic, so the next generation repeats them).
func ExampleFollower_Next() {
	g := dedup.New(memory.New(nil), dedup.Options{})
	ctx := context.Background()
	key, fp := "tenant-a/prompt-1", "sha256:1"
	upstream := []string{"a", "b", "c"} // what the upstream answers, in frames

	// A first leader publishes one frame, then aborts (its client left).
	first, _, _ := g.Join(ctx, key, fp, 0)
	_, f, _ := g.Join(ctx, key, fp, 0)
	_ = first.Publish(ctx, []byte("a"))
	_ = first.Abort(ctx)

	var sent []string // what our client received
	serve := func(l *dedup.Leader, f *dedup.Follower) error {
		for range 3 { // bounded: each round is one generation
			if l != nil {
				for _, frame := range upstream[len(sent):] {
					if err := l.Publish(ctx, []byte(frame)); err != nil {
						return err
					}
					sent = append(sent, frame)
				}
				return l.Finish(ctx)
			}
			for skip := len(sent); ; {
				frame, err := f.Next(ctx)
				if errors.Is(err, io.EOF) {
					f.Close()
					return nil
				}
				if errors.Is(err, dedup.ErrLeaderGone) {
					break
				}
				if err != nil {
					f.Close()
					return err
				}
				if skip > 0 {
					skip--
					continue
				}
				sent = append(sent, string(frame))
			}
			f.Close()
			var err error
			if l, f, err = g.Join(ctx, key, fp, 0); err != nil {
				return err
			}
			fmt.Println("joined again, leading:", l != nil)
		}
		return errors.New("no result after 3 generations")
	}
	err := serve(nil, f)
	fmt.Println(sent, err)

	// Output:
	// joined again, leading: true
	// [a b c] <nil>
}

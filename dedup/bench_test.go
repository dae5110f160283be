package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/dedup/memory"
)

// BenchmarkLocalFanOut is one flight of 20 frames (100 bytes each) led in
// this process and received by n followers of the same process, which read
// the leader's frames from memory: Join of every party, 20 Publish, Finish,
// and every follower reading to io.EOF.
func BenchmarkLocalFanOut(b *testing.B) {
	for _, n := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("followers=%d", n), func(b *testing.B) {
			g := dedup.New(memory.New(nil), dedup.Options{Retain: time.Second})
			ctx := context.Background()
			frame := make([]byte, 100)
			const frames = 20
			i := 0
			for b.Loop() {
				i++
				key := "bench/" + strconv.Itoa(i)
				l, _, err := g.Join(ctx, key, "fp", 0)
				if err != nil || l == nil {
					b.Fatalf("Join: leader=%v err=%v", l != nil, err)
				}
				var wg sync.WaitGroup
				errs := make(chan error, n)
				for range n {
					_, f, err := g.Join(ctx, key, "fp", 0)
					if err != nil || f == nil {
						b.Fatalf("Join: follower=%v err=%v", f != nil, err)
					}
					wg.Go(func() {
						defer f.Close()
						for got := 0; ; got++ {
							if _, err := f.Next(ctx); err != nil {
								if !errors.Is(err, io.EOF) || got != frames {
									errs <- fmt.Errorf("after %d frames: %w", got, err)
								}
								return
							}
						}
					})
				}
				for range frames {
					if err := l.Publish(ctx, frame); err != nil {
						b.Fatal(err)
					}
				}
				if err := l.Finish(ctx); err != nil {
					b.Fatal(err)
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*frames*n), "ns/frame-delivered")
		})
	}
}

package simrun

import (
	"fmt"
	"sync"
	"time"
)

// progress reports an arm's progress on o.Progress: with o.Live a line
// redrawn every half second, otherwise one line when the arm ends. The
// returned function stops it and writes the final line.
func progress(o Options, name, arm string, cs *clients, start time.Time) func() {
	if o.Progress == nil {
		return func() {}
	}
	line := func() string {
		cs.mu.Lock()
		n, ok := len(cs.records), 0
		for _, r := range cs.records {
			if r.ok {
				ok++
			}
		}
		cs.mu.Unlock()
		return fmt.Sprintf("sim %s [%s] %5.1fs  requests %d  succeeded %d  429s %d  waiting %d",
			name, arm, time.Since(start).Seconds(), n, ok, cs.got429.Load(), cs.outstanding.Load())
	}
	if !o.Live {
		return func() { fmt.Fprintln(o.Progress, line()) }
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(o.Progress, "\r\033[K%s", line())
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		fmt.Fprintf(o.Progress, "\r\033[K%s\n", line())
	}
}

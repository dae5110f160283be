package respcache

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
)

// checkInvariants verifies the recency list against the map and the byte
// count, and the bound.
func (m *Memory) checkInvariants(t *testing.T) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	n, sum := 0, int64(0)
	for it := m.root.next; it != &m.root; it = it.next {
		if n++; n > len(m.items) {
			t.Fatalf("recency list longer than the map (%d items)", len(m.items))
		}
		if m.items[it.key] != it {
			t.Fatalf("list item %q is not the map's", it.key)
		}
		if it.next.prev != it {
			t.Fatalf("broken links at %q", it.key)
		}
		if it.size != Size(it.key, it.e) {
			t.Fatalf("item %q: size %d, Size %d", it.key, it.size, Size(it.key, it.e))
		}
		sum += it.size
	}
	if n != len(m.items) || sum != m.bytes || m.bytes > m.maxBytes {
		t.Fatalf("list %d items %d bytes; map %d items; counted %d bytes; bound %d", n, sum, len(m.items), m.bytes, m.maxBytes)
	}
}

// TestMemoryConcurrent runs Puts, Gets and clock advances from many
// goroutines (run it with -race). Every entry's body names its key, so a hit
// that returns another key's entry, or a torn one, is caught.
func TestMemoryConcurrent(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m := NewMemory(16<<10, clk)
	const workers, ops, keys = 8, 3000, 64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range ops {
				k := strconv.Itoa(rng.IntN(keys))
				switch rng.IntN(10) {
				case 0:
					clk.Advance(time.Duration(rng.IntN(1000)) * time.Millisecond)
				case 1, 2, 3, 4:
					body := bytes.Repeat([]byte(k+";"), 1+rng.IntN(200))
					e := &Entry{Status: 200, Body: body, Events: nil}
					if rng.IntN(2) == 0 {
						e = &Entry{Status: 200, Events: [][]byte{[]byte(k), body}}
					}
					err := m.Put(t.Context(), k, e, time.Duration(1+rng.IntN(5000))*time.Millisecond)
					if err != nil && err != ErrTooLarge {
						errs <- fmt.Errorf("op %d: Put: %w", i, err)
						return
					}
				default:
					e, ok, err := m.Get(t.Context(), k)
					if err != nil {
						errs <- fmt.Errorf("op %d: Get: %w", i, err)
						return
					}
					if !ok {
						continue
					}
					body := e.Body
					if e.Events != nil {
						if len(e.Events) != 2 || string(e.Events[0]) != k {
							errs <- fmt.Errorf("op %d: Get(%s) returned events %q", i, k, e.Events)
							return
						}
						body = e.Events[1]
					}
					if !bytes.Equal(body, bytes.Repeat([]byte(k+";"), len(body)/(len(k)+1))) || len(body) == 0 {
						errs <- fmt.Errorf("op %d: Get(%s) returned body %q", i, k, body)
						return
					}
					body[0] = '!' // the caller's copy: must not reach other readers
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	m.checkInvariants(t)
	if m.Len() == 0 {
		t.Fatal("nothing stored: the test exercised no hits")
	}
}

// TestMemoryInvariantsUnderChurn checks the bookkeeping after every step of
// a long random sequence of single-goroutine operations.
func TestMemoryInvariantsUnderChurn(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m := NewMemory(4000, clk)
	rng := rand.New(rand.NewPCG(7, 7))
	for range 5000 {
		k := strconv.Itoa(rng.IntN(40))
		switch rng.IntN(4) {
		case 0:
			clk.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
		case 1, 2:
			_ = m.Put(t.Context(), k, &Entry{Status: 200, Body: make([]byte, rng.IntN(600))}, time.Duration(1+rng.IntN(3000))*time.Millisecond)
		default:
			_, _, _ = m.Get(t.Context(), k)
		}
		m.checkInvariants(t)
	}
}

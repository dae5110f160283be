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

// checkInvariants verifies the recency lists against the map and the byte
// counts, and the bounds.
func (m *Memory) checkInvariants(t *testing.T) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	n, sum := 0, int64(0)
	perTenant := map[*tenant]int64{}
	for it := m.root.next; it != &m.root; it = it.next {
		if n++; n > len(m.items) {
			t.Fatalf("recency list longer than the map (%d items)", len(m.items))
		}
		if m.items[it.ref] != it {
			t.Fatalf("list item %q is not the map's", it.ref)
		}
		if it.next.prev != it {
			t.Fatalf("broken links at %q", it.ref)
		}
		if it.size != Size(it.ref.key, it.e) {
			t.Fatalf("item %q: size %d, Size %d", it.ref, it.size, Size(it.ref.key, it.e))
		}
		if m.tenants[it.ref.tenant] != it.t {
			t.Fatalf("item %q: not in its tenant's list", it.ref)
		}
		sum += it.size
		perTenant[it.t] += it.size
	}
	if n != len(m.items) || sum != m.bytes || m.bytes > m.maxBytes {
		t.Fatalf("list %d items %d bytes; map %d items; counted %d bytes; bound %d", n, sum, len(m.items), m.bytes, m.maxBytes)
	}
	if len(m.tenants) != len(perTenant) {
		t.Fatalf("%d tenants kept, %d with entries", len(m.tenants), len(perTenant))
	}
	for name, tn := range m.tenants {
		tsum := int64(0)
		for it := tn.root.tnext; it != &tn.root; it = it.tnext {
			if it.t != tn || it.tnext.tprev != it {
				t.Fatalf("tenant %q: broken list at %q", name, it.ref)
			}
			tsum += it.size
		}
		if tsum != tn.bytes || tsum != perTenant[tn] || tn.bytes > m.tenantBytes {
			t.Fatalf("tenant %q: list %d bytes, counted %d, in the store's list %d; bound %d", name, tsum, tn.bytes, perTenant[tn], m.tenantBytes)
		}
	}
}

// TestMemoryConcurrent runs Puts, Gets and clock advances from many
// goroutines (run it with -race). Every entry's body names its key, so a hit
// that returns another key's entry, or a torn one, is caught.
func TestMemoryConcurrent(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m := NewMemory(16<<10, clk, WithTenantBytes(8<<10))
	const workers, ops, keys = 8, 3000, 64
	tenants := []string{"a", "b", "c"}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range ops {
				tn := tenants[rng.IntN(len(tenants))]
				k := strconv.Itoa(rng.IntN(keys))
				// The body names the tenant and the key.
				name := tn + k
				switch rng.IntN(10) {
				case 0:
					clk.Advance(time.Duration(rng.IntN(1000)) * time.Millisecond)
				case 1, 2, 3, 4:
					body := bytes.Repeat([]byte(name+";"), 1+rng.IntN(100))
					e := &Entry{Status: 200, Body: body, Events: nil}
					if rng.IntN(2) == 0 {
						e = &Entry{Status: 200, Events: [][]byte{[]byte(name), body}}
					}
					err := m.Put(t.Context(), tn, k, e, time.Duration(1+rng.IntN(5000))*time.Millisecond)
					if err != nil && err != ErrTooLarge {
						errs <- fmt.Errorf("op %d: Put: %w", i, err)
						return
					}
				default:
					e, ok, err := m.Get(t.Context(), tn, k)
					if err != nil {
						errs <- fmt.Errorf("op %d: Get: %w", i, err)
						return
					}
					if !ok {
						continue
					}
					body := e.Body
					if e.Events != nil {
						if len(e.Events) != 2 || string(e.Events[0]) != name {
							errs <- fmt.Errorf("op %d: Get(%s) returned events %q", i, name, e.Events)
							return
						}
						body = e.Events[1]
					}
					if !bytes.Equal(body, bytes.Repeat([]byte(name+";"), len(body)/(len(name)+1))) || len(body) == 0 {
						errs <- fmt.Errorf("op %d: Get(%s) returned body %q", i, name, body)
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
	m := NewMemory(4000, clk, WithTenantBytes(2400))
	rng := rand.New(rand.NewPCG(7, 7))
	for range 5000 {
		tn, k := strconv.Itoa(rng.IntN(3)), strconv.Itoa(rng.IntN(40))
		switch rng.IntN(4) {
		case 0:
			clk.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
		case 1, 2:
			_ = m.Put(t.Context(), tn, k, &Entry{Status: 200, Body: make([]byte, rng.IntN(400))}, time.Duration(1+rng.IntN(3000))*time.Millisecond)
		default:
			_, _, _ = m.Get(t.Context(), tn, k)
		}
		m.checkInvariants(t)
	}
}

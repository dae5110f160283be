package respcache_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/respcache"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestMemoryConformance(t *testing.T) {
	runConformance(t, func(t *testing.T) harness {
		clk := clock.NewFake(epoch)
		return harness{
			store:   respcache.NewMemory(4*conformanceTenantBytes, clk, respcache.WithTenantBytes(conformanceTenantBytes)),
			advance: func(_ *testing.T, d time.Duration) { clk.Advance(d) },
		}
	})
}

// sized returns an entry whose Size under a one-byte key is n (n ≥ 1).
func sized(n int) *respcache.Entry {
	return &respcache.Entry{Status: 200, Body: bytes.Repeat([]byte("b"), n-1)}
}

func put(t *testing.T, m *respcache.Memory, key string, e *respcache.Entry, ttl time.Duration) {
	t.Helper()
	if err := m.Put(t.Context(), "t", key, e, ttl); err != nil {
		t.Fatalf("Put(%s): %v", key, err)
	}
}

func has(t *testing.T, m *respcache.Memory, key string) bool {
	t.Helper()
	_, ok, err := m.Get(t.Context(), "t", key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return ok
}

func TestSize(t *testing.T) {
	e := &respcache.Entry{
		Status:  200,
		Header:  http.Header{"Content-Type": {"application/json"}, "X-A": {"1", "22"}, "X-Empty": nil},
		Body:    []byte("0123456789"),
		Events:  [][]byte{[]byte("abc"), nil, []byte("de")},
		Created: epoch,
	}
	// key 3 + "Content-Type" 12 + "application/json" 16 + "X-A" 3 + 1 + 2 + "X-Empty" 7 + body 10 + events 5
	if got, want := respcache.Size("key", e), int64(3+12+16+3+1+2+7+10+5); got != want {
		t.Fatalf("Size = %d, want %d", got, want)
	}
}

func TestMemoryByteAccounting(t *testing.T) {
	m := respcache.NewMemory(8000, clock.NewFake(epoch)) // entries up to 1000
	want := int64(0)
	for i, n := range []int{1, 10, 999, 1000, 500} {
		k := fmt.Sprint(i) // one byte
		put(t, m, k, sized(n), time.Hour)
		want += int64(n)
		if m.Bytes() != want || m.Len() != i+1 {
			t.Fatalf("after %d puts: Bytes = %d, Len = %d; want %d, %d", i+1, m.Bytes(), m.Len(), want, i+1)
		}
	}
	// Replacing an entry swaps its size.
	put(t, m, "2", sized(100), time.Hour)
	if want += 100 - 999; m.Bytes() != want || m.Len() != 5 {
		t.Fatalf("after a replace: Bytes = %d, Len = %d; want %d, 5", m.Bytes(), m.Len(), want)
	}
	// Headers and events count too.
	e := &respcache.Entry{Status: 200, Header: http.Header{"Ab": {"cd", "e"}}, Events: [][]byte{[]byte("xyz"), []byte("w")}}
	put(t, m, "h", e, time.Hour)
	if want += respcache.Size("h", e); m.Bytes() != want || respcache.Size("h", e) != 1+2+2+1+3+1 {
		t.Fatalf("with headers and events: Bytes = %d, want %d", m.Bytes(), want)
	}
}

func TestMemoryLRUEviction(t *testing.T) {
	m := respcache.NewMemory(800, clock.NewFake(epoch)) // 8 entries of 100 bytes
	for i := range 8 {
		put(t, m, fmt.Sprint(i), sized(100), time.Hour)
	}
	if m.Bytes() != 800 || m.Len() != 8 {
		t.Fatalf("full: Bytes = %d, Len = %d; want 800, 8", m.Bytes(), m.Len())
	}
	// Reading 0 makes 1 the least recently used.
	if !has(t, m, "0") {
		t.Fatal("0 missing")
	}
	put(t, m, "8", sized(100), time.Hour)
	if has(t, m, "1") || !has(t, m, "0") || !has(t, m, "8") {
		t.Fatal("want 1 evicted, 0 and 8 kept")
	}
	if m.Bytes() != 800 || m.Len() != 8 {
		t.Fatalf("Bytes = %d, Len = %d; want 800, 8", m.Bytes(), m.Len())
	}
	// Recency now, oldest first: 2 3 4 5 6 7 0 8. A 100-byte entry needs
	// one eviction, a 1-byte one too (801 > 800): 2, then 3.
	put(t, m, "a", sized(100), time.Hour)
	put(t, m, "b", sized(1), time.Hour)
	for k, want := range map[string]bool{"2": false, "3": false, "4": true, "a": true, "b": true} {
		if has(t, m, k) != want {
			t.Errorf("has(%s) = %v, want %v", k, !want, want)
		}
	}
	if m.Bytes() != 701 {
		t.Fatalf("Bytes = %d, want 701", m.Bytes())
	}
	// Replacing an entry with a bigger one evicts from the cold end, never
	// the entry just written.
	put(t, m, "b", sized(100), time.Hour)
	if !has(t, m, "b") || m.Bytes() > 800 {
		t.Fatalf("Bytes = %d", m.Bytes())
	}
}

func TestMemoryTooLarge(t *testing.T) {
	m := respcache.NewMemory(800, clock.NewFake(epoch))
	put(t, m, "k", sized(100), time.Hour) // exactly maxBytes/8
	if err := m.Put(t.Context(), "t", "k", sized(101), time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
		t.Fatalf("Put(101 bytes) = %v, want ErrTooLarge", err)
	}
	// The key counts: 99 bytes of entry under a 2-byte key is 101.
	if err := m.Put(t.Context(), "t", "kk", sized(100), time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
		t.Fatalf("Put(100 bytes + 2-byte key) = %v, want ErrTooLarge", err)
	}
	if m.Bytes() != 100 || !has(t, m, "k") {
		t.Fatalf("Bytes = %d; want the first entry alone", m.Bytes())
	}

	for _, n := range []int64{0, -1, 7} {
		m := respcache.NewMemory(n, nil)
		if err := m.Put(t.Context(), "t", "k", sized(1), time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
			t.Fatalf("NewMemory(%d).Put = %v, want ErrTooLarge", n, err)
		}
	}
}

func TestMemoryTTL(t *testing.T) {
	clk := clock.NewFake(epoch)
	m := respcache.NewMemory(8000, clk)
	put(t, m, "k", sized(100), time.Minute)
	clk.Advance(time.Minute - time.Nanosecond)
	if !has(t, m, "k") {
		t.Fatal("expired a nanosecond early")
	}
	clk.Advance(time.Nanosecond)
	if has(t, m, "k") {
		t.Fatal("alive at its TTL")
	}
	if m.Bytes() != 0 || m.Len() != 0 {
		t.Fatalf("an expired entry that was read still holds Bytes = %d, Len = %d", m.Bytes(), m.Len())
	}
}

func TestMemoryPutReclaimsExpired(t *testing.T) {
	clk := clock.NewFake(epoch)
	m := respcache.NewMemory(8000, clk)
	put(t, m, "old1", sized(100), time.Second)
	put(t, m, "old2", sized(100), time.Second)
	put(t, m, "live", sized(100), time.Hour)
	clk.Advance(2 * time.Second)
	// old1 and old2 are at the cold end, expired: a Put drops them though
	// the store is far from full; live stops the walk.
	put(t, m, "new", sized(100), time.Hour)
	want := respcache.Size("live", sized(100)) + respcache.Size("new", sized(100))
	if m.Len() != 2 || m.Bytes() != want {
		t.Fatalf("Len = %d, Bytes = %d; want 2, %d", m.Len(), m.Bytes(), want)
	}
}

// TestMemoryTenantBound: a tenant over its bound loses its own least
// recently used entries; the store over its bound loses the least recently
// used of anyone's.
func TestMemoryTenantBound(t *testing.T) {
	m := respcache.NewMemory(1000, clock.NewFake(epoch), respcache.WithTenantBytes(400)) // entries up to 50
	putAs := func(tenant string, i int) {
		t.Helper()
		if err := m.Put(t.Context(), tenant, fmt.Sprint(i), sized(50), time.Hour); err != nil { // 50 with its one-byte key
			t.Fatal(err)
		}
	}
	hasAs := func(tenant string, i int) bool {
		t.Helper()
		_, ok, err := m.Get(t.Context(), tenant, fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for i := range 8 {
		putAs("a", i)
	}
	if !hasAs("a", 0) { // 0 is now a's most recent
		t.Fatal("a/0 missing")
	}
	putAs("a", 8)
	if hasAs("a", 1) || !hasAs("a", 0) || !hasAs("a", 8) || m.TenantBytes("a") != 400 {
		t.Fatalf("a over its bound: want a/1 dropped, a/0 and a/8 kept, 400 bytes (has %d)", m.TenantBytes("a"))
	}
	for i := range 8 {
		putAs("b", i)
	}
	if m.TenantBytes("a") != 400 || m.TenantBytes("b") != 400 {
		t.Fatalf("b's entries dropped a's: a %d, b %d bytes", m.TenantBytes("a"), m.TenantBytes("b"))
	}
	// The store is at 800 of 1000: c's fifth entry takes it over, and the
	// least recently used of all goes: a/2 (a/0 and a/8 were read since).
	for i := range 5 {
		putAs("c", i)
	}
	if m.Bytes() != 1000 || hasAs("a", 2) || !hasAs("a", 3) || m.TenantBytes("c") != 250 {
		t.Fatalf("store over its bound: %d bytes, a/2 kept %v, c %d bytes", m.Bytes(), hasAs("a", 2), m.TenantBytes("c"))
	}
	// An entry over an eighth of the tenant bound is too large, though it
	// would fit the store's.
	if err := m.Put(t.Context(), "d", "k", sized(51), time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
		t.Fatalf("Put(51 bytes under a 400-byte tenant bound) = %v, want ErrTooLarge", err)
	}
}

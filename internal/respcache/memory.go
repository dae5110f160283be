package respcache

import (
	"context"
	"sync"
	"time"

	"github.com/llmgate/llmgate/clock"
)

// Memory is an in-process Store bounded in bytes: when a Put takes it over
// its bound it evicts the least recently used entries (a Get counts as a
// use). An expired entry is dropped when it is next read, or by a later Put
// when it reaches the cold end of the list. It is safe for concurrent use.
type Memory struct {
	clk      clock.Clock
	maxBytes int64
	maxEntry int64 // maxBytes/8: one entry may not flush most of the cache

	mu    sync.Mutex       // protects items, root and bytes
	items map[string]*item // key -> entry
	root  item             // sentinel of the recency list: root.next is the most recent
	bytes int64            // sum of Size over items
}

// expiredPerPut bounds the expired entries a Put drops besides those it
// must evict, so that a Put costs O(1) amortised.
const expiredPerPut = 8

// item is one entry in the recency list. Its entry is never changed after
// it is stored, so it may be read without the mutex.
type item struct {
	key        string
	e          *Entry
	expires    time.Time
	size       int64
	prev, next *item
}

// NewMemory returns a store that holds at most maxBytes (see Size) and
// refuses entries over maxBytes/8 with ErrTooLarge; maxBytes ≤ 0 stores
// nothing. TTLs are measured on clk (clock.Real{} when nil).
func NewMemory(maxBytes int64, clk clock.Clock) *Memory {
	if clk == nil {
		clk = clock.Real{}
	}
	m := &Memory{clk: clk, maxBytes: max(maxBytes, 0), maxEntry: max(maxBytes, 0) / 8, items: make(map[string]*item)}
	m.root.prev, m.root.next = &m.root, &m.root
	return m
}

// Get returns a copy of the live entry under key.
func (m *Memory) Get(_ context.Context, key string) (*Entry, bool, error) {
	now := m.clk.Now()
	m.mu.Lock()
	it := m.items[key]
	if it == nil {
		m.mu.Unlock()
		return nil, false, nil
	}
	if !now.Before(it.expires) {
		m.removeLocked(it)
		m.mu.Unlock()
		return nil, false, nil
	}
	m.unlinkLocked(it)
	m.pushFrontLocked(it)
	e := it.e
	m.mu.Unlock()
	return clone(e), true, nil // outside the lock: e is immutable
}

// Put stores a copy of e under key until ttl has passed on the store's
// clock. An entry whose Size is over maxBytes/8 returns ErrTooLarge and
// leaves any previous entry under key in place.
func (m *Memory) Put(_ context.Context, key string, e *Entry, ttl time.Duration) error {
	if err := check(e, ttl); err != nil {
		return err
	}
	size := Size(key, e)
	if size > m.maxEntry {
		return ErrTooLarge
	}
	it := &item{key: key, e: clone(e), size: size}
	now := m.clk.Now()
	it.expires = now.Add(ttl)
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.items[key]; old != nil {
		m.removeLocked(old)
	}
	m.items[key] = it
	m.pushFrontLocked(it)
	m.bytes += size
	// Reclaim a few expired entries from the cold end, so that memory held
	// by dead entries is returned without a background sweeper.
	for n := 0; n < expiredPerPut && m.root.prev != it && !now.Before(m.root.prev.expires); n++ {
		m.removeLocked(m.root.prev)
	}
	// Bounded: each pass removes an item, and the new one (≤ maxBytes/8)
	// fits once all the others are gone.
	for m.bytes > m.maxBytes && m.root.prev != it {
		m.removeLocked(m.root.prev)
	}
	return nil
}

// Len returns the number of entries held, expired ones not yet dropped
// included.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.items)
}

// Bytes returns the sum of Size over the entries held; it never exceeds the
// bound given to NewMemory.
func (m *Memory) Bytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bytes
}

func (m *Memory) removeLocked(it *item) {
	m.unlinkLocked(it)
	delete(m.items, it.key)
	m.bytes -= it.size
}

func (m *Memory) unlinkLocked(it *item) {
	it.prev.next = it.next
	it.next.prev = it.prev
	it.prev, it.next = nil, nil
}

func (m *Memory) pushFrontLocked(it *item) {
	it.prev, it.next = &m.root, m.root.next
	m.root.next.prev = it
	m.root.next = it
}

package respcache

import (
	"context"
	"sync"
	"time"

	"github.com/llmgate/llmgate/clock"
)

// Memory is an in-process Store bounded in bytes twice: in all, and per
// tenant. When a Put takes its tenant over the tenant bound, that tenant's
// least recently used entries go; when it takes the store over its bound,
// the least recently used entries of any tenant go (a Get counts as a
// use). An expired entry is dropped when it is next read, or by a later
// Put when it reaches the cold end of the list. It is safe for concurrent
// use.
type Memory struct {
	clk         clock.Clock
	maxBytes    int64
	tenantBytes int64
	maxEntry    int64 // an eighth of the smaller bound: one entry may not flush most of the cache

	mu      sync.Mutex         // protects items, root, bytes, tenants
	items   map[ref]*item      // (tenant, key) -> entry
	root    item               // sentinel of the recency list: root.next is the most recent
	bytes   int64              // sum of Size over items
	tenants map[string]*tenant // tenants with entries
}

// ref names an entry.
type ref struct{ tenant, key string }

// tenant is one tenant's entries in recency order, and their bytes.
type tenant struct {
	root  item // sentinel of the tenant's list (tprev, tnext)
	bytes int64
}

// expiredPerPut bounds the expired entries a Put drops besides those it
// must evict, so that a Put costs O(1) amortised.
const expiredPerPut = 8

// item is one entry, in the store's recency list and its tenant's. Its
// entry is never changed after it is stored, so it may be read without the
// mutex.
type item struct {
	ref          ref
	e            *Entry
	expires      time.Time
	size         int64
	t            *tenant
	prev, next   *item // the store's list
	tprev, tnext *item // the tenant's list
}

// NewMemory returns a store that holds at most maxBytes (see Size), and at
// most the WithTenantBytes bound per tenant; it refuses entries over an
// eighth of the smaller bound with ErrTooLarge. maxBytes ≤ 0 stores
// nothing. TTLs are measured on clk (clock.Real{} when nil).
func NewMemory(maxBytes int64, clk clock.Clock, opts ...Option) *Memory {
	if clk == nil {
		clk = clock.Real{}
	}
	o := newOptions(opts)
	maxBytes = max(maxBytes, 0)
	m := &Memory{
		clk: clk, maxBytes: maxBytes, tenantBytes: o.tenantBytes, maxEntry: min(maxBytes, o.tenantBytes) / 8,
		items: make(map[ref]*item), tenants: make(map[string]*tenant),
	}
	m.root.prev, m.root.next = &m.root, &m.root
	return m
}

// Get returns a copy of tenant's live entry under key.
func (m *Memory) Get(_ context.Context, tenant, key string) (*Entry, bool, error) {
	now := m.clk.Now()
	m.mu.Lock()
	it := m.items[ref{tenant, key}]
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

// Put stores a copy of e under tenant and key until ttl has passed on the
// store's clock. An entry whose Size is over the entry bound returns
// ErrTooLarge and leaves any previous entry under key in place.
func (m *Memory) Put(_ context.Context, tenantName, key string, e *Entry, ttl time.Duration) error {
	if err := check(e, ttl); err != nil {
		return err
	}
	size := Size(key, e)
	if size > m.maxEntry {
		return ErrTooLarge
	}
	it := &item{ref: ref{tenantName, key}, e: clone(e), size: size}
	now := m.clk.Now()
	it.expires = now.Add(ttl)
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.items[it.ref]; old != nil {
		m.removeLocked(old)
	}
	t := m.tenants[tenantName]
	if t == nil {
		t = &tenant{}
		t.root.tprev, t.root.tnext = &t.root, &t.root
		m.tenants[tenantName] = t
	}
	it.t = t
	m.items[it.ref] = it
	m.pushFrontLocked(it)
	m.bytes += size
	t.bytes += size
	// Reclaim a few expired entries from the cold end, so that memory held
	// by dead entries is returned without a background sweeper.
	for n := 0; n < expiredPerPut && m.root.prev != it && !now.Before(m.root.prev.expires); n++ {
		m.removeLocked(m.root.prev)
	}
	// Bounded: each pass removes an item, and the new one (within both
	// bounds) fits once all the others are gone.
	for t.bytes > m.tenantBytes && t.root.tprev != it {
		m.removeLocked(t.root.tprev)
	}
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

// TenantBytes returns the sum of Size over tenant's entries; it never
// exceeds the tenant bound.
func (m *Memory) TenantBytes(tenant string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.tenants[tenant]; t != nil {
		return t.bytes
	}
	return 0
}

func (m *Memory) removeLocked(it *item) {
	m.unlinkLocked(it)
	delete(m.items, it.ref)
	m.bytes -= it.size
	if it.t.bytes -= it.size; it.t.root.tnext == &it.t.root {
		delete(m.tenants, it.ref.tenant)
	}
}

// unlinkLocked takes it out of both lists.
func (m *Memory) unlinkLocked(it *item) {
	it.prev.next = it.next
	it.next.prev = it.prev
	it.prev, it.next = nil, nil
	it.tprev.tnext = it.tnext
	it.tnext.tprev = it.tprev
	it.tprev, it.tnext = nil, nil
}

// pushFrontLocked makes it the most recent of both lists.
func (m *Memory) pushFrontLocked(it *item) {
	it.prev, it.next = &m.root, m.root.next
	m.root.next.prev = it
	m.root.next = it
	r := &it.t.root
	it.tprev, it.tnext = r, r.tnext
	r.tnext.tprev = it
	r.tnext = it
}

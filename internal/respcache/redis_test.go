package respcache_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/internal/testutil"
)

var prefixSeq atomic.Int64

// uniquePrefix keeps tests sharing one server apart.
func uniquePrefix() string { return fmt.Sprintf("test%d:", prefixSeq.Add(1)) }

// advanceRedis makes d pass for every key under prefix: a key whose PTTL
// is at most d is deleted, the others get d less. Redis reads its own
// clock, which a test cannot move, so this is the closest stand-in.
func advanceRedis(t *testing.T, c rueidis.Client, prefix string, d time.Duration) {
	t.Helper()
	ctx := t.Context()
	keys, err := c.Do(ctx, c.B().Keys().Pattern(prefix+"*").Build()).AsStrSlice()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	for _, k := range keys {
		pttl, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PTTL %s: %v", k, err)
		}
		if pttl < 0 {
			t.Fatalf("key %s has no TTL (PTTL %d)", k, pttl)
		}
		if pttl <= d.Milliseconds() {
			err = c.Do(ctx, c.B().Del().Key(k).Build()).Error()
		} else {
			err = c.Do(ctx, c.B().Pexpire().Key(k).Milliseconds(pttl-d.Milliseconds()).Build()).Error()
		}
		if err != nil {
			t.Fatalf("advancing %s: %v", k, err)
		}
	}
}

func TestRedisConformance(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	runConformance(t, func(t *testing.T) harness {
		prefix := uniquePrefix()
		return harness{
			store:   respcache.NewRedis(c, prefix, respcache.WithMaxEntryBytes(conformanceMaxEntry), respcache.WithTenantBytes(conformanceTenantBytes)),
			tenant:  "t" + strings.TrimSuffix(prefix, ":"),
			advance: func(t *testing.T, d time.Duration) { advanceRedis(t, c, prefix, d) },
		}
	})
}

// TestRedisTenantSlots: on a Cluster every key of one tenant (entries,
// index, sizes) is in one slot, whatever the tenant's name, and tenants
// spread over the shards.
func TestRedisTenantSlots(t *testing.T) {
	c := testutil.SharedCluster(t)
	s := respcache.NewRedis(c.Client(t), uniquePrefix())
	ctx := t.Context()
	e := &respcache.Entry{Status: 200, Body: []byte(`{"object":"list","data":[]}`)}
	masters := map[*testutil.Redis]bool{}
	for i, tenant := range []string{"team-a", "team-b", "{x}", "", "a}b{c", "t@example.com", "t0", "t1", "t2", "t3", "t4", "t5"} {
		k := fmt.Sprint("k", i)
		if err := s.Put(ctx, tenant, k, e, time.Minute); err != nil {
			t.Fatalf("Put(%q): %v", tenant, err)
		}
		if _, ok, err := s.Get(ctx, tenant, k); !ok || err != nil {
			t.Fatalf("Get(%q) = %v, %v", tenant, ok, err)
		}
		slot, err := c.KeySlot(ctx, s.RedisKey(tenant, k))
		if err != nil {
			t.Fatal(err)
		}
		for _, other := range []string{s.RedisKey(tenant, "other"), s.IndexKey(tenant), s.SizesKey(tenant)} {
			if o, err := c.KeySlot(ctx, other); err != nil || o != slot {
				t.Fatalf("tenant %q: %s in slot %d, %s in %d (%v)", tenant, s.RedisKey(tenant, k), slot, other, o, err)
			}
		}
		m, err := c.MasterOf(ctx, s.RedisKey(tenant, k))
		if err != nil {
			t.Fatal(err)
		}
		masters[m] = true
	}
	if len(masters) < 2 {
		t.Errorf("12 tenants on %d master(s), want them spread", len(masters))
	}
}

func TestRedisKeysAndTTL(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	e := &respcache.Entry{Status: 200, Body: []byte("{}")}

	s := respcache.NewRedis(c, "")
	if got := s.RedisKey("team-a", "abc"); got != "llmgate:cache:{team-a}:e:abc" {
		t.Fatalf("RedisKey = %q, want the default prefix and the tenant's tag", got)
	}
	if got := s.IndexKey("team-a") + " " + s.SizesKey("team-a"); got != "llmgate:cache:{team-a}:i llmgate:cache:{team-a}:s" {
		t.Fatalf("IndexKey, SizesKey = %s", got)
	}
	if err := s.Put(t.Context(), "team-a", "abc", e, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"llmgate:cache:{team-a}:e:abc", "llmgate:cache:{team-a}:i", "llmgate:cache:{team-a}:s"} {
		// The index and sizes expire at the entry's expiry rounded up to
		// the millisecond: up to 1 ms more.
		if pttl := r.Int(t, "PTTL", k); pttl <= 89_000 || pttl > 90_001 {
			t.Fatalf("PTTL %s = %d ms, want just under 90000", k, pttl)
		}
	}
	// The index lives as long as the longest-lived entry.
	if err := s.Put(t.Context(), "team-a", "long", e, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(t.Context(), "team-a", "short", e, time.Minute); err != nil {
		t.Fatal(err)
	}
	if pttl := r.Int(t, "PTTL", s.IndexKey("team-a")); pttl <= 3_599_000 || pttl > 3_600_001 { // rounded up to the ms
		t.Fatalf("PTTL of the index = %d ms, want just under 3600000", pttl)
	}

	s2 := respcache.NewRedis(c, "other:")
	if err := s2.Put(t.Context(), "t", "abc", e, time.Hour); err != nil {
		t.Fatal(err)
	}
	if pttl := r.Int(t, "PTTL", "other:{t}:e:abc"); pttl <= 3_599_000 || pttl > 3_600_000 {
		t.Fatalf("PTTL = %d ms, want just under 3600000", pttl)
	}
	// A TTL under a millisecond is rounded up, not down to "no expiry" or
	// an error from Redis.
	if err := s2.Put(t.Context(), "t", "tiny", e, time.Nanosecond); err != nil {
		t.Fatalf("Put(1ns): %v", err)
	}
	if pttl := r.Int(t, "PTTL", "other:{t}:e:tiny"); pttl > 1 || pttl == -1 {
		t.Fatalf("PTTL after a 1ns TTL = %d ms, want ≤ 1 (or -2: gone)", pttl)
	}
}

// TestRedisTenantAccounting checks put.lua's bookkeeping: the total is the
// sum of the sizes, an overwrite swaps its size, an expired entry leaves
// the index at the next Put, and losing the index (evicted by Redis) only
// makes the count start afresh.
func TestRedisTenantAccounting(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	const bound = 8000
	s := respcache.NewRedis(c, "", respcache.WithTenantBytes(bound))
	ctx := t.Context()
	put := func(key string, n int, ttl time.Duration) {
		t.Helper()
		if err := s.Put(ctx, "a", key, &respcache.Entry{Status: 200, Body: make([]byte, n)}, ttl); err != nil {
			t.Fatalf("Put(%s): %v", key, err)
		}
	}
	// check compares the index with the live keys wanted, and the total
	// with the sum of the sizes.
	check := func(live ...string) {
		t.Helper()
		members, err := c.Do(ctx, c.B().Zrange().Key(s.IndexKey("a")).Min("0").Max("-1").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(members, live) {
			t.Fatalf("index %v, want %v", members, live)
		}
		sizes, err := c.Do(ctx, c.B().Hgetall().Key(s.SizesKey("a")).Build()).AsIntMap()
		if err != nil {
			t.Fatal(err)
		}
		sum := int64(0)
		for _, k := range live {
			if sizes["k"+k] <= int64(len(k)) {
				t.Fatalf("size of %s: %d", k, sizes["k"+k])
			}
			sum += sizes["k"+k]
		}
		if sizes["n"] != sum || sum > bound || len(sizes) != len(live)+1 {
			t.Fatalf("sizes %v: total %d, want %d (bound %d)", sizes, sizes["n"], sum, bound)
		}
	}
	put("x", 100, time.Hour)
	put("y", 200, time.Hour)
	check("x", "y")
	put("x", 300, time.Hour) // an overwrite: x is now the newest
	check("y", "x")
	put("gone", 100, time.Millisecond)
	for r.Int(t, "EXISTS", s.RedisKey("a", "gone")) == 1 {
		time.Sleep(time.Millisecond) // Redis's expiry: nothing to wait on
	}
	put("z", 100, time.Hour)
	check("y", "x", "z")
	// 900-byte entries: the bound keeps the newest that fit, oldest go.
	for i := range 10 {
		put(fmt.Sprint("b", i), 900, time.Hour)
	}
	check("b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9")
	for _, gone := range []string{"x", "y", "z", "b0", "b1"} {
		if n := r.Int(t, "EXISTS", s.RedisKey("a", gone)); n != 0 {
			t.Errorf("%s dropped from the index but still stored", gone)
		}
	}
	// Redis evicts the index: the next Puts count afresh, within the bound.
	if err := c.Do(ctx, c.B().Del().Key(s.IndexKey("a")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		put(fmt.Sprint("c", i), 900, time.Hour)
	}
	sizes, err := c.Do(ctx, c.B().Hgetall().Key(s.SizesKey("a")).Build()).AsIntMap()
	if err != nil {
		t.Fatal(err)
	}
	if sizes["n"] > bound || sizes["n"] < 3*900 {
		t.Fatalf("after losing the index: total %d, want the three new entries' within %d", sizes["n"], bound)
	}
}

func TestRedisTooLarge(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	s := respcache.NewRedis(c, "", respcache.WithMaxEntryBytes(1000))
	if err := s.Put(t.Context(), "t", "k", &respcache.Entry{Status: 200, Body: make([]byte, 980)}, time.Hour); err != nil {
		t.Fatalf("Put(980 bytes + 15 of framing under a 1000-byte bound): %v", err)
	}
	if err := s.Put(t.Context(), "t", "big", &respcache.Entry{Status: 200, Body: make([]byte, 1000)}, time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
		t.Fatalf("Put(1000 bytes + framing) = %v, want ErrTooLarge", err)
	}
	if n := r.Int(t, "EXISTS", s.RedisKey("t", "big")); n != 0 {
		t.Fatal("an oversize entry was written")
	}

	// The default bound is 8 MiB.
	d := respcache.NewRedis(c, "")
	if err := d.Put(t.Context(), "t", "big", &respcache.Entry{Status: 200, Body: make([]byte, 8<<20)}, time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
		t.Fatalf("Put(8 MiB + framing) = %v, want ErrTooLarge", err)
	}
	if err := d.Put(t.Context(), "t", "fits", &respcache.Entry{Status: 200, Body: make([]byte, 8<<20-100)}, time.Hour); err != nil {
		t.Fatalf("Put(8 MiB - 100) = %v", err)
	}
}

// logRecorder is a slog.Handler that keeps the records it is given.
type logRecorder struct {
	mu   sync.Mutex // protects recs
	recs []slog.Record
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
	return nil
}
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

func (h *logRecorder) take() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.recs
	h.recs = nil
	return r
}

func TestRedisCorruptValueIsAMiss(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	logs := &logRecorder{}
	s := respcache.NewRedis(c, "", respcache.WithLogger(slog.New(logs)))

	e := &respcache.Entry{Status: 200, Body: []byte(`{"secret":"answer text"}`), Events: nil}
	if err := s.Put(t.Context(), "t", "good", e, time.Hour); err != nil {
		t.Fatal(err)
	}
	good, err := c.Do(t.Context(), c.B().Get().Key(s.RedisKey("t", "good")).Build()).AsBytes()
	if err != nil {
		t.Fatal(err)
	}
	good = bytes.Clone(good)

	values := map[string][]byte{
		"empty":          {},
		"text":           []byte("hello"),
		"json":           []byte(`{"Status":200,"Body":"e30="}`),
		"magic only":     []byte("LGRC"),
		"future version": append([]byte("LGRC\x02"), good[5:]...),
		"no checksum":    good[:len(good)-4],
		"extra byte":     append(bytes.Clone(good), 0),
	}
	for i := range good {
		flipped := bytes.Clone(good)
		flipped[i] ^= 0x20
		values[fmt.Sprintf("bit flipped at %d", i)] = flipped
		values[fmt.Sprintf("truncated to %d", i)] = good[:i]
	}
	for name, v := range values {
		if err := c.Do(t.Context(), c.B().Set().Key(s.RedisKey("t", "bad")).Value(rueidis.BinaryString(v)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		got, ok, err := s.Get(t.Context(), "t", "bad")
		if got != nil || ok || err != nil {
			t.Fatalf("%s: Get = %v, %v, %v; want a plain miss", name, got, ok, err)
		}
		recs := logs.take()
		if len(recs) != 1 || recs[0].Level != slog.LevelError {
			t.Fatalf("%s: logged %v, want one error record", name, recs)
		}
		var text strings.Builder
		text.WriteString(recs[0].Message)
		recs[0].Attrs(func(a slog.Attr) bool { text.WriteString(" " + a.String()); return true })
		if strings.Contains(text.String(), "answer text") {
			t.Fatalf("%s: the log record carries the cached answer: %s", name, text.String())
		}
	}
	// Not a string at all.
	if err := c.Do(t.Context(), c.B().Del().Key(s.RedisKey("t", "bad")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(t.Context(), c.B().Lpush().Key(s.RedisKey("t", "bad")).Element("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Get(t.Context(), "t", "bad"); ok || err == nil {
		t.Fatalf("Get of a list = %v, %v; want an error (WRONGTYPE)", ok, err)
	}
	// The next Put repairs a corrupt key.
	if err := c.Do(t.Context(), c.B().Set().Key(s.RedisKey("t", "bad")).Value("junk").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(t.Context(), "t", "bad", e, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Get(t.Context(), "t", "bad"); !ok || err != nil {
		t.Fatalf("after a Put over junk: Get = %v, %v", ok, err)
	}
}

func TestRedisDown(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	s := respcache.NewRedis(c, "")
	r.Stop()
	// The client may keep redialling until the deadline: keep it short.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, ok, err := s.Get(ctx, "t", "k"); ok || err == nil || !strings.HasPrefix(err.Error(), "respcache: redis get: ") {
		t.Fatalf("Get with the server down = %v, %v; want an error", ok, err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := s.Put(ctx, "t", "k", &respcache.Entry{Status: 200, Body: []byte("{}")}, time.Hour); err == nil || !strings.HasPrefix(err.Error(), "respcache: redis put: ") {
		t.Fatalf("Put with the server down = %v; want an error", err)
	}
}

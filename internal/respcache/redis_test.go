package respcache_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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
			store:   respcache.NewRedis(c, prefix, respcache.WithMaxEntryBytes(conformanceMaxEntry)),
			advance: func(t *testing.T, d time.Duration) { advanceRedis(t, c, prefix, d) },
		}
	})
}

// TestRedisCluster proves the one-key layout works against Redis Cluster.
func TestRedisCluster(t *testing.T) {
	r := testutil.StartCluster(t)
	s := respcache.NewRedis(r.ClusterClient(t), "")
	e := &respcache.Entry{Status: 200, Body: []byte(`{"object":"list","data":[]}`)}
	for i := range 20 {
		k := fmt.Sprint("k", i)
		if err := s.Put(t.Context(), k, e, time.Minute); err != nil {
			t.Fatalf("Put(%s): %v", k, err)
		}
		if _, ok, err := s.Get(t.Context(), k); !ok || err != nil {
			t.Fatalf("Get(%s) = %v, %v", k, ok, err)
		}
	}
}

func TestRedisKeysAndTTL(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	e := &respcache.Entry{Status: 200, Body: []byte("{}")}

	s := respcache.NewRedis(c, "")
	if got := s.RedisKey("abc"); got != "llmgate:cache:abc" {
		t.Fatalf("RedisKey = %q, want the default prefix", got)
	}
	if err := s.Put(t.Context(), "abc", e, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := r.Int(t, "EXISTS", "llmgate:cache:abc"); n != 1 {
		t.Fatalf("EXISTS llmgate:cache:abc = %d", n)
	}
	if pttl := r.Int(t, "PTTL", "llmgate:cache:abc"); pttl <= 89_000 || pttl > 90_000 {
		t.Fatalf("PTTL = %d ms, want just under 90000", pttl)
	}

	s2 := respcache.NewRedis(c, "other:")
	if err := s2.Put(t.Context(), "abc", e, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := r.Int(t, "EXISTS", "other:abc"); n != 1 {
		t.Fatalf("EXISTS other:abc = %d", n)
	}
	if pttl := r.Int(t, "PTTL", "other:abc"); pttl <= 3_599_000 || pttl > 3_600_000 {
		t.Fatalf("PTTL = %d ms, want just under 3600000", pttl)
	}
	// A TTL under a millisecond is rounded up, not down to "no expiry" or
	// an error from Redis.
	if err := s2.Put(t.Context(), "tiny", e, time.Nanosecond); err != nil {
		t.Fatalf("Put(1ns): %v", err)
	}
	if pttl := r.Int(t, "PTTL", "other:tiny"); pttl > 1 || pttl == -1 {
		t.Fatalf("PTTL after a 1ns TTL = %d ms, want ≤ 1 (or -2: gone)", pttl)
	}
}

func TestRedisTooLarge(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	s := respcache.NewRedis(c, "", respcache.WithMaxEntryBytes(1000))
	if err := s.Put(t.Context(), "k", &respcache.Entry{Status: 200, Body: make([]byte, 980)}, time.Hour); err != nil {
		t.Fatalf("Put(980 bytes + 15 of framing under a 1000-byte bound): %v", err)
	}
	if err := s.Put(t.Context(), "big", &respcache.Entry{Status: 200, Body: make([]byte, 1000)}, time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
		t.Fatalf("Put(1000 bytes + framing) = %v, want ErrTooLarge", err)
	}
	if n := r.Int(t, "EXISTS", s.RedisKey("big")); n != 0 {
		t.Fatal("an oversize entry was written")
	}

	// The default bound is 8 MiB.
	d := respcache.NewRedis(c, "")
	if err := d.Put(t.Context(), "big", &respcache.Entry{Status: 200, Body: make([]byte, 8<<20)}, time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
		t.Fatalf("Put(8 MiB + framing) = %v, want ErrTooLarge", err)
	}
	if err := d.Put(t.Context(), "fits", &respcache.Entry{Status: 200, Body: make([]byte, 8<<20-100)}, time.Hour); err != nil {
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
	if err := s.Put(t.Context(), "good", e, time.Hour); err != nil {
		t.Fatal(err)
	}
	good, err := c.Do(t.Context(), c.B().Get().Key(s.RedisKey("good")).Build()).AsBytes()
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
		if err := c.Do(t.Context(), c.B().Set().Key(s.RedisKey("bad")).Value(rueidis.BinaryString(v)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		got, ok, err := s.Get(t.Context(), "bad")
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
	if err := c.Do(t.Context(), c.B().Del().Key(s.RedisKey("bad")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(t.Context(), c.B().Lpush().Key(s.RedisKey("bad")).Element("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Get(t.Context(), "bad"); ok || err == nil {
		t.Fatalf("Get of a list = %v, %v; want an error (WRONGTYPE)", ok, err)
	}
	// The next Put repairs a corrupt key.
	if err := c.Do(t.Context(), c.B().Set().Key(s.RedisKey("bad")).Value("junk").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(t.Context(), "bad", e, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Get(t.Context(), "bad"); !ok || err != nil {
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
	if _, ok, err := s.Get(ctx, "k"); ok || err == nil || !strings.HasPrefix(err.Error(), "respcache: redis get: ") {
		t.Fatalf("Get with the server down = %v, %v; want an error", ok, err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := s.Put(ctx, "k", &respcache.Entry{Status: 200, Body: []byte("{}")}, time.Hour); err == nil || !strings.HasPrefix(err.Error(), "respcache: redis put: ") {
		t.Fatalf("Put with the server down = %v; want an error", err)
	}
}

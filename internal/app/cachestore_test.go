package app

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestOpenCacheWhereConfigured: the cache goes where cache.store says,
// and a cache Redis that is down at start does not stop the gateway: its
// calls fail (the gateway's breaker makes them misses) until it is up,
// then it is connected in the background.
func TestOpenCacheWhereConfigured(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	cfg := func(store, cache string) *config.Config {
		c := &config.Config{Store: store}
		c.Cache.Store, c.Cache.MaxBytes, c.Cache.MaxBytesPerTenant = cache, 1<<20, 1<<20
		return c
	}
	r := testutil.StartRedis(t)
	coord := r.Client(t)
	for _, tc := range []struct {
		name, store, cache string
		want               string // the store's type
	}{
		{"memory, shared", "memory", "", "*respcache.Memory"},
		{"redis, shared", r.URL(), "", "*respcache.Redis"},
		{"redis, the same URL", r.URL(), r.URL(), "*respcache.Redis"},
		{"redis, cache in memory", r.URL(), "memory", "*respcache.Memory"},
	} {
		c := coord
		if tc.store == "memory" {
			c = nil
		}
		cs := openCache(cfg(tc.store, tc.cache), log, c)
		if got := fmt.Sprintf("%T", cs.store); got != tc.want || cs.ping != nil {
			t.Errorf("%s: a %s, ping %v; want a %s without ping", tc.name, got, cs.ping != nil, tc.want)
		}
		cs.close()
	}

	// A Redis of its own, down at start.
	own := testutil.StartRedis(t)
	own.Stop()
	cs := openCache(cfg(r.URL(), own.URL()), log, coord)
	defer cs.close()
	e := &respcache.Entry{Status: 200, Body: []byte("{}")}
	if err := cs.store.Put(t.Context(), "t", "k", e, time.Minute); !errors.Is(err, errCacheNotConnected) {
		t.Fatalf("Put with the cache store down at start = %v", err)
	}
	if err := cs.ping(t.Context()); err == nil {
		t.Fatal("ping with the cache store down succeeded")
	}
	if err := own.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "the cache store is connected", func() bool { return cs.ping(t.Context()) == nil })
	if err := cs.store.Put(t.Context(), "t", "k", e, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := own.Int(t, "EXISTS", "llmgate:cache:{t}:e:k"); n != 1 {
		t.Fatal("the entry is not in the cache's own Redis")
	}
	if n := r.Int(t, "DBSIZE"); n != 0 {
		t.Fatalf("the coordination Redis holds %d keys", n)
	}
}

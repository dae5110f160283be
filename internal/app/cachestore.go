package app

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/internal/storeurl"
)

// cacheStore is where the response cache keeps answers.
type cacheStore struct {
	store respcache.Store
	// ping reports whether the cache's own Redis answers; nil when the
	// cache shares the coordination store or lives in this process.
	ping  func(context.Context) error
	close func()
}

// openCache opens the cache store cfg describes: coord, the coordination
// store's Redis client (nil for the memory store), unless cache.store
// names another.
func openCache(cfg *config.Config, log *slog.Logger, coord rueidis.Client) *cacheStore {
	opts := []respcache.Option{respcache.WithLogger(log), respcache.WithTenantBytes(int64(cfg.Cache.MaxBytesPerTenant))}
	switch {
	case cfg.CacheSharesStore() && coord != nil:
		return &cacheStore{store: respcache.NewRedis(coord, "", opts...), close: func() {}}
	case cfg.CacheSharesStore() || storeurl.IsMemory(cfg.Cache.Store):
		return &cacheStore{store: respcache.NewMemory(int64(cfg.Cache.MaxBytes), clock.Real{}, opts...), close: func() {}}
	}
	r := &remoteCache{url: cfg.Cache.Store, cfg: cfg, log: log, opts: opts, stop: make(chan struct{}), done: make(chan struct{})}
	if r.connect() {
		close(r.done)
	} else {
		log.Warn("cache.store is not reachable: serving without the cache, connecting in the background", "cache_store", storeurl.Redact(cfg.Cache.Store))
		go r.retry()
	}
	return &cacheStore{store: r, ping: r.ping, close: r.close}
}

// remoteCache is the cache on a Redis of its own. Its absence must not
// stop the gateway: if it cannot be reached at start, it is connected in
// the background, and until then every call fails (the gateway's breaker
// turns the cache off).
type remoteCache struct {
	url  string
	cfg  *config.Config
	log  *slog.Logger
	opts []respcache.Option

	mu     sync.Mutex // protects client, store
	client rueidis.Client
	store  *respcache.Redis

	stop chan struct{} // closed by close
	done chan struct{} // closed when nothing more connects
}

// errCacheNotConnected is the failure of a call before the cache's Redis
// was ever reached.
var errCacheNotConnected = errors.New("cache store not connected yet")

// connect tries once to open the Redis, warns about its settings, and
// reports whether it is open.
func (r *remoteCache) connect() bool {
	// No retries: a failed cache call is a miss that costs nothing, where
	// retrying a Redis that is down would hold the request until its
	// deadline.
	client, err := storeurl.OpenRedisWith(r.url, func(o *rueidis.ClientOption) { o.DisableRetry = true })
	if err != nil {
		r.log.Debug("cache store not reachable", "err", err) // the error shows no password
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeCheckTimeout)
	warnings, err := cacheRedisWarnings(ctx, client, r.cfg)
	cancel()
	if err != nil {
		r.log.Warn("could not check the cache store's settings", "err", err)
	}
	for _, w := range warnings {
		r.log.Warn(w)
	}
	r.mu.Lock()
	r.client, r.store = client, respcache.NewRedis(client, "", r.opts...)
	r.mu.Unlock()
	return true
}

// retry connects with a growing pause until it succeeds or close is called.
func (r *remoteCache) retry() {
	defer close(r.done)
	wait := time.Second
	for {
		t := time.NewTimer(wait)
		select {
		case <-r.stop:
			t.Stop()
			return
		case <-t.C:
		}
		if r.connect() {
			r.log.Info("cache store connected: answers are cached again")
			return
		}
		wait = min(2*wait, 30*time.Second)
	}
}

func (r *remoteCache) current() *respcache.Redis {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.store
}

func (r *remoteCache) Get(ctx context.Context, tenant, key string) (*respcache.Entry, bool, error) {
	s := r.current()
	if s == nil {
		return nil, false, errCacheNotConnected
	}
	return s.Get(ctx, tenant, key)
}

func (r *remoteCache) Put(ctx context.Context, tenant, key string, e *respcache.Entry, ttl time.Duration) error {
	s := r.current()
	if s == nil {
		return errCacheNotConnected
	}
	return s.Put(ctx, tenant, key, e, ttl)
}

func (r *remoteCache) ping(ctx context.Context) error {
	r.mu.Lock()
	c := r.client
	r.mu.Unlock()
	if c == nil {
		return errCacheNotConnected
	}
	return c.Do(ctx, c.B().Ping().Build()).Error()
}

func (r *remoteCache) close() {
	close(r.stop)
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client != nil {
		r.client.Close()
	}
}

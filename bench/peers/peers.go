package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis/rueidislock"

	"github.com/llmgate/llmgate/internal/lockbench"
	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/lock"
)

// peerAlgos are the other libraries' locks, selectable with --algo.
var (
	_ lockbench.Pinger = (*goredisPollMutex)(nil)
	_ lockbench.Pinger = (*redsyncMutex)(nil)
	_ lockbench.Pinger = (*redislockMutex)(nil)
	_ lockbench.Pinger = rueidislockMutex{}
	_ lockbench.Pinger = (*handoffMutex)(nil)
)

func peerAlgos() []lockbench.Algo {
	return []lockbench.Algo{goredisPoll(), redsyncAlgo(), redislockAlgo(), rueidislockAlgo(), handoffAlgo(false, false, false), handoffAlgo(true, false, false), handoffAlgo(false, true, false), handoffAlgo(true, true, false), handoffAlgo(true, true, true)}
}

// openGoRedis connects a go-redis client and makes sure it is connected, so
// the first acquisition does not pay for the dial.
func openGoRedis(store string) (*goredis.Client, error) {
	opt, err := goredis.ParseURL(store)
	if err != nil {
		return nil, fmt.Errorf("bad store URL %q: %w", storeurl.Redact(store), err)
	}
	c := goredis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("cannot reach %s: %w", storeurl.Redact(store), err)
	}
	return c, nil
}

// goRedisClient adapts *goredis.Client to lockbench.SharedOrOwn's Close().
type goRedisClient struct{ *goredis.Client }

func (c goRedisClient) Close() { _ = c.Client.Close() }

func openGoRedisClient(store string) (goRedisClient, error) {
	c, err := openGoRedis(store)
	return goRedisClient{c}, err
}

// goredisPoll is the reference polling lock on go-redis: SET NX PX, retried
// every millisecond, Lua compare-and-delete release.
func goredisPoll() lockbench.Algo {
	release := goredis.NewScript(lockbench.CompareAndDelete)
	return lockbench.Algo{
		Name:    "goredis-poll",
		Summary: "go-redis v9: SET NX PX, retry every 1ms, Lua compare-and-delete release",
		Open: func(_ context.Context, s lockbench.Setup) (lockbench.Factory, func() error, error) {
			return lockbench.SharedOrOwn(s, openGoRedisClient, func(c goRedisClient) (lockbench.Mutex, error) {
				return &goredisPollMutex{c: c.Client, ttl: s.TTL, release: release}, nil
			})
		},
	}
}

type goredisPollMutex struct {
	c       *goredis.Client
	ttl     time.Duration
	release *goredis.Script
	timer   *time.Timer
}

func (m *goredisPollMutex) Lock(ctx context.Context, key string) (func(context.Context) error, error) {
	token := lock.NewToken()
	for {
		err := m.c.SetArgs(ctx, key, token, goredis.SetArgs{Mode: "NX", TTL: m.ttl}).Err()
		if err == nil {
			return func(ctx context.Context) error {
				return lockbench.Released(m.release.Run(ctx, m.c, []string{key}, token).Int64())
			}, nil
		}
		if !errors.Is(err, goredis.Nil) {
			return nil, err
		}
		if m.timer == nil {
			m.timer = time.NewTimer(lockbench.PollRetry)
		} else {
			m.timer.Reset(lockbench.PollRetry)
		}
		select {
		case <-m.timer.C:
		case <-ctx.Done():
			return nil, errors.Join(lock.ErrNotObtained, ctx.Err())
		}
	}
}

func (m *goredisPollMutex) Close() error { return nil }

func (m *goredisPollMutex) Ping(ctx context.Context) error { return m.c.Ping(ctx).Err() }

// redsyncAlgo is go-redsync/redsync v4 with its defaults (32 tries, 50-250ms
// random retry delay) over one go-redis pool; only the expiry follows --ttl.
// When the tries run out, the worker simply calls Lock again until the run
// ends, so its wait covers all of them.
func redsyncAlgo() lockbench.Algo {
	return lockbench.Algo{
		Name:    "redsync",
		Summary: "go-redsync/redsync v4 defaults (32 tries, 50-250ms random delay), one pool, expiry = --ttl",
		Open: func(_ context.Context, s lockbench.Setup) (lockbench.Factory, func() error, error) {
			return lockbench.SharedOrOwn(s, openGoRedisClient, func(c goRedisClient) (lockbench.Mutex, error) {
				return &redsyncMutex{rs: redsync.New(redsyncgoredis.NewPool(c.Client)), ttl: s.TTL, c: c.Client}, nil
			})
		},
	}
}

type redsyncMutex struct {
	rs  *redsync.Redsync
	ttl time.Duration
	c   *goredis.Client
}

func (m *redsyncMutex) Lock(ctx context.Context, key string) (func(context.Context) error, error) {
	mu := m.rs.NewMutex(key, redsync.WithExpiry(m.ttl))
	for {
		err := mu.LockContext(ctx)
		if err == nil {
			return func(ctx context.Context) error {
				ok, err := mu.UnlockContext(ctx)
				if err != nil {
					return err
				}
				if !ok {
					return lock.ErrNotHeld
				}
				return nil
			}, nil
		}
		if ctx.Err() != nil {
			return nil, errors.Join(lock.ErrNotObtained, ctx.Err())
		}
		var taken *redsync.ErrTaken
		if !errors.Is(err, redsync.ErrFailed) && !errors.As(err, &taken) {
			return nil, err
		}
	}
}

func (m *redsyncMutex) Close() error { return nil }

func (m *redsyncMutex) Ping(ctx context.Context) error { return m.c.Ping(ctx).Err() }

// redislockAlgo is bsm/redislock with a 1ms linear retry.
func redislockAlgo() lockbench.Algo {
	return lockbench.Algo{
		Name:    "redislock",
		Summary: "bsm/redislock, LinearBackoff(1ms)",
		Open: func(_ context.Context, s lockbench.Setup) (lockbench.Factory, func() error, error) {
			opts := &redislock.Options{RetryStrategy: redislock.LinearBackoff(time.Millisecond)}
			return lockbench.SharedOrOwn(s, openGoRedisClient, func(c goRedisClient) (lockbench.Mutex, error) {
				return &redislockMutex{l: redislock.New(c.Client), ttl: s.TTL, opts: opts, c: c.Client}, nil
			})
		},
	}
}

type redislockMutex struct {
	l    *redislock.Client
	ttl  time.Duration
	opts *redislock.Options
	c    *goredis.Client
}

func (m *redislockMutex) Lock(ctx context.Context, key string) (func(context.Context) error, error) {
	l, err := m.l.Obtain(ctx, key, m.ttl, m.opts)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errors.Join(lock.ErrNotObtained, ctx.Err())
		}
		return nil, err
	}
	return l.Release, nil
}

func (m *redislockMutex) Close() error { return nil }

func (m *redislockMutex) Ping(ctx context.Context) error { return m.c.Ping(ctx).Err() }

// rueidislockAlgo is rueidis's rueidislock tuned as its README says for one
// Redis >= 7.0.5: KeyMajority 1, NoLoopTracking. Waiters retry when
// client-side caching tells them the key changed (so the client cache stays
// on). Its lease is its own KeyValidity (5s, auto-extended), not --ttl.
func rueidislockAlgo() lockbench.Algo {
	return lockbench.Algo{
		Name:    "rueidislock",
		Summary: "rueidis/rueidislock, KeyMajority 1, NoLoopTracking (its README's tuning for one Redis)",
		Open: func(_ context.Context, s lockbench.Setup) (lockbench.Factory, func() error, error) {
			opt, err := storeurl.RedisOption(s.Store)
			if err != nil {
				return nil, nil, err
			}
			opt.DisableCache = false  // it waits on client-side caching invalidations
			opt.PipelineMultiplex = 0 // rueidis's own default, not llmgate's one connection
			open := func(string) (rueidislock.Locker, error) {
				return rueidislock.NewLocker(rueidislock.LockerOption{ClientOption: opt, KeyMajority: 1, NoLoopTracking: true})
			}
			return lockbench.SharedOrOwn(s, open, func(l rueidislock.Locker) (lockbench.Mutex, error) {
				return rueidislockMutex{l: l}, nil
			})
		},
	}
}

type rueidislockMutex struct{ l rueidislock.Locker }

func (m rueidislockMutex) Lock(ctx context.Context, key string) (func(context.Context) error, error) {
	_, cancel, err := m.l.WithContext(ctx, key)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errors.Join(lock.ErrNotObtained, ctx.Err())
		}
		return nil, err
	}
	// cancel releases the key and waits until the DEL is done.
	return func(context.Context) error { cancel(); return nil }, nil
}

func (m rueidislockMutex) Close() error { return nil }

func (m rueidislockMutex) Ping(ctx context.Context) error {
	c := m.l.Client()
	return c.Do(ctx, c.B().Ping().Build()).Error()
}

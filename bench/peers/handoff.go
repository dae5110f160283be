package main

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/lockbench"
	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/lock"
)

// The minimal hand-off lock: a measuring stick for lock/redis's fair mode,
// not a lock to use. A waiter joins a list; the release pops its head, makes
// it the owner and wakes it through its own list (BLPOP). It has no fencing
// tokens, no waiter leases (a waiter that dies while queued is handed the
// lock anyway, and the queue stalls for a TTL), no lost-wake-up recovery and
// no hash tags: what is left is what a strict cross-process hand-off
// cannot do without. Compare its Redis time per critical section with
// llmgate's to price the features.
// handOn is the end of a release: pass the lock to the head waiter and wake
// it, or free it.
const handOn = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local n = redis.call('LPOP', KEYS[1] .. ':q')
if n then
  redis.call('SET', KEYS[1], n, 'PX', ARGV[2])
  redis.call('LPUSH', KEYS[1] .. ':w:' .. n, '1')
  return 2
end
redis.call('DEL', KEYS[1])
return 1`

var (
	handoffAcquire = rueidis.NewLuaScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
redis.call('RPUSH', KEYS[1] .. ':q', ARGV[1])
return 0`)
	handoffRelease = rueidis.NewLuaScript(handOn)
	// handoffLeave takes a waiter whose context ended out of the queue and
	// passes on a lock handed to it meanwhile.
	handoffLeave = rueidis.NewLuaScript(`
redis.call('LREM', KEYS[1] .. ':q', 0, ARGV[1])
redis.call('DEL', KEYS[1] .. ':w:' .. ARGV[1])` + handOn)
)

func handoffAlgo() lockbench.Algo {
	return lockbench.Algo{
		Name:    "handoff-min",
		Summary: "measuring stick: FIFO hand-off in Lua, BLPOP wake-ups, no fences or waiter leases (rueidis)",
		Fair:    true, // always FIFO: --fair changes nothing
		Open: func(_ context.Context, s lockbench.Setup) (lockbench.Factory, func() error, error) {
			ttl := strconv.FormatInt(s.TTL.Milliseconds(), 10)
			return lockbench.SharedOrOwn(s, storeurl.OpenRedis, func(c rueidis.Client) (lockbench.Mutex, error) {
				return &handoffMutex{c: c, ttl: ttl, timeout: s.TTL}, nil
			})
		},
	}
}

type handoffMutex struct {
	c       rueidis.Client
	ttl     string
	timeout time.Duration
}

func (m *handoffMutex) Lock(ctx context.Context, key string) (func(context.Context) error, error) {
	token := lock.NewToken()
	n, err := handoffAcquire.Exec(ctx, m.c, []string{key}, []string{token, m.ttl}).AsInt64()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		// A crashed holder is not covered: the BLPOP gives up after a TTL.
		cmd := m.c.B().Blpop().Key(key + ":w:" + token).Timeout(m.timeout.Seconds()).Build()
		if err := m.c.Do(ctx, cmd).Error(); err != nil {
			leave, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = handoffLeave.Exec(leave, m.c, []string{key}, []string{token, m.ttl}).Error()
			return nil, errors.Join(lock.ErrNotObtained, err)
		}
	}
	return func(ctx context.Context) error {
		return lockbench.Released(handoffRelease.Exec(ctx, m.c, []string{key}, []string{token, m.ttl}).AsInt64())
	}, nil
}

func (m *handoffMutex) Close() error { return nil }

func (m *handoffMutex) Ping(ctx context.Context) error {
	return m.c.Do(ctx, m.c.B().Ping().Build()).Error()
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/lockbench"
	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/lock"
)

// The minimal hand-off lock: a measuring stick for lock/redis's fair mode,
// not a lock to use. A waiter joins a list; the release pops its head, makes
// it the owner and wakes it: through the waiter's own list, on which it
// sits in BLPOP (handoff-min), or with a Pub/Sub message to its own channel
// (handoff-min-pubsub, the way lock/redis wakes waiters). It has no fencing
// tokens, no waiter leases (a waiter that dies while queued is handed the
// lock anyway, and the queue stalls for a TTL), no lost-wake-up recovery and
// no hash tags: what is left is what a strict cross-process hand-off
// cannot do without. Compare its Redis and client time per critical section
// with llmgate's to price the features.
//
// A queue entry is "waiter:token": waiter names the Mutex to wake (its list
// L:w:waiter, or its channel handoff-min:w:waiter), token this acquisition.

// fence mints a fencing token as lock/redis does (fence.lua), when ARGV[4]
// is "1": max(last + 1, the server's µs), kept 7 days. ARGV[5] is the
// waiter lease in ms, "0" for none: with one, each queued entry has an
// expiry in the zset L:l, renewed while it waits, and a hand-off skips
// entries whose lease ran out (as lock/redis evicts dead waiters).
const fenceLua = `
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fence()
  if ARGV[4] ~= '1' then return 0 end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('SET', KEYS[1] .. ':f', string.format('%d', now), 'PX', '604800000', 'GET') or '0') or 0
  if last < now then return now end
  redis.call('SET', KEYS[1] .. ':f', string.format('%d', last + 1), 'PX', '604800000')
  return last + 1
end
`

// handOn is the end of a release: pass the lock to the head waiter and wake
// it (ARGV[3] "pub": by Pub/Sub), or free it.
const handOn = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local n = redis.call('LPOP', KEYS[1] .. ':q')
if ARGV[5] ~= '0' then
  -- Waiter leases: skip (evict) heads whose lease ran out.
  local l, now = KEYS[1] .. ':l', now_ms()
  while n and tonumber(redis.call('ZSCORE', l, n) or '0') <= now do
    redis.call('ZREM', l, n)
    n = redis.call('LPOP', KEYS[1] .. ':q')
  end
  if n then redis.call('ZREM', l, n) end
end
if n then
  redis.call('SET', KEYS[1], n, 'PX', ARGV[2])
  fence()
  local w = string.match(n, '^([^:]+):')
  if ARGV[3] == 'pub' then
    redis.call('PUBLISH', 'handoff-min:w:' .. w, '1')
  else
    redis.call('LPUSH', KEYS[1] .. ':w:' .. w, '1')
  end
  return 2
end
redis.call('DEL', KEYS[1])
return 1`

var (
	handoffAcquire = rueidis.NewLuaScript(fenceLua + `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then fence() return 1 end
redis.call('RPUSH', KEYS[1] .. ':q', ARGV[1])
if ARGV[5] ~= '0' then redis.call('ZADD', KEYS[1] .. ':l', now_ms() + tonumber(ARGV[5]), ARGV[1]) end
return 0`)
	// handoffRenew renews a queued entry's lease (ARGV[5]).
	handoffRenew = rueidis.NewLuaScript(fenceLua + `
return redis.call('ZADD', KEYS[1] .. ':l', 'XX', now_ms() + tonumber(ARGV[5]), ARGV[1])`)
	handoffRelease = rueidis.NewLuaScript(fenceLua + handOn)
	// handoffLeave takes a waiter whose context ended out of the queue, drops
	// a wake-up sent to it, and passes on a lock handed to it meanwhile.
	handoffLeave = rueidis.NewLuaScript(fenceLua + `
redis.call('LREM', KEYS[1] .. ':q', 0, ARGV[1])
redis.call('ZREM', KEYS[1] .. ':l', ARGV[1])
redis.call('DEL', KEYS[1] .. ':w:' .. string.match(ARGV[1], '^([^:]+):'))` + handOn)
)

func handoffAlgo(pubsub, fence, leases bool) lockbench.Algo {
	name, wake, fences := "handoff-min", "BLPOP wake-ups", "no fences"
	if pubsub {
		name, wake = "handoff-min-pubsub", "Pub/Sub wake-ups"
	}
	if fence {
		name, fences = name+"-fence", "fences as lock/redis mints them"
	}
	waiters := "no waiter leases"
	if leases {
		name, waiters = name+"-leases", "waiter leases renewed every lease/3"
	}
	return lockbench.Algo{
		Name:    name,
		Summary: "measuring stick: FIFO hand-off in Lua, " + wake + ", " + fences + ", " + waiters + " (rueidis)",
		Fair:    true, // always FIFO: --fair changes nothing
		Open: func(_ context.Context, s lockbench.Setup) (lockbench.Factory, func() error, error) {
			ttl := strconv.FormatInt(s.TTL.Milliseconds(), 10)
			return lockbench.SharedOrOwn(s, storeurl.OpenRedis, func(c rueidis.Client) (lockbench.Mutex, error) {
				m := &handoffMutex{c: c, ttl: ttl, timeout: s.TTL, waiter: strings.ReplaceAll(lock.NewToken()[:12], ":", ""), fence: "0"}
				if fence {
					m.fence = "1"
				}
				if leases {
					m.lease = lock.DefaultWaiterLease
				}
				if pubsub {
					return m, m.subscribe()
				}
				return m, nil
			})
		},
	}
}

type handoffMutex struct {
	c       rueidis.Client
	ttl     string
	timeout time.Duration
	waiter  string
	fence   string        // "1": mint fencing tokens
	lease   time.Duration // waiter lease, 0 for none

	// Pub/Sub only: wake gets a value per message; stop ends the subscription.
	wake chan struct{}
	stop context.CancelFunc
}

// subscribe starts the Mutex's subscription and waits until it is active.
func (m *handoffMutex) subscribe() error {
	m.wake = make(chan struct{}, 1)
	ctx, stop := context.WithCancel(context.Background())
	m.stop = stop
	active := make(chan struct{})
	ch := "handoff-min:w:" + m.waiter
	go func() {
		_ = m.c.Receive(ctx, m.c.B().Subscribe().Channel(ch).Build(), func(rueidis.PubSubMessage) {
			select {
			case m.wake <- struct{}{}:
			default:
			}
		})
	}()
	go func() { // Receive has no "subscribed" signal: ask the server
		defer close(active)
		for ctx.Err() == nil {
			v, err := m.c.Do(ctx, m.c.B().PubsubNumsub().Channel(ch).Build()).ToArray()
			if err == nil && len(v) == 2 {
				if n, _ := v[1].AsInt64(); n > 0 {
					return
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Millisecond):
			}
		}
	}()
	select {
	case <-active:
		return nil
	case <-time.After(5 * time.Second):
		stop()
		return fmt.Errorf("handoff-min-pubsub: subscription to %s not active after 5s", ch)
	}
}

func (m *handoffMutex) Lock(ctx context.Context, key string) (func(context.Context) error, error) {
	entry := m.waiter + ":" + lock.NewToken()
	mode := "list"
	if m.wake != nil {
		mode = "pub"
		select { // a wake-up left over from an entry that gave up
		case <-m.wake:
		default:
		}
	}
	n, err := handoffAcquire.Exec(ctx, m.c, []string{key}, m.args(entry, "")).AsInt64()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		// A crashed holder is not covered: the wait gives up after a TTL.
		if err := m.await(ctx, key, entry); err != nil {
			leave, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = handoffLeave.Exec(leave, m.c, []string{key}, m.args(entry, mode)).Error()
			return nil, errors.Join(lock.ErrNotObtained, err)
		}
	}
	return func(ctx context.Context) error {
		return lockbench.Released(handoffRelease.Exec(ctx, m.c, []string{key}, m.args(entry, mode)).AsInt64())
	}, nil
}

// args are the scripts' ARGV.
func (m *handoffMutex) args(entry, mode string) []string {
	return []string{entry, m.ttl, mode, m.fence, strconv.FormatInt(m.lease.Milliseconds(), 10)}
}

// await waits for the wake-up of the queued entry, renewing its lease (if
// it has one) every third of it.
func (m *handoffMutex) await(ctx context.Context, key, entry string) error {
	deadline := time.Now().Add(m.timeout)
	for {
		step := time.Until(deadline)
		if m.lease > 0 {
			step = min(step, m.lease/3)
		}
		if step <= 0 {
			return errors.New("handoff-min: no wake-up within a TTL")
		}
		woken, err := m.wait(ctx, key, step)
		if woken || err != nil {
			return err
		}
		if m.lease > 0 {
			if err := handoffRenew.Exec(ctx, m.c, []string{key}, m.args(entry, "")).Error(); err != nil {
				return err
			}
		}
	}
}

// wait waits up to d for a wake-up.
func (m *handoffMutex) wait(ctx context.Context, key string, d time.Duration) (bool, error) {
	if m.wake == nil {
		err := m.c.Do(ctx, m.c.B().Blpop().Key(key+":w:"+m.waiter).Timeout(d.Seconds()).Build()).Error()
		if rueidis.IsRedisNil(err) {
			return false, nil
		}
		return err == nil, err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-m.wake:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (m *handoffMutex) Close() error {
	if m.stop != nil {
		m.stop()
	}
	return nil
}

func (m *handoffMutex) Ping(ctx context.Context) error {
	return m.c.Do(ctx, m.c.B().Ping().Build()).Error()
}

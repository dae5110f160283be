package lockbench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/memory"
)

// Builtin returns the algorithms that ship with llmgate: "llmgate" and the
// "poll" reference.
func Builtin() []Algo {
	return []Algo{Llmgate(), Poll()}
}

// Llmgate is package lock over lock/redis (or lock/memory for --store
// memory): blocking acquire woken by the release, FIFO hand-off with --fair.
func Llmgate() Algo {
	return Algo{
		Name:    "llmgate",
		Summary: "package lock on lock/redis (lock/memory for --store memory); --fair queues every waiter in the store",
		Fair:    true,
		Memory:  true,
		Open:    openLlmgate,
	}
}

func openLlmgate(_ context.Context, s Setup) (Factory, func() error, error) {
	opts := lock.Options{TTL: s.TTL, Fair: s.Fair}
	if storeurl.IsMemory(s.Store) {
		l := lock.New(memory.New(nil))
		return func(context.Context, int) (Mutex, error) { return &lockerMutex{l: l, opts: opts}, nil }, nil, nil
	}
	if s.SharedClient {
		// One process: one client and one Locker shared by every worker, so
		// the non-fair mode's in-process queue is what gets measured.
		c, err := storeurl.OpenRedis(s.Store)
		if err != nil {
			return nil, nil, err
		}
		l := lock.New(newRedisBackend(c))
		f := func(context.Context, int) (Mutex, error) { return &lockerMutex{l: l, opts: opts, c: c}, nil }
		return f, func() error { c.Close(); return nil }, nil
	}
	return SharedOrOwn(s, storeurl.OpenRedis, func(c rueidis.Client) (Mutex, error) {
		return &lockerMutex{l: lock.New(newRedisBackend(c)), opts: opts, c: c}, nil
	})
}

// lockerMutex adapts a *lock.Locker.
type lockerMutex struct {
	l    *lock.Locker
	opts lock.Options
	c    rueidis.Client // nil on the memory store
}

// Ping sends a PING on the locker's own client.
func (m *lockerMutex) Ping(ctx context.Context) error {
	if m.c == nil {
		return errors.New("lockbench: no store client to PING")
	}
	return m.c.Do(ctx, m.c.B().Ping().Build()).Error()
}

func (m *lockerMutex) Lock(ctx context.Context, key string) (func(context.Context) error, error) {
	lease, err := m.l.Acquire(ctx, key, m.opts)
	if err != nil {
		return nil, err
	}
	return lease.Release, nil
}

func (m *lockerMutex) Close() error { return nil }

// Poll is the textbook reference lock on rueidis: SET key token NX PX ttl,
// retried every millisecond while it fails; released by a Lua
// compare-and-delete.
func Poll() Algo {
	return Algo{
		Name:    "poll",
		Summary: "reference: SET NX PX, retry every 1ms, Lua compare-and-delete release (rueidis)",
		Open: func(_ context.Context, s Setup) (Factory, func() error, error) {
			ttl := s.TTL.Milliseconds()
			return SharedOrOwn(s, storeurl.OpenRedis, func(c rueidis.Client) (Mutex, error) {
				return &pollMutex{c: c, ttlMs: ttl}, nil
			})
		},
	}
}

// PollRetry is how long the polling locks wait between attempts.
const PollRetry = time.Millisecond

// CompareAndDelete is the usual release script: delete KEYS[1] only if its
// value is ARGV[1]; returns 1 if deleted, 0 if not held.
const CompareAndDelete = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0`

var compareAndDelete = rueidis.NewLuaScript(CompareAndDelete)

// Released turns a release script's reply (0: the lock was not ours) into
// Mutex's release error.
func Released(n int64, err error) error {
	if err != nil {
		return err
	}
	if n == 0 {
		return lock.ErrNotHeld
	}
	return nil
}

type pollMutex struct {
	c     rueidis.Client
	ttlMs int64
	timer *time.Timer
}

func (m *pollMutex) Lock(ctx context.Context, key string) (func(context.Context) error, error) {
	token := lock.NewToken()
	for {
		err := m.c.Do(ctx, m.c.B().Set().Key(key).Value(token).Nx().PxMilliseconds(m.ttlMs).Build()).Error()
		if err == nil {
			return func(ctx context.Context) error {
				return Released(compareAndDelete.Exec(ctx, m.c, []string{key}, []string{token}).AsInt64())
			}, nil
		}
		if !rueidis.IsRedisNil(err) {
			return nil, err
		}
		if err := m.wait(ctx, PollRetry); err != nil {
			return nil, err
		}
	}
}

// wait sleeps d or until ctx ends, reusing one timer.
func (m *pollMutex) wait(ctx context.Context, d time.Duration) error {
	if m.timer == nil {
		m.timer = time.NewTimer(d)
	} else {
		m.timer.Reset(d)
	}
	select {
	case <-m.timer.C:
		return nil
	case <-ctx.Done():
		return errors.Join(lock.ErrNotObtained, ctx.Err())
	}
}

func (m *pollMutex) Close() error { return nil }

// Ping sends a PING on the mutex's own client.
func (m *pollMutex) Ping(ctx context.Context) error {
	return m.c.Do(ctx, m.c.B().Ping().Build()).Error()
}

// SharedOrOwn builds a Factory whose workers each open their own client
// (or, with s.SharedClient, all share one opened here) and wrap it with
// newMutex. Each worker's Close closes its own client; the returned closer
// closes the shared one. Peer algorithms use it too.
func SharedOrOwn[C interface{ Close() }](s Setup, open func(store string) (C, error), newMutex func(C) (Mutex, error)) (Factory, func() error, error) {
	if s.SharedClient {
		c, err := open(s.Store)
		if err != nil {
			return nil, nil, err
		}
		f := func(context.Context, int) (Mutex, error) { return newMutex(c) }
		return f, func() error { c.Close(); return nil }, nil
	}
	f := func(_ context.Context, w int) (Mutex, error) {
		c, err := open(s.Store)
		if err != nil {
			return nil, err
		}
		m, err := newMutex(c)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("worker %d: %w", w, err)
		}
		return closingMutex{Mutex: m, close: c.Close}, nil
	}
	return f, nil, nil
}

// closingMutex closes the worker's own client after the mutex.
type closingMutex struct {
	Mutex
	close func()
}

// Unwrap returns the wrapped Mutex.
func (m closingMutex) Unwrap() Mutex { return m.Mutex }

func (m closingMutex) Close() error {
	err := m.Mutex.Close()
	m.close()
	return err
}

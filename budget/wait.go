package budget

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Polling bounds of ReserveWait: how soon the head of a line asks the
// store again when nothing local woke it (other replicas' settles are
// only seen by asking).
const (
	waitPollMin = 10 * time.Millisecond
	waitPollMax = 250 * time.Millisecond
)

// ReserveWait is Reserve that, when the estimate does not fit but would if
// the requests in flight on the same budget settled below their holds,
// waits up to maxWait for them to settle, and tries again. Requests that
// wait on one Manager are admitted in arrival order: only the oldest asks
// the store, woken by this Manager's settles and releases on the budget and
// polling for other replicas'. It returns the last *ExhaustedError when
// maxWait passes, or at once when waiting cannot help (nothing in flight,
// or the estimate exceeds what is left even if in-flight requests cost
// nothing). The other errors are Reserve's.
func (m *Manager) ReserveWait(ctx context.Context, b Budget, id, model string, estimate Usage, maxWait time.Duration) (Reservation, error) {
	return m.ReserveWaitFunc(ctx, b, id, model, func() Usage { return estimate }, maxWait)
}

// ReserveWaitFunc is ReserveWait for a caller whose estimate may improve
// while it waits (say, one learned from recent usage): estimate is called
// before every attempt.
func (m *Manager) ReserveWaitFunc(ctx context.Context, b Budget, id, model string, estimate func() Usage, maxWait time.Duration) (Reservation, error) {
	if id == "" {
		id = NewID()
	}
	w, err := b.Window(m.cfg.Clock.Now())
	if err != nil {
		return Reservation{}, err
	}
	key := Key{Tenant: b.Tenant, WindowID: w.ID}
	l := m.lines.get(key)
	defer m.lines.put(key, l)
	if maxWait <= 0 || l.empty() {
		// Nobody waits here: no queue to respect.
		res, err := m.Reserve(ctx, b, id, model, estimate())
		if maxWait <= 0 || !mayFitLater(err, b.Cap()) {
			return res, err
		}
	}
	deadline := time.Now().Add(maxWait)
	turn := l.join()
	m.waiting.Add(1)
	defer func() {
		l.leave(turn)
		m.waiting.Add(-1)
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-turn.head:
	case <-timer.C:
		return m.Reserve(ctx, b, id, model, estimate()) // a last try, in the end
	case <-ctx.Done():
		return Reservation{}, ctx.Err()
	}
	poll := waitPollMin
	for {
		res, err := m.Reserve(ctx, b, id, model, estimate())
		if !mayFitLater(err, b.Cap()) || !time.Now().Before(deadline) {
			return res, err
		}
		pt := time.NewTimer(min(poll, time.Until(deadline)))
		select {
		case <-l.kick:
			poll = waitPollMin
		case <-pt.C:
			poll = min(2*poll, waitPollMax)
		case <-ctx.Done():
			pt.Stop()
			return Reservation{}, ctx.Err()
		}
		pt.Stop()
	}
}

// mayFitLater reports whether err is a denial that in-flight requests
// settling below their holds could turn into an admission: where a cap
// denied it, something is held, and the need fits in what is left of the
// cap after what was spent.
func mayFitLater(err error, limit Amount) bool {
	var ex *ExhaustedError
	if !errors.As(err, &ex) {
		return false
	}
	if ex.Tokens && (ex.Reserved.Tokens == 0 || !fits(limit.Tokens, ex.Spent.Tokens, ex.Need.Tokens)) {
		return false
	}
	if ex.Money && (ex.Reserved.MicroUSD == 0 || !fits(limit.MicroUSD, ex.Spent.MicroUSD, ex.Need.MicroUSD)) {
		return false
	}
	return ex.Tokens || ex.Money
}

// wake tells the requests waiting on key that a hold of it ended here.
func (m *Manager) wake(key Key) {
	if l := m.lines.peek(key); l != nil {
		select {
		case l.kick <- struct{}{}:
		default: // already woken
		}
	}
}

// lines holds a waiting line per budget window that has waiters.
type lines struct {
	mu sync.Mutex // protects m
	m  map[Key]*line
}

// line is the waiters of one budget window, oldest first. refs counts the
// ReserveWaits using it, so that it is dropped with the last.
type line struct {
	kick chan struct{} // a settle or release of the window (buffered 1)

	mu    sync.Mutex // protects queue
	queue []*turn
	refs  int // protected by lines.mu
}

// turn is one waiter's place; head is closed when it is first in line.
type turn struct{ head chan struct{} }

func (ls *lines) get(k Key) *line {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.m == nil {
		ls.m = make(map[Key]*line)
	}
	l := ls.m[k]
	if l == nil {
		l = &line{kick: make(chan struct{}, 1)}
		ls.m[k] = l
	}
	l.refs++
	return l
}

func (ls *lines) put(k Key, l *line) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(ls.m, k)
	}
}

func (ls *lines) peek(k Key) *line {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.m[k]
}

func (l *line) empty() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue) == 0
}

// join queues a new turn at the end of l.
func (l *line) join() *turn {
	t := &turn{head: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queue = append(l.queue, t)
	if len(l.queue) == 1 {
		close(t.head)
	}
	return t
}

// leave takes t out of l; if it was first, the next turn is.
func (l *line) leave(t *turn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, q := range l.queue {
		if q != t {
			continue
		}
		l.queue = append(l.queue[:i], l.queue[i+1:]...)
		if i == 0 && len(l.queue) > 0 {
			close(l.queue[0].head)
			// The next head may fit now: the holds that ended while the
			// last one waited are not told twice.
			select {
			case l.kick <- struct{}{}:
			default:
			}
		}
		return
	}
}

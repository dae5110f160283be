package budget

import (
	"context"
	"errors"
	"github.com/llmgate/llmgate/clock"
	"time"
)

// leaveTimeout bounds the Leave of a waiter whose context ended.
const leaveTimeout = 5 * time.Second

// ReserveWait is Reserve that, when the estimate does not fit but would if
// the requests in flight on the same budget settled below their holds,
// waits up to maxWait for them to settle, and tries again. Waiters of one
// budget window, on every replica sharing the store, are admitted in
// arrival order: they queue in a line in the store, and the first is woken
// by every settle or release of the window and when the one ahead of it is
// admitted or leaves. A waiter renews its place every Config.WaiterLease/3;
// one that dies is dropped from the line when its lease passes.
//
// It returns the last *ExhaustedError when maxWait passes, or at once when
// waiting cannot help (nothing in flight, or the estimate exceeds what is
// left even if in-flight requests cost nothing). The other errors are
// Reserve's. With maxWait ≤ 0 it is Reserve: one attempt that does not
// look at the line.
func (m *Manager) ReserveWait(ctx context.Context, b Budget, id, model string, estimate Usage, maxWait time.Duration) (Reservation, error) {
	return m.ReserveWaitFunc(ctx, b, id, model, func() Usage { return estimate }, maxWait)
}

// ReserveWaitFunc is ReserveWait for a caller whose estimate may improve
// while it waits (one that uses Learned, say): estimate is called before
// every attempt, and when the store's learned estimate changes in a reply,
// the request tries again at once with the new one.
func (m *Manager) ReserveWaitFunc(ctx context.Context, b Budget, id, model string, estimate func() Usage, maxWait time.Duration) (Reservation, error) {
	if maxWait <= 0 {
		return m.Reserve(ctx, b, id, model, estimate())
	}
	if id == "" {
		id = NewID()
	}
	deadline := time.Now().Add(maxWait)
	inLine := false // counted in Stats().Waiting
	defer func() {
		if inLine {
			m.waiting.Add(-1)
		}
	}()
	for {
		est := estimate()
		res, queued, err := m.reserve(ctx, b, id, model, est, m.cfg.WaiterLease)
		// A reply may have taught a better estimate: it may fit now.
		retry := estimate() != est && time.Now().Before(deadline)
		var ex *ExhaustedError
		if !errors.As(err, &ex) {
			return res, err // admitted, or an error that waiting cannot help
		}
		if !queued {
			if retry {
				continue
			}
			m.denied.Add(1)
			return Reservation{}, err
		}
		if !inLine {
			inLine = true
			m.waiting.Add(1)
		}
		if retry {
			continue
		}
		key := Key{Tenant: b.Tenant, WindowID: ex.Window.ID}
		if !time.Now().Before(deadline) {
			m.leave(ctx, key, id)
			m.denied.Add(1)
			return Reservation{}, err
		}
		wait := min(m.cfg.WaiterLease/3, time.Until(deadline))
		if _, werr := m.b.Await(ctx, key, id, wait); ctx.Err() != nil {
			m.leave(ctx, key, id)
			return Reservation{}, ctx.Err()
		} else if werr != nil {
			// The store failed: the next Reserve says whether it is back.
			m.storeErrors.Add(1)
			if err := clock.Sleep(ctx, wait); err != nil {
				m.leave(ctx, key, id)
				return Reservation{}, err
			}
		}
		// Woken, or time to renew the place: try again.
	}
}

// leave takes id out of key's line, even after ctx ended; best effort:
// its place expires with its lease anyway.
func (m *Manager) leave(ctx context.Context, key Key, id string) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	defer cancel()
	if err := m.b.Leave(lctx, key, id); err != nil {
		m.storeErrors.Add(1)
	}
}

package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/llmgate/llmgate/budget"
)

// usageBatch collects usage records that hold no budget.
type usageBatch struct {
	g *Gateway

	mu    sync.Mutex             // protects rows, armed, timer
	rows  map[usageKey]*usageRow // usage since the last flush
	armed bool                   // a flush is scheduled
	timer *time.Timer
	// flushing is held while a flush records its rows, so that flushNow
	// returns only once what was collected before it is recorded.
	flushing sync.Mutex
}

type usageKey struct{ tenant, window, model, deployment string }

type usageRow struct {
	res budget.Reservation // the first request's, for its window and tenant
	rec budget.Record      // the sum
}

// add records rec (of a reservation res without a hold) with the next flush.
func (u *usageBatch) add(res budget.Reservation, rec budget.Record) {
	k := usageKey{res.Tenant, res.Window.ID, rec.Model, rec.Deployment}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.rows == nil {
		u.rows = map[usageKey]*usageRow{}
	}
	row := u.rows[k]
	if row == nil {
		row = &usageRow{res: res, rec: budget.Record{Model: rec.Model, Deployment: rec.Deployment}}
		u.rows[k] = row
	}
	row.rec.Requests += max(rec.Requests, 1)
	row.rec.Usage.PromptTokens += rec.Usage.PromptTokens
	row.rec.Usage.CompletionTokens += rec.Usage.CompletionTokens
	row.rec.Usage.CachedTokens += rec.Usage.CachedTokens
	if !u.armed {
		u.armed = true
		u.timer = time.AfterFunc(u.g.opt.Admission.UsageFlushInterval, u.flush)
	}
}

// flushNow records what is collected without waiting for the timer, and
// waits for a flush the timer started.
func (u *usageBatch) flushNow() {
	u.mu.Lock()
	if u.armed {
		u.timer.Stop()
	}
	u.mu.Unlock()
	u.flush()
}

// flush records the collected rows, each under a reservation ID of its own
// (so that a retried settle cannot count it twice). Prices are linear in
// tokens, so the sum's cost is the sum of the requests' costs.
func (u *usageBatch) flush() {
	u.flushing.Lock()
	defer u.flushing.Unlock()
	u.mu.Lock()
	rows := u.rows
	u.rows, u.armed = nil, false
	u.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	for _, row := range rows {
		res := row.res
		res.ID = "usage-" + budget.NewID()
		s, err := u.g.settleBudget(ctx, res, row.rec)
		if err != nil {
			u.g.metrics.settleErrors.Inc()
			u.g.log.Error("usage could not be recorded", "tenant", res.Tenant, "model", row.rec.Model,
				"requests", row.rec.Requests, "err", err)
			continue
		}
		u.g.metrics.cost.WithLabelValues(res.Tenant, row.rec.Model).Add(float64(s.Record.MicroUSD) / 1e6)
	}
}

package gateway

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/openai"
)

// keepReservation keeps adm's rate-limit reservation alive while its
// request runs (a long generation or stream), so that its concurrency
// permit is not freed under it; a crashed replica's permits still free
// themselves within one hold. A stream's renewals also record what it has
// used so far (the prompt and the chunks streamed), so that if this
// replica dies, the reservation expires charged that instead of its
// estimate; a request that is not streamed keeps its estimate, since the
// provider may well generate the whole answer. It also records adm's
// deployment as the one serving c, for c's budget renewals. The returned
// func stops it. One goroutine does this for every request (see keeper):
// most end long before their first renewal, and a timer each would cost
// them all.
func (g *Gateway) keepReservation(c *call, adm admitted) keptReservation {
	c.progress.dep.Store(adm.dep)
	if adm.decision.ID == "" {
		return keptReservation{}
	}
	st := keptState{adm: adm}
	if c.req.Stream {
		st.stream = c
	}
	return g.keeper.add(g, st)
}

// usedSoFar is what c, streamed under adm, has used of each of adm's
// charges: its prompt and the content chunks streamed so far.
func usedSoFar(c *call, adm admitted) []int64 {
	return actualCosts(adm, &openai.Usage{PromptTokens: c.promptEstimate, CompletionTokens: c.progress.streamed.Load()})
}

// keepBudget keeps c's budget hold res alive while the request runs, and
// raises it to what the request has used so far (the prompt and the
// chunks streamed up to now): if this replica dies, the hold expires
// within the budget TTL and is charged at least that (budget.Manager.Renew).
func (g *Gateway) keepBudget(c *call, res budget.Reservation) keptReservation {
	if res.Hold == (budget.Amount{}) || res.Unchecked {
		return keptReservation{} // nothing held in the store
	}
	return g.keeper.add(g, keptState{c: c, res: res})
}

// progress is what a running request has used so far, as the keeper
// reports it to the budget.
type progress struct {
	dep      atomic.Pointer[deployment] // the deployment serving it, once admitted
	streamed atomic.Int64               // content chunks streamed so far (about a token each)
}

// keeper renews the rate-limit reservations of requests running longer
// than half a hold, and the budget holds of requests running longer than a
// third of the budget TTL, checking often enough that each is renewed well
// before it expires (rate limits between half and three quarters of a
// hold after the last renewal, budgets between a third and a half of the
// TTL).
type keeper struct {
	mu      sync.Mutex // protects everything below
	live    map[uint64]keptState
	next    uint64
	stop    chan struct{} // closed by Close; nil until the goroutine starts
	stopped bool
}

// keptState is one renewed reservation: a rate-limit one (adm, and
// stream when its request is streamed), or a budget hold (c and res).
type keptState struct {
	adm     admitted
	stream  *call
	c       *call
	res     budget.Reservation
	renewed time.Time // admission, then the last renewal
}

// keptReservation is a reservation the keeper renews until stop is
// called. The zero value is one nothing renews.
type keptReservation struct {
	k  *keeper
	id uint64
}

func (r keptReservation) stop() {
	if r.k == nil {
		return
	}
	r.k.drop(r.id)
}

func (k *keeper) drop(id uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.live, id)
}

func (k *keeper) add(g *Gateway, st keptState) keptReservation {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.live == nil {
		k.live = make(map[uint64]keptState)
	}
	if k.stop == nil && !k.stopped {
		k.stop = make(chan struct{})
		go k.run(g, k.stop)
	}
	k.next++
	st.renewed = time.Now()
	k.live[k.next] = st
	return keptReservation{k, k.next}
}

// close stops the renewals.
func (k *keeper) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stop != nil && !k.stopped {
		close(k.stop)
	}
	k.stopped = true
}

type keptDue struct {
	id uint64
	keptState
}

func (k *keeper) run(g *Gateway, stop <-chan struct{}) {
	hold, ttl := g.opt.Admission.ReservationHold, g.opt.Budgets.TTL()
	tick := time.NewTicker(max(min(hold/4, ttl/6), time.Millisecond)) // a positive period, whatever the hold
	defer tick.Stop()
	var due []keptDue
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			due = due[:0]
			k.mu.Lock()
			for id, r := range k.live {
				every := hold / 2
				if r.c != nil {
					every = ttl / 3
				}
				if now.Sub(r.renewed) >= every {
					r.renewed = now
					k.live[id] = r
					due = append(due, keptDue{id, r})
				}
			}
			k.mu.Unlock()
			for _, r := range due {
				if r.c != nil {
					if !g.renewBudget(r.c, r.res) {
						k.drop(r.id)
					}
					continue
				}
				var used []int64
				if r.stream != nil {
					used = usedSoFar(r.stream, r.adm)
				}
				ctx, cancel := context.WithTimeout(context.Background(), feedbackTimeout)
				err := g.opt.Limiter.Extend(ctx, r.adm.decision.ID, hold, used...)
				cancel()
				if err != nil {
					g.log.Warn("could not extend a long request's rate-limit reservation", "deployment", r.adm.dep.Name, "err", err)
				}
			}
		}
	}
}

// renewBudget renews c's budget hold res with what c has used so far; it
// reports false when the hold is gone, so renewing it again is pointless.
func (g *Gateway) renewBudget(c *call, res budget.Reservation) bool {
	p := budget.Progress{Usage: budget.Usage{PromptTokens: c.promptEstimate, CompletionTokens: c.progress.streamed.Load()}}
	if dep := c.progress.dep.Load(); dep != nil {
		p.Model, p.Deployment = dep.Model, dep.Name
	}
	ctx, cancel := context.WithTimeout(context.Background(), feedbackTimeout)
	ok, err := g.opt.Budgets.Renew(ctx, res, p)
	cancel()
	switch {
	case err != nil:
		g.log.Warn("could not renew a long request's budget hold; if it expires it is charged, and the request's settle corrects it", "request_id", c.id, "err", err)
	case !ok:
		g.log.Warn("a running request's budget hold expired and was charged; the request's settle corrects it", "request_id", c.id)
		return false
	}
	return true
}

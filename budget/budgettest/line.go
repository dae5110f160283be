package budgettest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
)

// Tests of the waiting line (first come, first served across replicas,
// leases) and of the completion estimates learned through the store.

// lineLease is the waiters' lease in the tests that let one expire: short,
// since a backend on its own clock (a server's) needs it to pass in real
// time.
const lineLease = 300 * time.Millisecond

// lineEnv is a budget of 1000 tokens, and requests on it made straight to
// the backends of two replicas, so that each step of the line is one call.
type lineEnv struct {
	*env
	b      budget.Budget
	key    budget.Key
	stores [2]budget.Backend
}

func (s *suite) lineEnv(t *testing.T) *lineEnv {
	e := s.env(t, Start())
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}
	w, err := b.Window(e.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	return &lineEnv{env: e, b: b, key: budget.Key{Tenant: e.tenant, WindowID: w.ID}, stores: [2]budget.Backend{e.replica(), e.replica()}}
}

// reserve asks replica i to reserve tokens for id, waiting in line with
// lease (0: a plain attempt).
func (l *lineEnv) reserve(i int, id string, tokens int64, lease time.Duration) budget.ReserveResult {
	l.t.Helper()
	r, err := l.stores[i].Reserve(ctxFor(l.t), budget.ReserveRequest{
		Key: l.key, ID: id, Hold: budget.Amount{Tokens: tokens}, Cap: l.b.Cap(),
		TTL: time.Hour, Keep: l.clk.Now().Add(48 * time.Hour), Remember: time.Hour,
		Charge:      budget.Charge{Model: testModel, Usage: usage(tokens, 0)},
		WaiterLease: lease,
	})
	if err != nil {
		l.t.Fatalf("reserve %s: %v", id, err)
	}
	return r
}

func (l *lineEnv) want(i int, id string, tokens int64, lease time.Duration, admitted, queued bool) {
	l.t.Helper()
	if r := l.reserve(i, id, tokens, lease); r.Admitted != admitted || r.Queued != queued {
		l.t.Fatalf("reserve %s of %d tokens on replica %d: %+v; want admitted %v, queued %v", id, tokens, i, r, admitted, queued)
	}
}

func (l *lineEnv) settle(i int, id string, tokens int64) {
	l.t.Helper()
	_, err := l.stores[i].Settle(ctxFor(l.t), budget.SettleRequest{
		Key: l.key, ID: id, Remember: time.Hour, Keep: l.clk.Now().Add(48 * time.Hour),
		Record: budget.Record{Model: testModel, Usage: usage(tokens, 0), Requests: 1},
	})
	if err != nil {
		l.t.Fatalf("settle %s: %v", id, err)
	}
}

// woken checks that replica i's waiter id was woken, within waitBound.
func (l *lineEnv) woken(i int, id string) {
	l.t.Helper()
	ok, err := l.stores[i].Await(ctxFor(l.t), l.key, id, waitBound)
	if err != nil || !ok {
		l.t.Fatalf("Await(%s) = %v, %v; want woken", id, ok, err)
	}
}

// testLineFirstComeFirstServed: waiters on two replicas go in arrival
// order, a younger one that would fit included, and each is woken, without
// polling, by the settle or the admission that lets it go.
func (s *suite) testLineFirstComeFirstServed(t *testing.T) {
	l := s.lineEnv(t)
	const lease = time.Minute // nothing expires: the order is the subject
	l.want(0, "held-1", 500, 0, true, false)
	l.want(1, "held-2", 500, 0, true, false)
	l.want(0, "big", 600, lease, false, true)   // may fit once a hold settles low
	l.want(1, "small", 100, lease, false, true) // behind big
	l.settle(1, "held-1", 0)
	l.woken(0, "big") // the settle woke the first in line
	// small would fit (500 + 100) but big is first, and does not fit yet.
	l.want(1, "small", 100, lease, false, true)
	l.want(0, "big", 600, lease, false, true)
	// A plain attempt ignores the line.
	l.want(1, "plain", 100, 0, true, false)
	l.settle(0, "plain", 100)
	l.settle(0, "held-2", 0)
	l.woken(0, "big")
	l.want(0, "big", 600, lease, true, false) // 100 spent + 600
	l.woken(1, "small")                       // big's admission woke the next
	l.want(1, "small", 100, lease, true, false)
	l.want(1, "small", 100, lease, true, false) // a retry: held, not taken twice
	wantStatus(t, l.manager(), l.b, l.clk.Now(), budget.Amount{Tokens: 100}, budget.Amount{Tokens: 700}, 2)
}

// testLineRefusesWhatCanNeverFit: a waiter is refused at once, and takes
// no place, when waiting cannot help: nothing in flight, or more than what
// is left once everything in flight settled at zero.
func (s *suite) testLineRefusesWhatCanNeverFit(t *testing.T) {
	l := s.lineEnv(t)
	l.want(0, "spent", 700, 0, true, false)
	l.settle(0, "spent", 700)
	l.want(0, "alone", 400, time.Minute, false, false) // nothing in flight
	l.want(0, "held", 200, 0, true, false)
	l.want(1, "too-big", 400, time.Minute, false, false) // 700 + 400 > 1000 even if held settles at 0
	l.want(1, "waits", 250, time.Minute, false, true)
	l.want(0, "behind", 400, time.Minute, false, false) // behind a waiter, still never fits
	l.want(0, "behind-ok", 250, time.Minute, false, true)
	// Leaving hands the turn on.
	if err := l.stores[1].Leave(ctxFor(t), l.key, "waits"); err != nil {
		t.Fatal(err)
	}
	l.woken(0, "behind-ok")
	if err := l.stores[1].Leave(ctxFor(t), l.key, "never-queued"); err != nil {
		t.Fatalf("Leave of an ID not in line: %v", err)
	}
}

// testLineDeadWaiterEvicted: a waiter that stops renewing its place (its
// replica died) is dropped from the line when its lease passes, and the
// one behind it goes.
func (s *suite) testLineDeadWaiterEvicted(t *testing.T) {
	l := s.lineEnv(t)
	l.want(0, "held", 900, 0, true, false)
	l.want(0, "dead", 500, lineLease, false, true)
	l.settle(0, "held", 100) // room for dead, which never comes back
	l.want(1, "alive", 100, time.Minute, false, true)
	l.clk.Advance(lineLease + time.Millisecond)
	eventually(t, "the dead waiter's place expires", func() (bool, string) {
		r := l.reserve(1, "alive", 100, time.Minute)
		return r.Admitted, fmt.Sprintf("%+v", r)
	})
	// Back after its lease, the dead one asks again like a newcomer.
	l.want(0, "dead", 500, lineLease, true, false)
}

// testReserveWaitAcrossReplicas: ReserveWait on one replica is admitted
// when a hold settles on another, woken by the store long before the
// renewal of its place would have made it ask again.
func (s *suite) testReserveWaitAcrossReplicas(t *testing.T) {
	e := s.env(t, Start())
	lease := func(c *budget.Config) { c.WaiterLease = 3 * waitBound } // renewals every waitBound
	m1, m2 := e.manager(lease), e.manager(lease)
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}
	held := mustReserve(t, m1, b, testModel, usage(800, 0))
	done := make(chan error, 1)
	go func() {
		_, err := m2.ReserveWait(context.Background(), b, "", testModel, usage(500, 0), 2*waitBound)
		done <- err
	}()
	eventually(t, "the waiter queues", func() (bool, string) {
		return m2.Stats().Waiting == 1, fmt.Sprintf("%+v", m2.Stats())
	})
	start := time.Now()
	mustSettle(t, m1, held, budget.Record{Usage: usage(300, 0)})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ReserveWait: %v", err)
		}
	case <-time.After(waitBound):
		t.Fatalf("not admitted %v after the settle: not woken", waitBound)
	}
	t.Logf("admitted %v after the settle on the other replica", time.Since(start))
	wantStatus(t, m1, b, e.clk.Now(), budget.Amount{Tokens: 300, MicroUSD: 300}, budget.Amount{Tokens: 500, MicroUSD: 500}, 1)
	if st := m2.Stats(); st.Waiting != 0 || st.Admitted != 1 || st.Denied != 0 {
		t.Fatalf("waiter's stats %+v; want 1 admitted, none waiting or denied", st)
	}
}

// testLearnedEstimate: answers settled on one replica teach the estimate
// every replica reads with its reservations: the LearnPercentile-th
// percentile of the last LearnWindow answers of the tenant and model,
// once LearnMinSamples are known; bounded answers teach nothing.
func (s *suite) testLearnedEstimate(t *testing.T) {
	e := s.env(t, Start())
	m1, m2 := e.manager(), e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day}
	learned := func(m *budget.Manager, model string) (int64, bool) {
		r := mustReserve(t, m, b, model, usage(1, 0))
		mustSettle(t, m, r, budget.Record{Usage: usage(1, 0)}) // teaches nothing
		return m.Learned(e.tenant, model)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 3))
	var answers []int64
	teach := func(n int64) {
		r := mustReserve(t, m1, b, testModel, usage(10, 256))
		mustSettle(t, m1, r, budget.Record{Usage: usage(10, n), LearnCompletion: n})
		answers = append(answers, n)
	}
	for range budget.LearnMinSamples - 1 {
		teach(1 + rnd.Int64N(100))
	}
	if v, ok := learned(m2, testModel); ok {
		t.Fatalf("learned %d from %d answers, want nothing before %d", v, len(answers), budget.LearnMinSamples)
	}
	for range budget.LearnWindow + 10 - len(answers) {
		teach(1 + rnd.Int64N(100))
	}
	teach(5000) // one very long answer does not move the estimate
	want := budget.LearnedEstimate(answers)
	if v, ok := learned(m2, testModel); !ok || v != want {
		t.Fatalf("learned %d, %v from %d answers; want %d", v, ok, len(answers), want)
	}
	if want > 100 {
		t.Fatalf("the estimate %d follows one outlier", want)
	}
	if v, ok := learned(m2, otherModel); ok {
		t.Fatalf("another model learned %d from %s's answers", v, testModel)
	}
	// A bounded answer (no LearnCompletion) changes nothing.
	r := mustReserve(t, m1, b, testModel, usage(10, 1))
	mustSettle(t, m1, r, budget.Record{Usage: usage(10, 1)})
	if v, _ := learned(m2, testModel); v != want {
		t.Fatalf("a bounded answer moved the estimate to %d, want %d", v, want)
	}
	if _, err := m1.Settle(ctxFor(t), r, budget.Record{Usage: usage(1, 1), LearnCompletion: -1}); !errors.Is(err, budget.ErrInvalid) {
		t.Fatalf("Settle with a negative LearnCompletion = %v, want ErrInvalid", err)
	}
}

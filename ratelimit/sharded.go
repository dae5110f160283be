package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Sharded is a Backend that keeps each scope's limits in the backend of
// the scope's group, so that the limits of a Redis Cluster spread over its
// slots: one group per provider deployment and one per tenant, say, each
// its own hash tag (ratelimit/redis Config.Group).
//
// A request whose charges all live in one group is decided as before: one
// call to that group, atomic over its limits. A request that spans groups
// is decided in every group at once (one round trip of wall time when the
// groups answer in parallel), and admitted only when every group admitted
// its part; otherwise the parts that were admitted are given back. So no
// limit ever admits more than it allows; a refused request may hold
// capacity in another group until it is given back, one round trip later
// (near a limit, two requests that each took a part the other needs are
// both refused by Allow; Wait queues them).
//
// Waiting spans groups too. The home group is the one of the request's
// lane (its first charge's, normally the deployment); the others (the
// tenant's) are taken first, each part waiting in the request's lane of
// its own group, and held; then the home part waits in its lane as a
// request of one group would. A request holds the other groups' parts
// while it waits at home (conservative: its tenant's capacity is taken a
// little early), and never holds the home part while it waits elsewhere.
//
// Decision IDs name the groups a reservation touched and which charge is in
// which (see encodeShardID), so Settle, Refund and Extend reach every part,
// in parallel, without asking the store where it is. IDs are therefore not
// the Request's ID, which they end with.
type Sharded struct {
	groupOf func(scope string) string
	open    func(group string) Backend

	mu     sync.RWMutex       // protects opened
	opened map[string]Backend // by group
}

var _ Backend = (*Sharded)(nil)

// NewSharded returns a Backend that keeps the limits of scope in
// open(groupOf(scope)). groupOf must be a pure function of the scope:
// every replica must agree on it. open is called once per group, on first
// use, and its backend kept.
func NewSharded(groupOf func(scope string) string, open func(group string) Backend) *Sharded {
	return &Sharded{groupOf: groupOf, open: open, opened: make(map[string]Backend)}
}

// maxGroups bounds the groups one request may span: a charge's group is
// written as one base-36 digit in decision IDs.
const maxGroups = 36

// backend returns group's backend, opening it on first use.
func (s *Sharded) backend(group string) Backend {
	s.mu.RLock()
	b := s.opened[group]
	s.mu.RUnlock()
	if b != nil {
		return b
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b = s.opened[group]; b == nil {
		b = s.open(group)
		s.opened[group] = b
	}
	return b
}

// shardSplit is a request cut by group. It lives on the request
// (Request.shard) from its first call to Sharded until the request is
// done, and says how far a waiting request got in each group.
type shardSplit struct {
	owner   *Sharded
	id      string       // the decision ID, naming every group
	charges []Charge     // the request's
	index   string       // per charge, its part (a base-36 digit)
	parts   []*shardPart // parts[0] is the home part: waited for last
	status  []Status     // per charge, the latest status its group reported
	started bool         // Enqueue ran: the parts' states are live
}

// Part states.
const (
	partIdle   = iota // nothing in the store
	partQueued        // waiting in its lane
	partHeld          // admitted, held for the request
)

// shardPart is the part of a request in one group.
type shardPart struct {
	b     Backend
	r     Request // the request's ID, lane and options; the part's charges
	state int
	d     Decision      // the last decision (partHeld: the admission)
	hint  time.Duration // when queued: when the group expects it to fit
	at    time.Time     // when it was held, or last extended
}

// route returns r's group when all its charges share one, and otherwise
// r's split (made on the first call).
func (s *Sharded) route(r *Request) (string, *shardSplit, error) {
	if sp := r.shard; sp != nil && sp.owner == s {
		return "", sp, nil
	}
	g := s.groupOf(r.Charges[0].Scope)
	for _, c := range r.Charges[1:] {
		if s.groupOf(c.Scope) != g {
			sp, err := s.cut(r)
			if err != nil {
				return "", nil, err
			}
			r.shard = sp
			return "", sp, nil
		}
	}
	return g, nil, nil
}

// cut splits r by group, the home group first.
func (s *Sharded) cut(r *Request) (*shardSplit, error) {
	groups := make([]string, 0, 2)
	index := make([]byte, len(r.Charges))
	for i, c := range r.Charges {
		g := s.groupOf(c.Scope)
		k := slices.Index(groups, g)
		if k < 0 {
			if len(groups) == maxGroups {
				return nil, fmt.Errorf("%w: charges in more than %d groups", ErrInvalid, maxGroups)
			}
			k = len(groups)
			groups = append(groups, g)
		}
		index[i] = byte(k)
	}
	// Home is the lane's group when a charge is in it, else the first
	// charge's (group 0 already).
	if home := slices.Index(groups, s.groupOf(r.Lane)); home > 0 {
		groups[0], groups[home] = groups[home], groups[0]
		for i, k := range index {
			switch int(k) {
			case 0:
				index[i] = byte(home)
			case home:
				index[i] = 0
			}
		}
	}
	sp := &shardSplit{owner: s, charges: r.Charges, status: make([]Status, len(r.Charges)), parts: make([]*shardPart, len(groups))}
	// One array for the parts, one for their charges, part after part.
	var counts [maxGroups]int
	for _, k := range index {
		counts[k]++
	}
	parts, charges := make([]shardPart, len(groups)), make([]Charge, 0, len(r.Charges))
	for k, g := range groups {
		p := &parts[k]
		p.b, p.r = s.backend(g), *r
		p.r.shard, p.r.Charges = nil, charges[len(charges):len(charges):len(charges)+counts[k]]
		charges = charges[:len(charges)+counts[k]]
		sp.parts[k] = p
	}
	for i, c := range r.Charges {
		p := sp.parts[index[i]]
		p.r.Charges = append(p.r.Charges, c)
		sp.status[i] = Status{Scope: c.Scope, Kind: c.Limit.Kind, Limit: c.Limit.Limit, Remaining: c.Limit.burst()}
	}
	for i, k := range index {
		index[i] = digits[k]
	}
	sp.index = string(index)
	sp.id = encodeShardID(groups, sp.index, r.ID)
	return sp, nil
}

// digits writes a charge's group in a decision ID.
const digits = "0123456789abcdefghijklmnopqrstuvwxyz"

// part returns the part of charge i.
func (sp *shardSplit) part(i int) int { return strings.IndexByte(digits, sp.index[i]) }

// encodeShardID writes the decision ID of a request with ID rid whose
// charge i is in groups[index[i]] (index empty: all in groups[0]):
// "s:" index ":" then each group as "<length>:<name>", then ":" rid. The
// lengths let group names hold any bytes.
func encodeShardID(groups []string, index, rid string) string {
	n := 4 + len(index) + len(rid)
	for _, g := range groups {
		n += len(g) + 4
	}
	b := make([]byte, 0, n)
	b = append(b, "s:"...)
	b = append(b, index...)
	b = append(b, ':')
	for _, g := range groups {
		b = strconv.AppendInt(b, int64(len(g)), 10)
		b = append(b, ':')
		b = append(b, g...)
	}
	b = append(b, ':')
	b = append(b, rid...)
	return string(b)
}

// decodeShardID reads an ID encodeShardID wrote; ok is false for any
// other string.
func decodeShardID(id string) (groups []string, index, rid string, ok bool) {
	rest, ok := strings.CutPrefix(id, "s:")
	if !ok {
		return nil, "", "", false
	}
	if index, rest, ok = strings.Cut(rest, ":"); !ok {
		return nil, "", "", false
	}
	n := 1
	for i := range len(index) {
		k := strings.IndexByte(digits, index[i])
		if k < 0 {
			return nil, "", "", false
		}
		n = max(n, k+1)
	}
	groups = make([]string, n)
	for k := range groups {
		var size string
		if size, rest, ok = strings.Cut(rest, ":"); !ok {
			return nil, "", "", false
		}
		l, err := strconv.Atoi(size)
		if err != nil || size[0] < '0' || size[0] > '9' || l > len(rest) || (len(size) > 1 && size[0] == '0') {
			return nil, "", "", false
		}
		groups[k], rest = rest[:l], rest[l:]
	}
	if rid, ok = strings.CutPrefix(rest, ":"); !ok {
		return nil, "", "", false
	}
	return groups, index, rid, true
}

// subActual returns the actual costs of part k's charges (nil stays nil:
// a refund); a charge left out of actual is left out of the part's too.
func subActual(actual []int64, index string, k int) []int64 {
	if actual == nil || index == "" {
		return actual
	}
	out := make([]int64, 0, len(index))
	for i := range len(index) {
		if int(strings.IndexByte(digits, index[i])) != k {
			continue
		}
		if i >= len(actual) {
			break
		}
		out = append(out, actual[i])
	}
	return out
}

// parallel runs f(0) .. f(n-1) at once, f(0) on this goroutine, and
// waits for them: calls to different groups then cost one round trip.
func parallel(n int, f func(k int)) {
	var wg sync.WaitGroup
	for k := 1; k < n; k++ {
		wg.Go(func() { f(k) })
	}
	f(0)
	wg.Wait()
}

// firstErr returns the first error of errs.
func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// note records d, part k's decision, as the status of its charges.
func (sp *shardSplit) note(k int, d Decision) {
	if len(d.Limits) != len(sp.parts[k].r.Charges) {
		return // a hint, which reports no statuses
	}
	j := 0
	for i := range sp.charges {
		if sp.part(i) == k {
			sp.status[i] = d.Limits[j]
			j++
		}
	}
}

// givenBack adds part k's costs back to its charges' statuses: the part
// was admitted and then given back.
func (sp *shardSplit) givenBack(k int) {
	for i, c := range sp.charges {
		if sp.part(i) == k {
			s := &sp.status[i]
			s.Remaining = min(s.Remaining+c.Cost, c.Limit.burst())
		}
	}
}

// admitted is the decision of a request whose parts are all held.
func (sp *shardSplit) admitted(now time.Time) Decision {
	d := Decision{ID: sp.id, Allowed: true, Limits: slices.Clone(sp.status)}
	for _, p := range sp.parts {
		// A part admitted ahead of its tokens starts when they exist.
		d.Delay = max(d.Delay, p.d.Delay-now.Sub(p.at))
	}
	return d
}

// waiting is the decision of r while part p holds it back.
func (sp *shardSplit) waiting(r *Request, p *shardPart) Decision {
	return Decision{ID: r.ID, RetryAfter: p.d.RetryAfter, DeniedBy: p.d.DeniedBy, DeniedKind: p.d.DeniedKind, Limits: slices.Clone(sp.status)}
}

// refused is the decision of r when the parts' decisions ds were not all
// admissions: the first charge that refused is named, and the retry is
// the longest any refusing group asked for (0, unknown, if any did not say).
func (sp *shardSplit) refused(r *Request, ds []Decision) Decision {
	d := Decision{ID: r.ID, Limits: slices.Clone(sp.status)}
	unknown := false
	for _, pd := range ds {
		if pd.Allowed {
			continue
		}
		if pd.RetryAfter <= 0 {
			unknown = true
		}
		d.RetryAfter = max(d.RetryAfter, pd.RetryAfter)
	}
	if unknown {
		d.RetryAfter = 0
	}
	for i, c := range sp.charges {
		pd := ds[sp.part(i)]
		if !pd.Allowed && pd.DeniedBy == c.Scope && pd.DeniedKind == c.Limit.Kind {
			d.DeniedBy, d.DeniedKind = c.Scope, c.Limit.Kind
			break
		}
	}
	return d
}

// detached returns a context for a clean-up that must run even when ctx
// has ended: giving back what a request held.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
}

// Admit decides r in every group it spans at once; see Backend.
func (s *Sharded) Admit(ctx context.Context, r *Request) (Decision, error) {
	g, sp, err := s.route(r)
	if err != nil {
		return Decision{}, err
	}
	if sp == nil {
		d, err := s.backend(g).Admit(ctx, r)
		if d.Allowed {
			d.ID = encodeShardID([]string{g}, "", r.ID)
		}
		return d, err
	}
	n := len(sp.parts)
	ds, errs := make([]Decision, n), make([]error, n)
	parallel(n, func(k int) { ds[k], errs[k] = sp.parts[k].b.Admit(ctx, &sp.parts[k].r) })
	all := true
	for k, d := range ds {
		if errs[k] == nil {
			sp.note(k, d)
		}
		all = all && errs[k] == nil && d.Allowed
	}
	if all {
		now := time.Now()
		for k, p := range sp.parts {
			p.d, p.at = ds[k], now
		}
		return sp.admitted(now), nil
	}
	// Give back the parts that were admitted.
	cctx, cancel := detached(ctx)
	defer cancel()
	parallel(n, func(k int) {
		if errs[k] == nil && ds[k].Allowed {
			_ = sp.parts[k].b.Settle(cctx, r.ID, nil)
		}
	})
	for k, d := range ds {
		if errs[k] == nil && d.Allowed {
			sp.givenBack(k)
		}
	}
	if err := firstErr(errs); err != nil {
		return Decision{ID: r.ID}, err
	}
	return sp.refused(r, ds), nil
}

// Enqueue queues r, or renews its place; see Backend. A request that spans
// groups takes the other groups' parts first, then waits at home.
func (s *Sharded) Enqueue(ctx context.Context, r *Request, lease time.Duration) (Decision, bool, time.Duration, error) {
	g, sp, err := s.route(r)
	if err != nil {
		return Decision{}, false, 0, err
	}
	if sp == nil {
		d, ok, hint, err := s.backend(g).Enqueue(ctx, r, lease)
		if ok {
			d.ID = encodeShardID([]string{g}, "", r.ID)
		}
		return d, ok, hint, err
	}
	first := !sp.started
	sp.started = true
	var todo []int
	switch {
	case first:
		for k := range sp.parts {
			todo = append(todo, k)
		}
	case !sp.othersHeld():
		for k, p := range sp.parts[1:] {
			if p.state != partHeld {
				todo = append(todo, k+1)
			}
		}
	default:
		todo = append(todo, 0)
	}
	if err := sp.enqueue(ctx, todo, lease); err != nil {
		if first {
			_ = sp.abandon(ctx, func(p *shardPart) bool { return p.state != partIdle })
			sp.started = false
		}
		return Decision{ID: r.ID}, false, 0, err
	}
	home := sp.parts[0]
	if !sp.othersHeld() {
		if home.state != partIdle {
			// The home part waits only once the others are held. A
			// failure here leaves it to its lease and hold, as any
			// abandon that fails.
			_ = sp.abandon(ctx, func(p *shardPart) bool { return p == home })
		}
		for _, p := range sp.parts[1:] {
			if p.state != partHeld {
				return sp.waiting(r, p), false, p.hint, nil
			}
		}
	}
	if home.state == partIdle {
		// The others were just taken: now the home part.
		if err := sp.enqueue(ctx, []int{0}, lease); err != nil {
			return Decision{ID: r.ID}, false, 0, err
		}
	}
	if home.state == partHeld {
		return sp.admitted(time.Now()), true, 0, nil
	}
	return sp.waiting(r, home), false, home.hint, nil
}

// othersHeld reports whether every part but the home one is held.
func (sp *shardSplit) othersHeld() bool {
	for _, p := range sp.parts[1:] {
		if p.state != partHeld {
			return false
		}
	}
	return true
}

// enqueue enqueues the parts todo at once, and renews the hold of the
// held parts that are half through it. It records each part's state and
// returns the first error.
func (sp *shardSplit) enqueue(ctx context.Context, todo []int, lease time.Duration) error {
	now := time.Now()
	var renew []*shardPart
	for _, p := range sp.parts {
		if p.state == partHeld && now.Sub(p.at) > p.r.Hold/2 {
			renew = append(renew, p)
		}
	}
	type result struct {
		d    Decision
		ok   bool
		hint time.Duration
		err  error
	}
	res := make([]result, len(todo)+len(renew))
	parallel(len(res), func(j int) {
		if j >= len(todo) {
			p := renew[j-len(todo)]
			res[j].err = p.b.Extend(ctx, p.r.ID, p.r.Hold, nil)
			return
		}
		p := sp.parts[todo[j]]
		x := &res[j]
		x.d, x.ok, x.hint, x.err = p.b.Enqueue(ctx, &p.r, lease)
	})
	now = time.Now()
	var errs []error
	for j, k := range todo {
		x, p := res[j], sp.parts[k]
		if x.err != nil {
			errs = append(errs, x.err)
			continue
		}
		sp.note(k, x.d)
		p.d, p.hint = x.d, x.hint
		if x.ok {
			p.state, p.at = partHeld, now
		} else {
			p.state = partQueued
		}
	}
	for j, p := range renew {
		if err := res[len(todo)+j].err; err != nil {
			errs = append(errs, err)
		} else {
			p.at = now
		}
	}
	return errors.Join(errs...)
}

// abandon takes the parts that match out of their lanes and gives back
// what they hold, at once; they are idle after.
func (sp *shardSplit) abandon(ctx context.Context, match func(*shardPart) bool) error {
	cctx, cancel := detached(ctx)
	defer cancel()
	errs := make([]error, len(sp.parts))
	parallel(len(sp.parts), func(k int) {
		if p := sp.parts[k]; match(p) {
			errs[k] = p.b.Abandon(cctx, &p.r)
		}
	})
	for k, p := range sp.parts {
		if !match(p) {
			continue
		}
		if p.state == partHeld {
			sp.givenBack(k)
		}
		p.state = partIdle
	}
	return firstErr(errs)
}

// Await waits for the part r waits for; see Backend. When a part other
// than the home one is admitted, it returns no decision, so that the
// caller enqueues again and r moves on to its next part.
func (s *Sharded) Await(ctx context.Context, r *Request, timeout time.Duration) (Decision, bool, error) {
	g, sp, err := s.route(r)
	if err != nil {
		return Decision{}, false, err
	}
	if sp == nil {
		d, ok, err := s.backend(g).Await(ctx, r, timeout)
		if ok {
			d.ID = encodeShardID([]string{g}, "", r.ID)
		}
		return d, ok, err
	}
	k := 0
	for j, p := range sp.parts[1:] {
		if p.state != partHeld {
			k = j + 1
			break
		}
	}
	p := sp.parts[k]
	if p.state != partQueued {
		return Decision{}, false, nil
	}
	d, ok, err := p.b.Await(ctx, &p.r, timeout)
	switch {
	case err != nil:
		return Decision{}, false, err
	case ok:
		sp.note(k, d)
		p.d, p.state, p.at = d, partHeld, time.Now()
		if k == 0 {
			return sp.admitted(p.at), true, nil
		}
		return Decision{}, false, nil
	}
	return Decision{ID: r.ID, RetryAfter: d.RetryAfter}, false, nil
}

// Abandon takes r out of every group it waits or is held in; see Backend.
func (s *Sharded) Abandon(ctx context.Context, r *Request) error {
	g, sp, err := s.route(r)
	if err != nil {
		return err
	}
	if sp == nil {
		return s.backend(g).Abandon(ctx, r)
	}
	sp.started = false
	return sp.abandon(ctx, func(*shardPart) bool { return true })
}

// Settle settles every part of the reservation id, at once; see Backend.
func (s *Sharded) Settle(ctx context.Context, id string, actual []int64) error {
	return s.eachPart(id, func(b Backend, rid string, k int, index string) error {
		return b.Settle(ctx, rid, subActual(actual, index, k))
	})
}

// Extend extends every part of the reservation id, at once, each with the
// usage of its own charges; see Backend.
func (s *Sharded) Extend(ctx context.Context, id string, hold time.Duration, used []int64) error {
	return s.eachPart(id, func(b Backend, rid string, k int, index string) error {
		return b.Extend(ctx, rid, hold, subActual(used, index, k))
	})
}

// eachPart runs f for every part of the reservation id at once. An ID that
// Sharded did not make is unknown. Errors other than an unknown part come
// first; any part unknown makes the reservation unknown.
func (s *Sharded) eachPart(id string, f func(b Backend, rid string, k int, index string) error) error {
	groups, index, rid, ok := decodeShardID(id)
	if !ok {
		return ErrUnknownReservation
	}
	errs := make([]error, len(groups))
	parallel(len(groups), func(k int) { errs[k] = f(s.backend(groups[k]), rid, k, index) })
	unknown := false
	for _, err := range errs {
		switch {
		case errors.Is(err, ErrUnknownReservation):
			unknown = true
		case err != nil:
			return err
		}
	}
	if unknown {
		return ErrUnknownReservation
	}
	return nil
}

// Cooldown holds back scope in its group; see Backend.
func (s *Sharded) Cooldown(ctx context.Context, scope string, d time.Duration) (time.Duration, error) {
	return s.backend(s.groupOf(scope)).Cooldown(ctx, scope, d)
}

// Observe lowers scope's bucket in its group; see Backend.
func (s *Sharded) Observe(ctx context.Context, scope string, l Limit, remaining int64) error {
	return s.backend(s.groupOf(scope)).Observe(ctx, scope, l, remaining)
}

// Learn records a provider's limit for scope in its group; see Backend.
func (s *Sharded) Learn(ctx context.Context, scope string, l Limit, x Learned) error {
	return s.backend(s.groupOf(scope)).Learn(ctx, scope, l, x)
}

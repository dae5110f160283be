// Package redis is the Redis (and Valkey) rate-limit backend: one Lua script per decision over every limit of a request, with waiters queued per lane and woken one by one.
//
// All keys of one limiter group share the hash tag {group} (see lib.lua for
// the layout), so a request's limits — deployment, tenant, tenant+model —
// are checked and charged in one script, in one round trip, on one Cluster
// slot. A group is the unit of scale: ratelimit.Sharded spreads limits over
// groups (for example one per deployment and one per tenant), so that a
// Cluster's shards share the load, and decides a request over several
// groups in all of them at once.
package redis

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/ratelimit"
)

var (
	//go:embed lib.lua
	libSrc string
	//go:embed admit.lua
	admitSrc string
	//go:embed settle.lua
	settleSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed cooldown.lua
	cooldownSrc string
	//go:embed observe.lua
	observeSrc string
	//go:embed learn.lua
	learnSrc string

	admitScript    = rueidis.NewLuaScript(libSrc + "\n" + admitSrc)
	settleScript   = rueidis.NewLuaScript(libSrc + "\n" + settleSrc)
	extendScript   = rueidis.NewLuaScript(libSrc + "\n" + extendSrc)
	cooldownScript = rueidis.NewLuaScript(libSrc + "\n" + cooldownSrc)
	observeScript  = rueidis.NewLuaScript(libSrc + "\n" + observeSrc)
	learnScript    = rueidis.NewLuaScript(libSrc + "\n" + learnSrc)
)

// Defaults for Config.
const (
	DefaultPrefix = "llmgate:rl:"
	DefaultGroup  = "default"
)

// Config configures a Backend.
type Config struct {
	// Prefix starts every key. Default DefaultPrefix.
	Prefix string
	// Group is the hash tag shared by every key of this limiter. Default
	// DefaultGroup.
	Group string
}

// Backend is a ratelimit.Backend on Redis.
type Backend struct {
	c    rueidis.Client
	base string // KEYS[1] of every script: prefix + "{" + group + "}"
}

var _ ratelimit.Backend = (*Backend)(nil)

// New returns a backend storing limits through c; the caller keeps c.
func New(c rueidis.Client, cfg Config) *Backend {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	return &Backend{c: c, base: cfg.Prefix + "{" + cfg.Group + "}"}
}

// encodeSpec encodes r as the scripts' binary spec (see lib.lua): a header,
// then per charge its kind, scope, the fields the scripts read for it and its
// amounts. Lengths, not separators, delimit the strings, so a scope may hold
// any bytes; the field names are built here so that the scripts do not.
func encodeSpec(r *ratelimit.Request) (string, error) {
	if len(r.Charges) > math.MaxUint16 {
		return "", fmt.Errorf("%w: %d charges, at most %d", ratelimit.ErrInvalid, len(r.Charges), math.MaxUint16)
	}
	size := 1 + 2 + 8 + 8 + 4 + len(r.Lane)
	for _, c := range r.Charges {
		// kind, three lengths, the scope in each string, "b:" ":k:" and the
		// window's digits, "cd:", four doubles.
		size += 1 + 3*4 + 3*len(c.Scope) + 2 + 3 + 20 + 3 + 4*8
	}
	b := make([]byte, 0, size)
	b = append(b, 'S')
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.Charges)))
	b = appendFloat(b, max(r.Hold.Milliseconds(), 1))
	b = appendFloat(b, max(r.Defer.Microseconds(), 0))
	b = appendString(b, r.Lane)
	for _, c := range r.Charges {
		kind := byte('c')
		switch c.Limit.Kind {
		case ratelimit.Requests:
			kind = 'r'
		case ratelimit.Tokens:
			kind = 't'
		}
		window := c.Limit.Window.Microseconds()
		b = append(b, kind)
		b = appendString(b, c.Scope)
		// The limit's field: "b:<scope>:<kind>:<window_us>", its bucket in
		// B:s, or "c:<scope>".
		if kind == 'c' {
			b = binary.LittleEndian.AppendUint32(b, uint32(2+len(c.Scope)))
			b = append(b, "c:"...)
			b = append(b, c.Scope...)
		} else {
			var w [20]byte
			ws := strconv.AppendInt(w[:0], window, 10)
			b = binary.LittleEndian.AppendUint32(b, uint32(2+len(c.Scope)+3+len(ws)))
			b = append(b, "b:"...)
			b = append(b, c.Scope...)
			b = append(b, ':', kind, ':')
			b = append(b, ws...)
		}
		// The scope's cooldown field in B:s.
		b = binary.LittleEndian.AppendUint32(b, uint32(3+len(c.Scope)))
		b = append(b, "cd:"...)
		b = append(b, c.Scope...)
		b = appendFloat(b, c.Limit.Limit)
		b = appendFloat(b, window)
		b = appendFloat(b, c.Limit.Burst)
		b = appendFloat(b, c.Cost)
	}
	return string(b), nil
}

// appendFloat appends n as a little-endian double: exact up to 2^53, which
// bounds every amount (ratelimit.MaxAmount).
func appendFloat(b []byte, n int64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(n)))
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// decode parses a decision "a w d r1 s1 r2 s2 ..." (see lib.lua), or a
// hint "0 w d".
func decode(r *ratelimit.Request, raw string) (ratelimit.Decision, error) {
	f := strings.Fields(raw)
	n := make([]int64, len(f))
	for i, x := range f {
		v, err := parseInt(x)
		if err != nil {
			return ratelimit.Decision{}, fmt.Errorf("%w: malformed decision %q", ratelimit.ErrUnexpectedReply, raw)
		}
		n[i] = v
	}
	if len(n) < 3 || (len(n) != 3 && len(n) != 3+2*len(r.Charges)) {
		return ratelimit.Decision{}, fmt.Errorf("%w: malformed decision %q", ratelimit.ErrUnexpectedReply, raw)
	}
	d := ratelimit.Decision{ID: r.ID, Allowed: n[0] == 1}
	if len(n) > 3 {
		d.Limits = make([]ratelimit.Status, len(r.Charges))
		for i, c := range r.Charges {
			d.Limits[i] = ratelimit.Status{
				Scope: c.Scope, Kind: c.Limit.Kind, Limit: c.Limit.Limit,
				Remaining: max(n[3+2*i], 0), Reset: duration(n[4+2*i], time.Millisecond),
			}
		}
	}
	if d.Allowed {
		d.Delay = duration(n[1], time.Microsecond)
	} else {
		d.RetryAfter = duration(n[1], time.Microsecond)
		if n[2] >= 1 && n[2] <= int64(len(r.Charges)) {
			d.DeniedBy = r.Charges[n[2]-1].Scope
			d.DeniedKind = r.Charges[n[2]-1].Limit.Kind
		}
	}
	return d, nil
}

func parseInt(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

// duration converts n units to a Duration, clamped to [0, ~146 years].
func duration(n int64, unit time.Duration) time.Duration {
	const most = time.Duration(1 << 62)
	switch {
	case n <= 0:
		return 0
	case n > int64(most/unit):
		return most
	}
	return time.Duration(n) * unit
}

// unavailable marks an error of the client call itself as a store outage,
// to which the limits' fail-open / fail-closed policy applies.
func unavailable(op string, err error) error {
	return fmt.Errorf("%w: redis %s: %w", ratelimit.ErrStoreUnavailable, op, err)
}

// replyGrace is how long an admission waits for the store's reply after its
// caller's ctx ended.
const replyGrace = 5 * time.Second

// outlive returns a context for a store call that, once sent, must be seen
// through: it ends grace after ctx does, not with it.
func outlive(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	if ctx.Done() == nil {
		return ctx, func() {}
	}
	octx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel(context.Cause(ctx))
		case <-octx.Done():
		}
	})
	return octx, func() {
		stop()
		cancel(nil)
	}
}

// admit runs admit.lua. Once the script is sent it waits for the reply even
// if ctx ends meanwhile (up to replyGrace after): a command the client stopped
// waiting for still reaches the server, after the caller's next command when
// rueidis sent that one on another of its connections, so the Abandon of a
// waiter whose deadline cut its Enqueue short could run first and leave
// behind what the Enqueue then queued or admitted: a permit held until its
// hold expires. With the reply in hand, whatever follows runs after it.
// The hint is how long a refused waiter should sleep before it asks again:
// the decision's RetryAfter, or sooner when the script says so.
func (b *Backend) admit(ctx context.Context, r *ratelimit.Request, mode string, lease time.Duration) (ratelimit.Decision, time.Duration, error) {
	sp, err := encodeSpec(r)
	if err != nil {
		return ratelimit.Decision{}, 0, err
	}
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, 0, unavailable("admit", err) // not sent
	}
	args := []string{mode, r.ID, sp, strconv.Itoa(int(r.Priority)), strconv.FormatInt(max(lease.Milliseconds(), 1), 10)}
	sctx, done := outlive(ctx, replyGrace)
	vals, err := admitScript.Exec(sctx, b.c, []string{b.base}, args).ToArray()
	done()
	if err != nil {
		return ratelimit.Decision{}, 0, unavailable("admit", err)
	}
	if len(vals) != 2 && len(vals) != 3 {
		return ratelimit.Decision{}, 0, fmt.Errorf("%w: admit: %d values", ratelimit.ErrUnexpectedReply, len(vals))
	}
	raw, err := vals[1].ToString()
	if err != nil {
		return ratelimit.Decision{}, 0, fmt.Errorf("%w: admit: %w", ratelimit.ErrUnexpectedReply, err)
	}
	d, err := decode(r, raw)
	if err != nil {
		return d, 0, err
	}
	hint := d.RetryAfter
	if len(vals) == 3 {
		us, err := vals[2].AsInt64()
		if err != nil {
			return ratelimit.Decision{}, 0, fmt.Errorf("%w: admit: hint: %w", ratelimit.ErrUnexpectedReply, err)
		}
		hint = duration(us, time.Microsecond)
	}
	return d, hint, nil
}

// Admit makes one attempt; see ratelimit.Backend.
func (b *Backend) Admit(ctx context.Context, r *ratelimit.Request) (ratelimit.Decision, error) {
	d, _, err := b.admit(ctx, r, "a", 0)
	return d, err
}

// Enqueue queues r (or renews its place) and walks its lane.
func (b *Backend) Enqueue(ctx context.Context, r *ratelimit.Request, lease time.Duration) (ratelimit.Decision, bool, time.Duration, error) {
	d, hint, err := b.admit(ctx, r, "q", lease)
	if err != nil {
		return d, false, 0, err
	}
	return d, d.Allowed, hint, nil
}

// Await blocks on r's wake-up list for up to timeout.
func (b *Backend) Await(ctx context.Context, r *ratelimit.Request, timeout time.Duration) (ratelimit.Decision, bool, error) {
	// A client-side deadline keeps the timeout: an idle Redis checks BLPOP
	// timeouts only once per server tick (100 ms at hz 10). A decision popped
	// just as the deadline fires is not lost: admit.lua returns it from the
	// reservation on the next call.
	wctx, cancel := context.WithTimeout(ctx, max(timeout, time.Millisecond))
	defer cancel()
	cmd := b.c.B().Blpop().Key(b.base + ":n:" + r.ID).Timeout((timeout + 5*time.Second).Seconds()).Build().UnblockOnCancel()
	vals, err := b.c.Do(wctx, cmd).AsStrSlice()
	if rueidis.IsRedisNil(err) || (err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)) {
		return ratelimit.Decision{}, false, nil
	}
	if err != nil {
		return ratelimit.Decision{}, false, unavailable("wait", err)
	}
	if len(vals) != 2 {
		return ratelimit.Decision{}, false, fmt.Errorf("%w: wait: %d values", ratelimit.ErrUnexpectedReply, len(vals))
	}
	d, err := decode(r, vals[1]) // a decision, or a hint "0 w d"
	return d, err == nil && d.Allowed, err
}

// settle runs settle.lua: actual nil refunds everything.
func (b *Backend) settle(ctx context.Context, id string, actual []int64, lane string) error {
	args := make([]string, 3, 3+len(actual))
	args[0], args[2] = id, lane
	if actual != nil {
		args[1] = "s"
		for _, a := range actual {
			args = append(args, strconv.FormatInt(a, 10))
		}
	}
	n, err := settleScript.Exec(ctx, b.c, []string{b.base}, args).AsInt64()
	if err != nil {
		return unavailable("settle", err)
	}
	if n == 0 && lane == "" {
		return ratelimit.ErrUnknownReservation
	}
	return nil
}

// Abandon takes r out of its lane, refunding it if it was admitted meanwhile.
func (b *Backend) Abandon(ctx context.Context, r *ratelimit.Request) error {
	return b.settle(ctx, r.ID, nil, r.Lane)
}

// Settle applies the real costs; nil actual refunds everything.
func (b *Backend) Settle(ctx context.Context, id string, actual []int64) error {
	return b.settle(ctx, id, actual, "")
}

// Extend keeps an unsettled reservation alive for hold from now, and
// records used (when not empty) as what it has used so far.
func (b *Backend) Extend(ctx context.Context, id string, hold time.Duration, used []int64) error {
	args := make([]string, 2, 2+len(used))
	args[0], args[1] = id, strconv.FormatInt(hold.Milliseconds(), 10)
	for _, u := range used {
		args = append(args, strconv.FormatInt(u, 10))
	}
	n, err := extendScript.Exec(ctx, b.c, []string{b.base}, args).AsInt64()
	if err != nil {
		return unavailable("extend", err)
	}
	if n == 0 {
		return ratelimit.ErrUnknownReservation
	}
	return nil
}

// Cooldown holds back scope for d, never shortening a longer cooldown.
func (b *Backend) Cooldown(ctx context.Context, scope string, d time.Duration) (time.Duration, error) {
	ms, err := cooldownScript.Exec(ctx, b.c, []string{b.base}, []string{scope, strconv.FormatInt(max(d.Milliseconds(), 1), 10)}).AsInt64()
	if err != nil {
		return 0, unavailable("cooldown", err)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Observe lowers scope's bucket for l to at most remaining.
func (b *Backend) Observe(ctx context.Context, scope string, l ratelimit.Limit, remaining int64) error {
	sp, err := encodeSpec(&ratelimit.Request{Charges: []ratelimit.Charge{{Scope: scope, Limit: l}}, Hold: time.Millisecond})
	if err != nil {
		return err
	}
	err = observeScript.Exec(ctx, b.c, []string{b.base}, []string{sp, strconv.FormatInt(remaining, 10)}).Error()
	if err != nil {
		return unavailable("observe", err)
	}
	return nil
}

// Learn records the provider's own limit for scope's bucket of l; see
// ratelimit.Backend.
func (b *Backend) Learn(ctx context.Context, scope string, l ratelimit.Limit, x ratelimit.Learned) error {
	sp, err := encodeSpec(&ratelimit.Request{Charges: []ratelimit.Charge{{Scope: scope, Limit: l}}, Hold: time.Millisecond})
	if err != nil {
		return err
	}
	args := []string{sp, strconv.FormatInt(x.Limit, 10), strconv.FormatInt(max(x.Remaining, -1), 10), strconv.FormatInt(max(x.TTL.Milliseconds(), 1), 10)}
	if err := learnScript.Exec(ctx, b.c, []string{b.base}, args).Error(); err != nil {
		return unavailable("learn", err)
	}
	return nil
}

// Package redis is the Redis (and Valkey) rate-limit backend: one Lua script per decision over every limit of a request, with waiters queued per lane and woken one by one.
//
// All keys of one limiter group share the hash tag {group} (see lib.lua for
// the layout), so a request's limits — deployment, tenant, tenant+model —
// are checked and charged in one script, in one round trip, on one Cluster
// slot. A group is the unit of scale: run separate groups (for example one
// per provider) to spread load over Cluster shards; requests of different
// groups never share limits.
package redis

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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

	admitScript    = rueidis.NewLuaScript(libSrc + "\n" + admitSrc)
	settleScript   = rueidis.NewLuaScript(libSrc + "\n" + settleSrc)
	extendScript   = rueidis.NewLuaScript(libSrc + "\n" + extendSrc)
	cooldownScript = rueidis.NewLuaScript(libSrc + "\n" + cooldownSrc)
	observeScript  = rueidis.NewLuaScript(libSrc + "\n" + observeSrc)
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

// spec is a request as the scripts see it.
type spec struct {
	C [][]any `json:"c"` // [kind, scope, limit, window_ms, burst, cost]
	H int64   `json:"h"` // hold ms
	L string  `json:"l"` // lane
}

func encodeSpec(r *ratelimit.Request) (string, error) {
	s := spec{H: max(r.Hold.Milliseconds(), 1), L: r.Lane, C: make([][]any, len(r.Charges))}
	for i, c := range r.Charges {
		kind := "c"
		switch c.Limit.Kind {
		case ratelimit.Requests:
			kind = "r"
		case ratelimit.Tokens:
			kind = "t"
		}
		s.C[i] = []any{kind, c.Scope, c.Limit.Limit, c.Limit.Window.Milliseconds(), c.Limit.Burst, c.Cost}
	}
	b, err := json.Marshal(s)
	return string(b), err
}

// wireDecision is a decision as the scripts return it.
type wireDecision struct {
	A int       `json:"a"`
	W float64   `json:"w"` // µs; -1 unknown
	D int       `json:"d"` // 1-based index of the first refusing charge
	S [][]int64 `json:"s"` // [remaining, reset_ms]
}

func decode(r *ratelimit.Request, raw string) (ratelimit.Decision, error) {
	var w wireDecision
	if err := json.Unmarshal([]byte(raw), &w); err != nil {
		return ratelimit.Decision{}, fmt.Errorf("ratelimit: redis: malformed decision %q: %w", raw, err)
	}
	d := ratelimit.Decision{ID: r.ID, Allowed: w.A == 1, Limits: make([]ratelimit.Status, len(r.Charges))}
	for i, c := range r.Charges {
		d.Limits[i] = ratelimit.Status{Scope: c.Scope, Kind: c.Limit.Kind, Limit: c.Limit.Limit}
		if i < len(w.S) && len(w.S[i]) == 2 {
			d.Limits[i].Remaining = w.S[i][0]
			d.Limits[i].Reset = time.Duration(w.S[i][1]) * time.Millisecond
		}
	}
	if !d.Allowed {
		if w.W > 0 {
			d.RetryAfter = time.Duration(w.W) * time.Microsecond
		}
		if w.D >= 1 && w.D <= len(r.Charges) {
			d.DeniedBy = r.Charges[w.D-1].Scope
			d.DeniedKind = r.Charges[w.D-1].Limit.Kind
		}
	}
	return d, nil
}

func (b *Backend) admit(ctx context.Context, r *ratelimit.Request, mode string, lease time.Duration) (ratelimit.Decision, error) {
	sp, err := encodeSpec(r)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	args := []string{mode, r.ID, sp, strconv.Itoa(int(r.Priority)), strconv.FormatInt(max(lease.Milliseconds(), 1), 10)}
	vals, err := admitScript.Exec(ctx, b.c, []string{b.base}, args).ToArray()
	if err != nil {
		return ratelimit.Decision{}, fmt.Errorf("ratelimit: redis admit: %w", err)
	}
	if len(vals) != 2 {
		return ratelimit.Decision{}, fmt.Errorf("ratelimit: redis admit: unexpected reply of %d values", len(vals))
	}
	raw, err := vals[1].ToString()
	if err != nil {
		return ratelimit.Decision{}, fmt.Errorf("ratelimit: redis admit: %w", err)
	}
	return decode(r, raw)
}

// Admit makes one attempt; see ratelimit.Backend.
func (b *Backend) Admit(ctx context.Context, r *ratelimit.Request) (ratelimit.Decision, error) {
	return b.admit(ctx, r, "a", 0)
}

// Enqueue queues r (or renews its place) and walks its lane.
func (b *Backend) Enqueue(ctx context.Context, r *ratelimit.Request, lease time.Duration) (ratelimit.Decision, bool, time.Duration, error) {
	d, err := b.admit(ctx, r, "q", lease)
	if err != nil {
		return d, false, 0, err
	}
	return d, d.Allowed, d.RetryAfter, nil
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
		return ratelimit.Decision{}, false, fmt.Errorf("ratelimit: redis wait: %w", err)
	}
	if len(vals) != 2 {
		return ratelimit.Decision{}, false, fmt.Errorf("ratelimit: redis wait: unexpected reply of %d values", len(vals))
	}
	d, err := decode(r, vals[1]) // a decision, or a hint {"a":0,"w":...}
	return d, err == nil && d.Allowed, err
}

func (b *Backend) settle(ctx context.Context, id, actual, lane string) error {
	n, err := settleScript.Exec(ctx, b.c, []string{b.base}, []string{id, actual, lane}).AsInt64()
	if err != nil {
		return fmt.Errorf("ratelimit: redis settle: %w", err)
	}
	if n == 0 && lane == "" {
		return ratelimit.ErrUnknownReservation
	}
	return nil
}

// Abandon takes r out of its lane, refunding it if it was admitted meanwhile.
func (b *Backend) Abandon(ctx context.Context, r *ratelimit.Request) error {
	return b.settle(ctx, r.ID, "", r.Lane)
}

// Settle applies the real costs; nil actual refunds everything.
func (b *Backend) Settle(ctx context.Context, id string, actual []int64) error {
	if actual == nil {
		return b.settle(ctx, id, "", "")
	}
	raw, err := json.Marshal(actual)
	if err != nil {
		return err
	}
	return b.settle(ctx, id, string(raw), "")
}

// Extend keeps an unsettled reservation alive for hold from now.
func (b *Backend) Extend(ctx context.Context, id string, hold time.Duration) error {
	n, err := extendScript.Exec(ctx, b.c, []string{b.base}, []string{id, strconv.FormatInt(hold.Milliseconds(), 10)}).AsInt64()
	if err != nil {
		return fmt.Errorf("ratelimit: redis extend: %w", err)
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
		return 0, fmt.Errorf("ratelimit: redis cooldown: %w", err)
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
		return fmt.Errorf("ratelimit: redis observe: %w", err)
	}
	return nil
}

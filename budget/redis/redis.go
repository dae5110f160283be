// Package redis is the Redis (and Valkey) budget backend: one Lua script per operation, one round trip per Reserve and per Settle (concurrent Settles of one window share it), keys of a tenant's window under one hash tag.
//
// # Keys
//
// The state of tenant T in window W (e.g. "2026-11") lives in ten keys
// sharing the hash tag {T:W}, so every script touches one Cluster slot
// (in T, "%", "{" and "}" are written %25, %7B and %7D):
//
//	<prefix>{T:W}:t  hash: spent and reserved tokens and µUSD
//	<prefix>{T:W}:h  hash: live holds, reservation ID -> "tokens µUSD"
//	<prefix>{T:W}:x  zset: live holds by expiry (server ms)
//	<prefix>{T:W}:s  zset: settled (or expired and charged) IDs by when they may be forgotten
//	<prefix>{T:W}:u  hash: usage rows (requests, tokens, µUSD, expired requests per model and deployment)
//	<prefix>{T:W}:c  hash: live holds, reservation ID -> what it is charged if it expires
//	<prefix>{T:W}:e  hash: expired holds, reservation ID -> the charge made (while remembered)
//	<prefix>{T:W}:q  zset: the waiting line, reservation ID by arrival
//	<prefix>{T:W}:w  zset: the same IDs by when their place is dropped unless renewed
//	<prefix>{T:W}:l  hash: recent answers' sizes and the estimate learned from them, per model
//
// and, per waiter, <prefix>{T:W}:n:<id>, a list it blocks on (BLPOP) until
// a settle, a release or the waiter ahead of it wakes it: no polling.
//
// Every script first sweeps expired holds, charging them (see the budget
// package doc), reading time from the server (redis.call('TIME')), so a
// crashed caller's holds are charged without any background job. The window ID is computed by
// the caller from its own clock: windows are calendar days and months in a
// configured time zone, so clock skew between replicas only matters within
// seconds of midnight, where it decides which of two adjacent windows a
// request is counted in, never whether it is counted. Keys expire at the
// window's end plus the configured retention.
//
// Durability is Redis's: run it with appendonly yes (see docs/budget.md).
package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/budget"
)

var (
	//go:embed common.lua
	commonSrc string
	//go:embed reserve.lua
	reserveSrc string
	//go:embed settle.lua
	settleSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed totals.lua
	totalsSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed usage.lua
	usageSrc string
	//go:embed leave.lua
	leaveSrc string

	reserveScript = newScript(commonSrc + reserveSrc)
	settleScript  = newScript(commonSrc + settleSrc)
	releaseScript = newScript(commonSrc + releaseSrc)
	totalsScript  = rueidis.NewLuaScript(commonSrc + totalsSrc)
	renewScript   = newScript(commonSrc + renewSrc)
	usageScript   = rueidis.NewLuaScript(commonSrc + usageSrc)
	leaveScript   = newScript(commonSrc + leaveSrc)
)

// DefaultPrefix starts every key this backend writes.
const DefaultPrefix = "llmgate:budget:"

// Config configures a Backend.
type Config struct {
	// Prefix starts every key. Default DefaultPrefix.
	Prefix string
	// AckReplicas, when positive, makes every write (reserve, settle,
	// release, renew) wait until that many replicas acknowledge it (WAIT,
	// sent with the script: no extra round trip), so that a failover to one
	// of them keeps it. A write they do not acknowledge within AckTimeout
	// fails with ErrNotReplicated: a reserve is then released and refused
	// (fail closed), a settle can be retried (it is idempotent per ID).
	// Default 0: replication stays asynchronous, and a failover can lose
	// the last writes (docs/failover.md).
	AckReplicas int
	// AckTimeout bounds that wait. Default DefaultAckTimeout.
	AckTimeout time.Duration
}

// Backend is a budget.Backend on Redis standalone, Sentinel or Cluster.
type Backend struct {
	c           rueidis.Client
	prefix      string
	ackReplicas int
	ackTimeout  time.Duration

	mu      sync.Mutex              // protects settles
	settles map[string]*settleQueue // by window (first key), while settles of it run

	// For tests: called before each batch is sent, and when a settle
	// queues behind a call in flight.
	beforeBatch func([]*settleCall)
	onQueued    func()
}

var _ budget.Backend = (*Backend)(nil)

// New returns a backend that stores budgets through c. The caller keeps
// ownership of c.
func New(c rueidis.Client, cfg Config) *Backend {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	return &Backend{c: c, prefix: cfg.Prefix, ackReplicas: cfg.AckReplicas, ackTimeout: cfg.AckTimeout, settles: map[string]*settleQueue{}}
}

// Keys returns the ten Redis keys of key's window, in the order the
// scripts take them: totals, holds, expiry, settled, usage, charges,
// expired, line, leases, learned.
func (b *Backend) Keys(key budget.Key) []string {
	base := b.base(key)
	return []string{base + "t", base + "h", base + "x", base + "s", base + "u", base + "c", base + "e", base + "q", base + "w", base + "l"}
}

// base is what every key of key's window starts with.
func (b *Backend) base(key budget.Key) string {
	return b.prefix + "{" + tagEscaper.Replace(key.Tenant) + ":" + key.WindowID + "}:"
}

// tagEscaper keeps braces in a tenant's name from ending the hash tag early
// (a tenant "}x" would otherwise leave an empty tag, and keys in different
// slots). Escaping "%" too keeps the mapping one-to-one.
var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// Reserve runs reserve.lua.
func (b *Backend) Reserve(ctx context.Context, req budget.ReserveRequest) (budget.ReserveResult, error) {
	args := []string{
		req.ID,
		itoa(req.Hold.Tokens), itoa(req.Hold.MicroUSD),
		itoa(req.Cap.Tokens), itoa(req.Cap.MicroUSD),
		itoa(max(req.TTL.Milliseconds(), 1)),
		itoa(req.Keep.UnixMilli()),
		itoa(req.Charge.Usage.PromptTokens), itoa(req.Charge.Usage.CompletionTokens),
		itoa(max(req.Remember.Milliseconds(), 1)),
		rowField(req.Charge.Model, req.Charge.Deployment),
		itoa(max(req.WaiterLease.Milliseconds(), 0)),
		req.Charge.Model,
	}
	if req.WaiterLease > 0 {
		args[11] = itoa(max(req.WaiterLease.Milliseconds(), 1))
	}
	r, ackErr := b.write(ctx, reserveScript, b.Keys(req.Key), args)
	v, err := ints(r, 6)
	if err != nil {
		return budget.ReserveResult{}, fmt.Errorf("budget: redis reserve: %w", err)
	}
	if ackErr != nil {
		// Not kept by the replicas: undo it (best effort; unreplicated too,
		// it dies with the master) and refuse.
		if v[0] == 1 || v[0] == 2 {
			_ = releaseScript.Lua.Exec(context.WithoutCancel(ctx), b.c, b.Keys(req.Key), []string{req.ID}).Error()
		}
		return budget.ReserveResult{}, fmt.Errorf("budget: redis reserve: %w", ackErr)
	}
	res := budget.ReserveResult{
		Spent:    budget.Amount{Tokens: v[1], MicroUSD: v[2]},
		Reserved: budget.Amount{Tokens: v[3], MicroUSD: v[4]},
		Learned:  v[5],
	}
	switch v[0] {
	case 0:
	case 4:
		res.Queued = true
	case 1, 2:
		res.Admitted = true
	case 3:
		return budget.ReserveResult{}, budget.ErrSettledID
	default:
		return budget.ReserveResult{}, fmt.Errorf("budget: redis reserve: unknown status %d", v[0])
	}
	return res, nil
}

// maxBatch bounds the settles sent in one script call.
const maxBatch = 128

// settleQueue holds the settles of one window waiting for the call in
// flight to return.
type settleQueue struct {
	pending []*settleCall
}

type settleCall struct {
	req  budget.SettleRequest
	res  budget.SettleResult
	err  error
	done chan struct{}
}

// Settle runs settle.lua. While a settle of the same window is in flight,
// further ones queue and then go together in one call (up to maxBatch):
// one round trip and one script for a burst of settles, and no added wait
// when they come one at a time.
func (b *Backend) Settle(ctx context.Context, req budget.SettleRequest) (budget.SettleResult, error) {
	c := &settleCall{req: req, done: make(chan struct{})}
	keys := b.Keys(req.Key)
	b.mu.Lock()
	q, running := b.settles[keys[0]]
	if !running {
		q = &settleQueue{}
		b.settles[keys[0]] = q
	}
	q.pending = append(q.pending, c)
	b.mu.Unlock()
	if running {
		if b.onQueued != nil {
			b.onQueued()
		}
	} else {
		// This call sends the queue, its own settle first, until its own
		// result is in; whoever is left is sent by a goroutine.
		b.flush(ctx, keys, q, c)
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		// It may still be applied; a retry with the same ID is a no-op then.
		return budget.SettleResult{}, ctx.Err()
	}
}

// flush sends q's settles in batches until own is done, then hands the
// rest to a goroutine (own nil: until the queue is empty).
func (b *Backend) flush(ctx context.Context, keys []string, q *settleQueue, own *settleCall) {
	// The batch carries other callers' settles: one caller's cancellation
	// must not fail them.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for {
		b.mu.Lock()
		n := min(len(q.pending), maxBatch)
		if n == 0 {
			delete(b.settles, keys[0])
			b.mu.Unlock()
			return
		}
		batch := q.pending[:n:n]
		q.pending = q.pending[n:]
		b.mu.Unlock()
		b.sendBatch(ctx, keys, batch)
		if own == nil {
			continue
		}
		select {
		case <-own.done:
			go b.flush(context.Background(), keys, q, nil)
			return
		default:
		}
	}
}

// sendBatch runs settle.lua over batch and completes each of its calls.
func (b *Backend) sendBatch(ctx context.Context, keys []string, batch []*settleCall) {
	if b.beforeBatch != nil {
		b.beforeBatch(batch)
	}
	keep := int64(0)
	for _, c := range batch {
		keep = max(keep, c.req.Keep.UnixMilli())
	}
	args := make([]string, 1, 1+11*len(batch))
	args[0] = itoa(keep)
	for _, c := range batch {
		rec := c.req.Record
		args = append(args,
			c.req.ID,
			itoa(rec.Usage.Tokens()), itoa(rec.MicroUSD),
			itoa(rec.Usage.PromptTokens), itoa(rec.Usage.CompletionTokens), itoa(rec.Usage.CachedTokens),
			rowField(rec.Model, rec.Deployment),
			itoa(max(c.req.Remember.Milliseconds(), 1)),
			itoa(max(rec.Requests, 1)),
			c.req.Learn.Model, itoa(max(c.req.Learn.Completion, 0)),
		)
	}
	r, ackErr := b.write(ctx, settleScript, keys, args)
	v, err := ints(r, 3*len(batch))
	if err == nil {
		err = ackErr
	}
	for i, c := range batch {
		if err != nil {
			c.err = fmt.Errorf("budget: redis settle: %w", err)
		} else {
			c.res = budget.SettleResult{Applied: v[3*i] == 1, Spent: budget.Amount{Tokens: v[3*i+1], MicroUSD: v[3*i+2]}}
		}
		close(c.done)
	}
}

// Release runs release.lua.
func (b *Backend) Release(ctx context.Context, key budget.Key, id string) (bool, error) {
	r, ackErr := b.write(ctx, releaseScript, b.Keys(key), []string{id})
	n, err := r.AsInt64()
	if err == nil {
		err = ackErr
	}
	if err != nil {
		return false, fmt.Errorf("budget: redis release: %w", err)
	}
	return n == 1, nil
}

// Await blocks on id's wake-up list for up to timeout.
func (b *Backend) Await(ctx context.Context, key budget.Key, id string, timeout time.Duration) (bool, error) {
	// A client-side deadline keeps the timeout: an idle Redis checks BLPOP
	// timeouts only once per server tick (100 ms at hz 10). A wake-up
	// popped just as the deadline fires is lost, which only costs the
	// waiter's next Reserve, which it makes anyway.
	wctx, cancel := context.WithTimeout(ctx, max(timeout, time.Millisecond))
	defer cancel()
	cmd := b.c.B().Blpop().Key(b.base(key) + "n:" + id).Timeout((timeout + 5*time.Second).Seconds()).Build().UnblockOnCancel()
	err := b.c.Do(wctx, cmd).Error()
	switch {
	case err == nil:
		return true, nil
	case rueidis.IsRedisNil(err) || (ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)):
		return false, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	}
	return false, fmt.Errorf("budget: redis await: %w", err)
}

// Leave runs leave.lua.
func (b *Backend) Leave(ctx context.Context, key budget.Key, id string) error {
	r, ackErr := b.write(ctx, leaveScript, b.Keys(key), []string{id})
	if err := errors.Join(r.Error(), ackErr); err != nil {
		return fmt.Errorf("budget: redis leave: %w", err)
	}
	return nil
}

// Renew runs renew.lua.
func (b *Backend) Renew(ctx context.Context, req budget.RenewRequest) (bool, error) {
	row := ""
	if req.Charge.Model != "" {
		row = rowField(req.Charge.Model, req.Charge.Deployment)
	}
	args := []string{
		req.ID,
		itoa(max(req.TTL.Milliseconds(), 1)),
		itoa(req.Hold.Tokens), itoa(req.Hold.MicroUSD),
		itoa(req.Charge.Usage.PromptTokens), itoa(req.Charge.Usage.CompletionTokens),
		row,
		itoa(req.Keep.UnixMilli()),
	}
	r, ackErr := b.write(ctx, renewScript, b.Keys(req.Key), args)
	n, err := r.AsInt64()
	if err == nil {
		err = ackErr
	}
	if err != nil {
		return false, fmt.Errorf("budget: redis renew: %w", err)
	}
	return n == 1, nil
}

// Totals runs totals.lua.
func (b *Backend) Totals(ctx context.Context, key budget.Key) (budget.Totals, error) {
	v, err := ints(totalsScript.Exec(ctx, b.c, b.Keys(key), nil), 5)
	if err != nil {
		return budget.Totals{}, fmt.Errorf("budget: redis totals: %w", err)
	}
	return budget.Totals{
		Spent:    budget.Amount{Tokens: v[0], MicroUSD: v[1]},
		Reserved: budget.Amount{Tokens: v[2], MicroUSD: v[3]},
		Holds:    int(v[4]),
	}, nil
}

// Usage runs usage.lua: it reads the window's usage hash after sweeping,
// so that expired holds are counted in the rows.
func (b *Backend) Usage(ctx context.Context, key budget.Key) ([]budget.UsageRow, error) {
	m, err := usageScript.Exec(ctx, b.c, b.Keys(key), nil).AsIntMap()
	if err != nil {
		return nil, fmt.Errorf("budget: redis usage: %w", err)
	}
	rows := make(map[string]*budget.UsageRow)
	for field, n := range m {
		kind, row, ok := strings.Cut(field, ":")
		if !ok || len(kind) != 1 {
			return nil, fmt.Errorf("budget: redis usage: unexpected field %q", field)
		}
		r := rows[row]
		if r == nil {
			model, dep, err := parseRowField(row)
			if err != nil {
				return nil, fmt.Errorf("budget: redis usage: %w", err)
			}
			r = &budget.UsageRow{Model: model, Deployment: dep}
			rows[row] = r
		}
		switch kind {
		case "n":
			r.Requests = n
		case "p":
			r.PromptTokens = n
		case "c":
			r.CompletionTokens = n
		case "k":
			r.CachedTokens = n
		case "m":
			r.MicroUSD = n
		case "e":
			r.Expired = n
		default:
			return nil, fmt.Errorf("budget: redis usage: unexpected field %q", field)
		}
	}
	out := make([]budget.UsageRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	return out, nil
}

// rowField encodes a usage row's (model, deployment) unambiguously.
func rowField(model, deployment string) string {
	return strconv.Itoa(len(model)) + ":" + model + deployment
}

// parseRowField decodes rowField.
func parseRowField(s string) (model, deployment string, err error) {
	n, rest, ok := strings.Cut(s, ":")
	l, perr := strconv.Atoi(n)
	if !ok || perr != nil || l < 0 || l > len(rest) {
		return "", "", fmt.Errorf("malformed usage row %q", s)
	}
	return rest[:l], rest[l:], nil
}

// ints decodes an array reply of at least n integers.
func ints(r rueidis.RedisResult, n int) ([]int64, error) {
	vals, err := r.ToArray()
	if err != nil {
		return nil, err
	}
	if len(vals) < n {
		return nil, fmt.Errorf("unexpected reply of %d values, want %d", len(vals), n)
	}
	out := make([]int64, len(vals))
	for i, v := range vals {
		if out[i], err = v.AsInt64(); err != nil {
			return nil, errors.Join(fmt.Errorf("reply value %d", i), err)
		}
	}
	return out, nil
}

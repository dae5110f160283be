package budget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/clock"
)

// Defaults used when a Config field is zero.
const (
	// DefaultTTL is how long a reservation lives unless settled, released
	// or renewed: longer than any request, stream included, should take
	// for callers that never call Renew. Callers that renew can use a much
	// shorter TTL, so that a crashed caller's holds are charged sooner.
	DefaultTTL = 15 * time.Minute
	// DefaultRememberSettled is how long a settled ID is remembered, so that
	// a repeated Settle within it is a no-op.
	DefaultRememberSettled = 15 * time.Minute
	// DefaultRetention is how long a window's spend and usage rows are kept
	// after the window ends (13 months and a bit: enough for a year-over-year
	// monthly report).
	DefaultRetention = 400 * 24 * time.Hour
	// MinTTL is the smallest reservation TTL accepted.
	MinTTL = 10 * time.Millisecond
	// DefaultWaiterLease is how long a place in a budget's waiting line
	// lives without renewal (waiters renew it every third of it): a
	// waiter that died holds up the line behind it this long at most.
	DefaultWaiterLease = 2 * time.Second
)

// Config configures a Manager. The zero value is valid.
type Config struct {
	// Prices prices models. Default DefaultPrices(); to add or override
	// models, pass DefaultPrices().Merge(yours).
	Prices PriceTable
	// TTL is how long a reservation lives unless settled, released or
	// renewed (Renew); an expired reservation is charged its hold (see the
	// package doc). Default DefaultTTL, minimum MinTTL.
	TTL time.Duration
	// RememberSettled is how long a settled reservation ID is remembered so
	// that a repeated Settle is a no-op, and how long an expired one's
	// charge is remembered so that a late Settle replaces it. Default
	// DefaultRememberSettled.
	RememberSettled time.Duration
	// Retention is how long a window's spend and usage rows are kept after
	// the window ends. Default DefaultRetention.
	Retention time.Duration
	// FailOpen admits requests, unchecked, when the store cannot be reached.
	// The default (false) is fail-closed: Reserve returns an error wrapping
	// ErrStoreUnavailable and the caller denies the request. Either way
	// every store failure is logged and counted in Stats.
	FailOpen bool
	// WaiterLease is how long a ReserveWait's place in the budget's
	// waiting line lives unless renewed; waiters renew it every
	// WaiterLease/3. Default DefaultWaiterLease, minimum MinTTL.
	WaiterLease time.Duration
	// Clock gives the time that decides which period a request falls in.
	// Default the real clock. (Reservation expiry uses the store's clock.)
	Clock clock.Clock
	// Logger receives store failures and unpriced models. Default: discard.
	Logger *slog.Logger
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Prices == nil {
		c.Prices = DefaultPrices()
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.RememberSettled == 0 {
		c.RememberSettled = DefaultRememberSettled
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.WaiterLease == 0 {
		c.WaiterLease = DefaultWaiterLease
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports settings a Manager cannot honour.
func (c Config) Validate() error {
	if c.TTL < MinTTL {
		return fmt.Errorf("%w: config: TTL %v is below the minimum %v", ErrInvalid, c.TTL, MinTTL)
	}
	if c.RememberSettled < MinTTL {
		return fmt.Errorf("%w: config: RememberSettled %v is below the minimum %v", ErrInvalid, c.RememberSettled, MinTTL)
	}
	if c.WaiterLease < MinTTL {
		return fmt.Errorf("%w: config: WaiterLease %v is below the minimum %v", ErrInvalid, c.WaiterLease, MinTTL)
	}
	if c.Retention < 0 {
		return fmt.Errorf("%w: config: Retention %v is negative; use 0 for the default %v", ErrInvalid, c.Retention, DefaultRetention)
	}
	if err := c.Prices.Validate(); err != nil {
		return fmt.Errorf("config: Prices: %w", err)
	}
	return nil
}

// Stats counts a Manager's decisions and failures since it was created.
type Stats struct {
	// Admitted counts reservations admitted by the store.
	Admitted uint64
	// Denied counts reservations denied with ErrExhausted.
	Denied uint64
	// StoreErrors counts store calls that failed (every operation).
	StoreErrors uint64
	// FailedOpen counts reservations admitted unchecked because the store
	// failed and FailOpen is set.
	FailedOpen uint64
	// Settled counts settles that charged a record; duplicates are not
	// counted.
	Settled uint64
	// Unpriced counts settled records whose model had no price: their cost
	// was recorded as 0.
	Unpriced uint64
	// Waiting is how many ReserveWait calls wait for room now.
	Waiting uint64
}

// Manager admits, settles and reports budgets over a Backend. It is safe
// for concurrent use; several Managers (one per replica) can share a store.
type Manager struct {
	b   Backend
	cfg Config

	admitted, denied, storeErrors, failedOpen, settled, unpriced atomic.Uint64

	warnedMu sync.Mutex          // protects warned
	warned   map[string]struct{} // unpriced models already logged

	learned learnedCache // the store's learned completion estimates
	waiting atomic.Int64 // ReserveWaits in a line now
}

// New returns a Manager over b, or an error if cfg is invalid.
func New(b Backend, cfg Config) (*Manager, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil Backend", ErrInvalid)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Manager{b: b, cfg: cfg, warned: make(map[string]struct{})}, nil
}

// Backend returns the store side of m.
func (m *Manager) Backend() Backend { return m.b }

// TTL returns how long m's reservations live without Renew.
func (m *Manager) TTL() time.Duration { return m.cfg.TTL }

// Prices returns the price table m charges with. Do not modify it.
func (m *Manager) Prices() PriceTable { return m.cfg.Prices }

// Stats returns m's counters.
func (m *Manager) Stats() Stats {
	return Stats{
		Admitted:    m.admitted.Load(),
		Denied:      m.denied.Load(),
		StoreErrors: m.storeErrors.Load(),
		FailedOpen:  m.failedOpen.Load(),
		Settled:     m.settled.Load(),
		Unpriced:    m.unpriced.Load(),
		Waiting:     uint64(m.waiting.Load()),
	}
}

// Reserve admits a request to b if its estimate fits in what is left of the
// current period, and holds the estimate until Settle or Release (or the
// TTL, when the hold is charged; Renew extends it). id identifies the request ("" = a new random ID); reserving an ID
// that is already held reserves nothing more, so a Reserve whose outcome
// was unknown (a timeout) can be retried. model prices the estimate: pass an
// upper bound (prompt tokens plus max_tokens, no cached tokens) and the
// budget can never be overshot.
//
// A denial returns an *ExhaustedError (wrapping ErrExhausted) and changes
// nothing. If the store fails, Reserve returns an error wrapping
// ErrStoreUnavailable, or, with Config.FailOpen, an Unchecked reservation.
func (m *Manager) Reserve(ctx context.Context, b Budget, id, model string, estimate Usage) (Reservation, error) {
	res, _, err := m.reserve(ctx, b, id, model, estimate, 0)
	if e := (*ExhaustedError)(nil); errors.As(err, &e) {
		m.denied.Add(1)
	}
	return res, err
}

// reserve is Reserve that, with a lease, waits its turn in the budget's
// line: queued reports that it was not admitted but has a place in it, and
// err is then the *ExhaustedError to return if it stops waiting. Denials
// are not counted here: a waiter is denied once, when it gives up.
func (m *Manager) reserve(ctx context.Context, b Budget, id, model string, estimate Usage, lease time.Duration) (res Reservation, queued bool, err error) {
	if err := b.Validate(); err != nil {
		return Reservation{}, false, err
	}
	if id == "" {
		id = NewID()
	}
	if err := validName("reservation ID", id); err != nil {
		return Reservation{}, false, err
	}
	if err := validName("model", model); err != nil {
		return Reservation{}, false, err
	}
	if err := estimate.Validate(); err != nil {
		return Reservation{}, false, fmt.Errorf("estimate: %w", err)
	}
	cost, known := m.cfg.Prices.Cost(model, estimate)
	if !known && b.MicroUSD > 0 {
		return Reservation{}, false, fmt.Errorf("%w %q: the budget of tenant %q has a money cap, so the model needs a price: add it to the price table (USD per million tokens)", ErrUnknownPrice, model, b.Tenant)
	}
	hold := Amount{Tokens: estimate.Tokens(), MicroUSD: cost}
	if hold.MicroUSD > MaxAmount {
		return Reservation{}, false, fmt.Errorf("%w: estimate costs %s, above the maximum %s", ErrInvalid, FormatUSD(hold.MicroUSD), FormatUSD(MaxAmount))
	}
	w, err := b.Window(m.cfg.Clock.Now())
	if err != nil {
		return Reservation{}, false, err
	}
	res = Reservation{ID: id, Tenant: b.Tenant, Window: w, Model: model, Estimate: estimate, Hold: hold}
	r, err := m.b.Reserve(ctx, ReserveRequest{
		Key:  Key{Tenant: b.Tenant, WindowID: w.ID},
		ID:   id,
		Hold: hold,
		Cap:  b.Cap(),
		TTL:  m.cfg.TTL,
		Keep: m.keep(w),
		// Deployment unknown yet: Renew names it.
		Charge:      Charge{Model: model, Usage: Usage{PromptTokens: estimate.PromptTokens, CompletionTokens: estimate.CompletionTokens}},
		Remember:    m.cfg.RememberSettled,
		WaiterLease: lease,
	})
	if err != nil {
		if errors.Is(err, ErrSettledID) {
			return Reservation{}, false, fmt.Errorf("reserve %q for tenant %q: %w", id, b.Tenant, err)
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return Reservation{}, false, errors.Join(fmt.Errorf("%w: reserve for tenant %q: %w", ErrStoreUnavailable, b.Tenant, err), ctxErr)
		}
		m.storeErrors.Add(1)
		if m.cfg.FailOpen {
			m.failedOpen.Add(1)
			m.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "budget: store unavailable, admitting unchecked (fail-open)",
				slog.String("tenant", b.Tenant), slog.String("window", w.ID), slog.String("error", err.Error()))
			res.Unchecked = true
			res.Left = Amount{Tokens: Unlimited, MicroUSD: Unlimited}
			return res, false, nil
		}
		m.cfg.Logger.LogAttrs(ctx, slog.LevelError, "budget: store unavailable, denying (fail-closed)",
			slog.String("tenant", b.Tenant), slog.String("window", w.ID), slog.String("error", err.Error()))
		return Reservation{}, false, fmt.Errorf("%w: reserve for tenant %q: %w", ErrStoreUnavailable, b.Tenant, err)
	}
	m.learned.set(b.Tenant, model, r.Learned)
	left := leftOf(b.Cap(), r.Spent, r.Reserved)
	if !r.Admitted {
		e := &ExhaustedError{Tenant: b.Tenant, Window: w, Need: hold, Left: left, Reserved: r.Reserved, Spent: r.Spent}
		e.Tokens = b.Tokens > 0 && !fits(b.Tokens, r.Spent.Tokens+r.Reserved.Tokens, hold.Tokens)
		e.Money = b.MicroUSD > 0 && !fits(b.MicroUSD, r.Spent.MicroUSD+r.Reserved.MicroUSD, hold.MicroUSD)
		if !e.Tokens && !e.Money {
			// It fits, but others were waiting for it first.
			e.Tokens, e.Money = b.Tokens > 0, b.Tokens == 0
		}
		return Reservation{}, r.Queued, e
	}
	m.admitted.Add(1)
	res.Spent, res.Reserved, res.Left = r.Spent, r.Reserved, left
	return res, false, nil
}

// fits is the admission rule of one capped dimension.
func fits(limit, used, need int64) bool { return used+need <= limit && used < limit }

// leftOf is cap - spent - reserved per capped dimension, at least 0.
func leftOf(limit, spent, reserved Amount) Amount {
	f := func(c, s, r int64) int64 {
		if c == 0 {
			return Unlimited
		}
		return max(c-s-r, 0)
	}
	return Amount{Tokens: f(limit.Tokens, spent.Tokens, reserved.Tokens), MicroUSD: f(limit.MicroUSD, spent.MicroUSD, reserved.MicroUSD)}
}

// keep is when a store may forget window w.
func (m *Manager) keep(w Window) time.Time { return w.End.Add(m.cfg.Retention) }

// Settled is the result of Settle.
type Settled struct {
	// Record is what was charged, with Tenant, Model, MicroUSD and Time
	// filled in.
	Record Record
	// Duplicate is true when the reservation had already been settled:
	// nothing was charged this time.
	Duplicate bool
	// Spent is the period's spend after the call.
	Spent Amount
}

// Settle ends res and charges what the request really used: rec.Usage, and
// its cost rec.MicroUSD (computed from the price table for rec.Model when
// zero). The actual usage may be more or less than the estimate. Settle is
// idempotent per reservation ID: a repeat within Config.RememberSettled is a
// no-op that returns Duplicate. A reservation that was released or was
// admitted Unchecked is still charged; one that expired (and was charged
// its hold) has that charge replaced by rec, once. The record is aggregated
// into the period's usage rows (see Usage).
//
// Settle is the only record of money already spent: on error (wrapping
// ErrStoreUnavailable) retry it; the retry cannot charge twice.
func (m *Manager) Settle(ctx context.Context, res Reservation, rec Record) (Settled, error) {
	if err := validName("reservation ID", res.ID); err != nil {
		return Settled{}, err
	}
	if err := validName("Tenant", res.Tenant); err != nil {
		return Settled{}, err
	}
	if _, err := ParseWindowID(res.Window.ID); err != nil {
		return Settled{}, fmt.Errorf("settle %q: reservation window: %w", res.ID, err)
	}
	if rec.Tenant != "" && rec.Tenant != res.Tenant {
		return Settled{}, fmt.Errorf("%w: settle %q: record tenant %q differs from the reservation's %q", ErrInvalid, res.ID, rec.Tenant, res.Tenant)
	}
	rec.Tenant = res.Tenant
	if rec.Model == "" {
		rec.Model = res.Model
	}
	if err := validName("model", rec.Model); err != nil {
		return Settled{}, err
	}
	if rec.Deployment != "" {
		if err := validName("deployment", rec.Deployment); err != nil {
			return Settled{}, err
		}
	}
	// Providers report cached tokens as part of the prompt; never let a
	// quirk in that report lose the charge.
	rec.Usage.CachedTokens = min(rec.Usage.CachedTokens, max(rec.Usage.PromptTokens, 0))
	if err := rec.Usage.Validate(); err != nil {
		return Settled{}, fmt.Errorf("settle %q: %w", res.ID, err)
	}
	if rec.Requests < 0 || rec.Requests > MaxAmount {
		return Settled{}, fmt.Errorf("%w: settle %q: %d requests is out of range", ErrInvalid, res.ID, rec.Requests)
	}
	if rec.Requests == 0 {
		rec.Requests = 1
	}
	if rec.LearnCompletion < 0 || rec.LearnCompletion > MaxAmount/2 {
		return Settled{}, fmt.Errorf("%w: settle %q: LearnCompletion %d is out of range", ErrInvalid, res.ID, rec.LearnCompletion)
	}
	if rec.MicroUSD < 0 || rec.MicroUSD > MaxAmount {
		return Settled{}, fmt.Errorf("%w: settle %q: cost %d micro-dollars is out of range", ErrInvalid, res.ID, rec.MicroUSD)
	}
	if rec.MicroUSD == 0 {
		// Saturate absurd costs rather than overflow the store's sums.
		rec.MicroUSD = min(m.price(ctx, rec.Model, res.Model, rec.Usage), MaxAmount)
	}
	if rec.Time.IsZero() {
		rec.Time = m.cfg.Clock.Now()
	}
	var learn Sample
	if rec.LearnCompletion > 0 && validName("model", res.Model) == nil {
		learn = Sample{Model: res.Model, Completion: rec.LearnCompletion}
	}
	r, err := m.b.Settle(ctx, SettleRequest{
		Key:      Key{Tenant: res.Tenant, WindowID: res.Window.ID},
		ID:       res.ID,
		Record:   rec,
		Remember: m.cfg.RememberSettled,
		Keep:     m.keep(res.Window),
		Learn:    learn,
	})
	if err != nil {
		if ctx.Err() == nil {
			m.storeErrors.Add(1)
		}
		m.cfg.Logger.LogAttrs(ctx, slog.LevelError, "budget: settle failed; retry it, or this spend is not counted",
			slog.String("tenant", res.Tenant), slog.String("window", res.Window.ID), slog.String("reservation", res.ID),
			slog.String("model", rec.Model), slog.Int64("tokens", rec.Usage.Tokens()), slog.Int64("micro_usd", rec.MicroUSD),
			slog.String("error", err.Error()))
		return Settled{}, errors.Join(fmt.Errorf("%w: settle %q for tenant %q: %w", ErrStoreUnavailable, res.ID, res.Tenant, err), ctx.Err())
	}
	if r.Applied {
		m.settled.Add(1)
	}
	return Settled{Record: rec, Duplicate: !r.Applied, Spent: r.Spent}, nil
}

// price computes a record's cost: at model's price, else at the reserved
// model's price, else 0 (counted and logged once per model).
func (m *Manager) price(ctx context.Context, model, reserved string, u Usage) int64 {
	if c, ok := m.cfg.Prices.Cost(model, u); ok {
		return c
	}
	if c, ok := m.cfg.Prices.Cost(reserved, u); ok {
		return c
	}
	m.unpriced.Add(1)
	m.warnedMu.Lock()
	_, seen := m.warned[model]
	if !seen && len(m.warned) < 1000 {
		m.warned[model] = struct{}{}
	}
	m.warnedMu.Unlock()
	if !seen {
		m.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "budget: model has no price; its usage costs 0 (add it to the price table)",
			slog.String("model", model))
	}
	return 0
}

// Release ends res without charging anything: the request failed before the
// provider charged for it. Releasing a reservation that expired takes back
// the charge its expiry made (while it is remembered). Releasing one that
// was already settled or released does nothing.
func (m *Manager) Release(ctx context.Context, res Reservation) error {
	if err := validName("reservation ID", res.ID); err != nil {
		return err
	}
	if err := validName("Tenant", res.Tenant); err != nil {
		return err
	}
	if _, err := ParseWindowID(res.Window.ID); err != nil {
		return fmt.Errorf("release %q: reservation window: %w", res.ID, err)
	}
	if _, err := m.b.Release(ctx, Key{Tenant: res.Tenant, WindowID: res.Window.ID}, res.ID); err != nil {
		if ctx.Err() == nil {
			m.storeErrors.Add(1)
		}
		m.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "budget: release failed; the hold expires after its TTL",
			slog.String("tenant", res.Tenant), slog.String("window", res.Window.ID), slog.String("reservation", res.ID),
			slog.String("error", err.Error()))
		return errors.Join(fmt.Errorf("%w: release %q for tenant %q: %w", ErrStoreUnavailable, res.ID, res.Tenant, err), ctx.Err())
	}
	return nil
}

// Progress is what a running request has used so far, for Renew.
type Progress struct {
	// Usage is the prompt and the completion tokens produced up to now.
	Usage Usage
	// Model and Deployment serve the request, when known: they price the
	// usage and name the usage row an expiry charge is counted in. Empty:
	// the reservation's model, no deployment (or the last one reported).
	Model, Deployment string
}

// Renew keeps res alive for another Config.TTL while its request runs and
// raises its hold to what the request has used so far, so that if the
// caller dies the expiry charges at least that (see the package doc): the
// hold becomes max(estimate, p.Usage) in prompt and completion tokens, and
// the larger of the two costs. It never shrinks a hold, and it may take
// the reservation's period over its cap: those tokens were already used.
// Renew reports false when the hold is gone (settled, released, or
// expired and charged), and does nothing for an Unchecked reservation.
// Call it well within the TTL, e.g. every TTL/2.
func (m *Manager) Renew(ctx context.Context, res Reservation, p Progress) (bool, error) {
	if err := validName("reservation ID", res.ID); err != nil {
		return false, err
	}
	if err := validName("Tenant", res.Tenant); err != nil {
		return false, err
	}
	if _, err := ParseWindowID(res.Window.ID); err != nil {
		return false, fmt.Errorf("renew %q: reservation window: %w", res.ID, err)
	}
	for _, f := range []struct{ name, v string }{{"model", p.Model}, {"deployment", p.Deployment}} {
		if f.v != "" {
			if err := validName(f.name, f.v); err != nil {
				return false, err
			}
		}
	}
	if err := p.Usage.Validate(); err != nil {
		return false, fmt.Errorf("renew %q: %w", res.ID, err)
	}
	if res.Unchecked {
		return false, nil
	}
	u := Usage{
		PromptTokens:     max(res.Estimate.PromptTokens, p.Usage.PromptTokens),
		CompletionTokens: max(res.Estimate.CompletionTokens, p.Usage.CompletionTokens),
	}
	model := p.Model
	if model == "" {
		model = res.Model
	}
	cost, ok := m.cfg.Prices.Cost(model, u)
	if !ok {
		cost, _ = m.cfg.Prices.Cost(res.Model, u)
	}
	hold := Amount{Tokens: u.Tokens(), MicroUSD: min(max(cost, res.Hold.MicroUSD), MaxAmount)}
	charge := Charge{Usage: u} // no model: the row stays
	if p.Model != "" || p.Deployment != "" {
		charge.Model, charge.Deployment = model, p.Deployment
	}
	found, err := m.b.Renew(ctx, RenewRequest{
		Key:    Key{Tenant: res.Tenant, WindowID: res.Window.ID},
		ID:     res.ID,
		TTL:    m.cfg.TTL,
		Hold:   hold,
		Charge: charge,
		Keep:   m.keep(res.Window),
	})
	if err != nil {
		if ctx.Err() == nil {
			m.storeErrors.Add(1)
		}
		return false, errors.Join(fmt.Errorf("%w: renew %q for tenant %q: %w", ErrStoreUnavailable, res.ID, res.Tenant, err), ctx.Err())
	}
	return found, nil
}

// Spend returns b's state in the period that contains at.
func (m *Manager) Spend(ctx context.Context, b Budget, at time.Time) (Status, error) {
	if err := b.Validate(); err != nil {
		return Status{}, err
	}
	w, err := b.Window(at)
	if err != nil {
		return Status{}, err
	}
	t, err := m.b.Totals(ctx, Key{Tenant: b.Tenant, WindowID: w.ID})
	if err != nil {
		if ctx.Err() == nil {
			m.storeErrors.Add(1)
		}
		return Status{}, errors.Join(fmt.Errorf("%w: spend of tenant %q: %w", ErrStoreUnavailable, b.Tenant, err), ctx.Err())
	}
	return Status{Window: w, Spent: t.Spent, Reserved: t.Reserved, Holds: t.Holds, Left: leftOf(b.Cap(), t.Spent, t.Reserved)}, nil
}

// Usage returns the usage rows of tenant in the window windowID ("2026-11"
// or "2026-11-29", see Window.ID), one per model and deployment, sorted by
// model then deployment.
func (m *Manager) Usage(ctx context.Context, tenant, windowID string) ([]UsageRow, error) {
	if err := validName("Tenant", tenant); err != nil {
		return nil, err
	}
	if _, err := ParseWindowID(windowID); err != nil {
		return nil, err
	}
	rows, err := m.b.Usage(ctx, Key{Tenant: tenant, WindowID: windowID})
	if err != nil {
		if ctx.Err() == nil {
			m.storeErrors.Add(1)
		}
		return nil, errors.Join(fmt.Errorf("%w: usage of tenant %q: %w", ErrStoreUnavailable, tenant, err), ctx.Err())
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Model != rows[j].Model {
			return rows[i].Model < rows[j].Model
		}
		return rows[i].Deployment < rows[j].Deployment
	})
	return rows, nil
}

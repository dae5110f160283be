// Package budget caps spend per tenant and period, in tokens and money, with reserve-then-settle so concurrent requests never overshoot.
//
// A request first reserves an estimate of what it may use (Manager.Reserve).
// The reservation is admitted, atomically in the store, only if the period's
// spend plus everything reserved plus this estimate stays within every cap
// of the budget. After the call the request settles what it really used
// (Manager.Settle), which frees the reservation and charges the actual usage
// and its cost, or releases the reservation if nothing was charged
// (Manager.Release).
//
// # Expiry: spend is never lost, only over-counted within a bound
//
// A reservation that is never settled or released (its caller crashed)
// expires after its TTL and is then charged, not released: the store moves
// its hold from reserved to spent and counts it in the usage rows (as an
// Expired request), so the provider's bill for a request cut by a crash is
// on the budget. A running request keeps its reservation alive with
// Manager.Renew, which also reports what it has used so far (a stream's
// prompt and the tokens streamed up to now); renewed holds can therefore
// have a short TTL, and a crashed caller's spend is charged soon after.
//
// The charge of an expired hold is max(estimate, usage last reported to
// Renew), per prompt and completion tokens, and its cost (the larger of the
// estimate's and the reported usage's). The estimate alone would
// under-charge a request that outran it; the usage so far alone would miss
// the tokens produced after the last report. With upper-bound estimates
// (prompt plus max_tokens) the charge is therefore at least what the
// provider served, and it over-counts by at most estimate minus served per
// expired hold: spend after the expiries is at most spend plus reserved at
// the crash, so a cap is never overshot by expiry, only by the usage
// reported beyond estimates (which the budget cannot take back). With an
// estimate that is not an upper bound, the tokens served above it after the
// last Renew (at most one renewal interval's worth) are not charged.
//
// A Settle after expiry (a request that outlived its TTL without renewal,
// say during a store outage) replaces the expiry charge with the actual
// usage, atomically and once; a Release after expiry takes the expiry
// charge back (the caller knows nothing was billed). Both work while the ID
// is remembered (Config.RememberSettled after the expiry); later, a Settle
// is charged on top (over-counted, never lost).
//
// Money is counted in integer micro-dollars (1 USD = 1,000,000) computed
// from a PriceTable; no floating point accumulates.
//
// The store side is a Backend: budget/memory for one process (persisted to a
// local file) and budget/redis for many replicas. Both pass the conformance
// suite in budget/budgettest.
package budget

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Errors returned by this package and its backends.
var (
	// ErrExhausted means a reservation was denied because it does not fit in
	// what is left of the budget's period. The error is an *ExhaustedError.
	ErrExhausted = errors.New("budget: exhausted")
	// ErrStoreUnavailable wraps errors from the store. Reserve returns it
	// (fail-closed, the default) when the store cannot be reached, and the
	// caller should deny the request.
	ErrStoreUnavailable = errors.New("budget: store unavailable")
	// ErrInvalid is wrapped by errors about a bad budget, usage, price or
	// identifier.
	ErrInvalid = errors.New("budget: invalid")
	// ErrUnknownPrice means a budget with a money cap was asked to admit a
	// model that has no price in the table, so its cost cannot be bounded.
	ErrUnknownPrice = errors.New("budget: no price for model")
	// ErrSettledID means Reserve was called with the ID of a reservation
	// that was already settled; reservation IDs must be unique.
	ErrSettledID = errors.New("budget: reservation ID already settled")
)

// Limits on identifiers and amounts.
const (
	// MaxAmount is the largest cap, and the largest estimate, accepted (2^53-1:
	// Redis scripts compute in double precision, exact up to this value).
	// It is 9e15 tokens, or 9 billion dollars in micro-dollars.
	MaxAmount = 1<<53 - 1
	// MaxNameLen bounds tenant, model, deployment and reservation ID lengths
	// in bytes.
	MaxNameLen = 256
	// Unlimited is reported as what is left of a dimension without a cap.
	Unlimited = -1
)

// Amount is a quantity of budget.
type Amount struct {
	// Tokens counts prompt plus completion tokens.
	Tokens int64 `json:"tokens"`
	// MicroUSD is money in micro-dollars (1 USD = 1,000,000).
	MicroUSD int64 `json:"micro_usd"`
}

// Add returns a + o.
func (a Amount) Add(o Amount) Amount {
	return Amount{Tokens: a.Tokens + o.Tokens, MicroUSD: a.MicroUSD + o.MicroUSD}
}

// Usage is what one request consumed, or is estimated to consume, as
// providers report it.
type Usage struct {
	// PromptTokens counts every input token, cached ones included.
	PromptTokens int64 `json:"prompt_tokens"`
	// CompletionTokens counts output tokens, reasoning tokens included.
	CompletionTokens int64 `json:"completion_tokens"`
	// CachedTokens is the part of PromptTokens served from the provider's
	// prompt cache (OpenAI's usage.prompt_tokens_details.cached_tokens).
	CachedTokens int64 `json:"cached_tokens"`
}

// Tokens returns prompt plus completion tokens: what a token cap counts.
func (u Usage) Tokens() int64 { return u.PromptTokens + u.CompletionTokens }

// Validate reports negative or impossibly large counts, and cached tokens
// that are not part of the prompt.
func (u Usage) Validate() error {
	switch {
	case u.PromptTokens < 0 || u.CompletionTokens < 0 || u.CachedTokens < 0:
		return fmt.Errorf("%w: usage %+v has a negative count", ErrInvalid, u)
	case u.PromptTokens > MaxAmount/2 || u.CompletionTokens > MaxAmount/2:
		return fmt.Errorf("%w: usage %+v exceeds %d tokens", ErrInvalid, u, int64(MaxAmount/2))
	case u.CachedTokens > u.PromptTokens:
		return fmt.Errorf("%w: usage %+v: cached tokens are part of the prompt tokens and cannot exceed them", ErrInvalid, u)
	}
	return nil
}

// Budget is a spending cap for one tenant over calendar periods.
//
// A budget with neither cap only accounts: every reservation is admitted and
// usage is still recorded. A tenant should have one budget per Period: two
// budgets for the same tenant and period share their spend.
type Budget struct {
	// Tenant names whose spend this is. Required; at most MaxNameLen bytes
	// of printable UTF-8.
	Tenant string
	// Period is Day or Month. Required.
	Period Period
	// Location is the time zone periods are aligned to: a month starts at
	// local midnight on the 1st. Default UTC.
	Location *time.Location
	// Tokens caps prompt plus completion tokens per period; 0 means no
	// token cap.
	Tokens int64
	// MicroUSD caps cost per period in micro-dollars (1 USD = 1,000,000);
	// 0 means no money cap.
	MicroUSD int64
}

// Cap returns the budget's caps as an Amount (0 = no cap).
func (b Budget) Cap() Amount { return Amount{Tokens: b.Tokens, MicroUSD: b.MicroUSD} }

// Validate reports what is wrong with b, in terms a user can act on.
func (b Budget) Validate() error {
	if err := validName("Tenant", b.Tenant); err != nil {
		return fmt.Errorf("budget for tenant %q: %w", truncate(b.Tenant, 40), err)
	}
	if err := b.Period.Validate(); err != nil {
		return fmt.Errorf("budget for tenant %q: %w", b.Tenant, err)
	}
	for _, c := range []struct {
		name string
		v    int64
	}{{"Tokens", b.Tokens}, {"MicroUSD", b.MicroUSD}} {
		if c.v < 0 {
			return fmt.Errorf("%w: budget for tenant %q: %s is %d; use 0 for no cap", ErrInvalid, b.Tenant, c.name, c.v)
		}
		if c.v > MaxAmount {
			return fmt.Errorf("%w: budget for tenant %q: %s is %d, above the maximum %d", ErrInvalid, b.Tenant, c.name, c.v, int64(MaxAmount))
		}
	}
	return nil
}

// Window returns the budget's period window that contains t.
func (b Budget) Window(t time.Time) (Window, error) { return b.Period.Window(t, b.Location) }

// validName checks a tenant, model, deployment or ID.
func validName(field, s string) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalid, field)
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("%w: %s is %d bytes long; at most %d are allowed", ErrInvalid, field, len(s), MaxNameLen)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s %q is not valid UTF-8", ErrInvalid, field, truncate(s, 40))
	}
	if strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) {
		return fmt.Errorf("%w: %s %q contains control characters", ErrInvalid, field, truncate(s, 40))
	}
	return nil
}

// NewID returns a random 128-bit reservation ID in hex.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it crashes the program instead)
	return hex.EncodeToString(b[:])
}

// Reservation is an admitted hold on a budget. Keep it until the request
// ends, then pass it to Settle or Release. It is a plain value: any replica
// sharing the store can settle it.
type Reservation struct {
	// ID identifies the reservation; Settle is idempotent per ID.
	ID string
	// Tenant is the budget's tenant.
	Tenant string
	// Window is the period the reservation was admitted in. The request is
	// charged to this period even if it settles after the period ended.
	Window Window
	// Model is the model the estimate was priced for.
	Model string
	// Estimate is the usage reserved for.
	Estimate Usage
	// Hold is what the reservation holds: Estimate's tokens and cost.
	Hold Amount
	// Spent and Reserved are the period's totals right after admission;
	// Reserved includes Hold.
	Spent, Reserved Amount
	// Left is what remained under each cap after admission (Unlimited
	// where there is no cap).
	Left Amount
	// Unchecked is true when the store could not be reached and the
	// Manager admitted the request anyway because Config.FailOpen is set.
	Unchecked bool
}

// Record is the usage of one settled request, or of several (Requests).
type Record struct {
	// Tenant is the reservation's tenant; Settle fills it in.
	Tenant string
	// Model is the model that served the request. Default: the model of
	// the reservation (set it when a fallback served another model).
	Model string
	// Deployment names the provider deployment (key + endpoint) that served
	// the request; may be empty.
	Deployment string
	// Usage is what the provider reported (summed, for several requests).
	Usage Usage
	// Requests is how many requests the record stands for, so that callers
	// can record a batch of requests' usage at once. Zero means 1.
	Requests int64
	// MicroUSD is the cost. Zero means: compute it from the price table.
	MicroUSD int64
	// Time is when the request was settled; Settle fills it in if zero.
	Time time.Time
	// LearnCompletion, when positive, is the completion tokens of one
	// answer of a request that set no bound on them (no max_tokens): the
	// store learns the completion estimate of the reservation's model
	// from it (see Manager.Learned). Leave it 0 for a bounded request: its
	// length says nothing of how long answers are.
	LearnCompletion int64
}

// UsageRow aggregates the settled records of one tenant and period per
// model and deployment.
type UsageRow struct {
	Model      string `json:"model"`
	Deployment string `json:"deployment"`
	// Requests counts settled requests.
	Requests         int64 `json:"requests"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	CachedTokens     int64 `json:"cached_tokens"`
	// MicroUSD is the summed cost in micro-dollars.
	MicroUSD int64 `json:"micro_usd"`
	// Expired counts those of Requests whose reservation expired
	// unsettled (their caller crashed): each is charged its hold, the
	// estimate or the usage reported so far, whichever is more.
	Expired int64 `json:"expired"`
}

// Status is a budget's state in one window.
type Status struct {
	Window Window
	// Spent is what settled requests used.
	Spent Amount
	// Reserved is what live reservations hold.
	Reserved Amount
	// Holds counts live reservations.
	Holds int
	// Left is each cap minus Spent and Reserved, at least 0; Unlimited
	// where there is no cap.
	Left Amount
}

// ExhaustedError is the error of a denied reservation. It wraps
// ErrExhausted.
type ExhaustedError struct {
	Tenant string
	// Window is the period that is used up; spend resets at Window.End.
	Window Window
	// Need is what the request asked to reserve.
	Need Amount
	// Left is what was left under each cap (Unlimited where no cap).
	Left Amount
	// Reserved is what other requests in flight held: it frees up as they
	// settle, so a request may fit again before the period ends.
	Reserved Amount
	// Spent is what the period had spent.
	Spent Amount
	// Tokens and Money report which caps denied the request.
	Tokens, Money bool
}

func (e *ExhaustedError) Error() string {
	var caps []string
	if e.Tokens {
		caps = append(caps, fmt.Sprintf("tokens: need %d, %d left", e.Need.Tokens, e.Left.Tokens))
	}
	if e.Money {
		caps = append(caps, fmt.Sprintf("money: need %s, %s left", FormatUSD(e.Need.MicroUSD), FormatUSD(e.Left.MicroUSD)))
	}
	return fmt.Sprintf("budget: exhausted: tenant %q %s %s: %s; resets at %s",
		e.Tenant, e.Window.Period, e.Window.ID, strings.Join(caps, ", "), e.Window.End.Format(time.RFC3339))
}

// Unwrap returns ErrExhausted.
func (e *ExhaustedError) Unwrap() error { return ErrExhausted }

// ResetAt is when the period ends and spend starts again from zero.
func (e *ExhaustedError) ResetAt() time.Time { return e.Window.End }

// FormatUSD renders micro-dollars as dollars with six decimals: "$1.234567".
func FormatUSD(micro int64) string {
	sign := ""
	u := uint64(micro)
	if micro < 0 {
		sign, u = "-", uint64(-(micro+1))+1
	}
	return fmt.Sprintf("%s$%d.%06d", sign, u/1_000_000, u%1_000_000)
}

// Key names one budget window in a store.
type Key struct {
	Tenant string
	// WindowID is Window.ID: "2026-11" or "2026-11-29".
	WindowID string
}

// ReserveRequest asks a Backend to admit a hold.
type ReserveRequest struct {
	Key Key
	ID  string
	// Hold is the amount to reserve.
	Hold Amount
	// Cap is the budget's caps; 0 in a dimension means no cap.
	Cap Amount
	// TTL is how long the hold lives unless settled, released or renewed;
	// then it expires and is charged.
	TTL time.Duration
	// Keep is when the store may forget this window's state (its end plus
	// the retention).
	Keep time.Time
	// Charge is what the hold is charged if it expires: the usage row it is
	// counted in and its usage (Hold being the amount).
	Charge Charge
	// Remember is how long an expired hold's ID is remembered, so that a
	// late Settle replaces its charge (and a late Release takes it back)
	// instead of charging on top.
	Remember time.Duration
	// WaiterLease, when positive, makes the request wait its turn in the
	// window's line (see Backend): it goes first to no one who queued
	// before it, and when it does not fit but may later it takes a place,
	// which lives WaiterLease unless a Reserve of the same ID renews it.
	// Zero: one attempt that neither queues nor looks at the line.
	WaiterLease time.Duration
}

// Charge is what an expired hold is counted as in the usage rows.
type Charge struct {
	// Model and Deployment name the row; Deployment may be empty.
	Model, Deployment string
	// Usage is counted in the row's token columns.
	Usage Usage
}

// RenewRequest asks a Backend to extend a live hold and raise it to what
// its request has used so far.
type RenewRequest struct {
	Key Key
	ID  string
	// TTL is how long from now the hold lives unless settled, released or
	// renewed again.
	TTL time.Duration
	// Hold raises the hold: each dimension becomes the larger of the two.
	// Holds never shrink, so renewals may arrive in any order.
	Hold Amount
	// Charge raises the hold's charge the same way (each usage count the
	// larger); a non-empty Model or Deployment replaces the row's.
	Charge Charge
	// Keep is as in ReserveRequest.
	Keep time.Time
}

// ReserveResult is a Backend's answer to a ReserveRequest.
type ReserveResult struct {
	// Admitted reports whether the hold was taken (or already existed
	// under this ID: a retried Reserve does not reserve twice).
	Admitted bool
	// Queued reports that the request, not admitted, has a place in the
	// window's line (only with ReserveRequest.WaiterLease).
	Queued bool
	// Spent and Reserved are the window's totals after the call.
	Spent, Reserved Amount
	// Learned is the completion estimate the store learned for the
	// request's model (Charge.Model) in this window (see LearnedEstimate);
	// 0 while it knows too few answers.
	Learned int64
}

// SettleRequest asks a Backend to end a hold and charge a record.
type SettleRequest struct {
	Key Key
	ID  string
	// Record is charged: Usage.Tokens() tokens and MicroUSD micro-dollars,
	// aggregated into the row of (Model, Deployment).
	Record Record
	// Remember is how long the ID is remembered as settled, so that a
	// repeated Settle within it is a no-op.
	Remember time.Duration
	// Keep is as in ReserveRequest.
	Keep time.Time
	// Learn, when its Completion is positive, is an answer's size the
	// store adds to what it learns estimates from (see LearnedEstimate).
	Learn Sample
}

// Sample is the completion tokens of one answer to a request that set no
// bound on them, for the learned estimates of Model (the model requests
// reserve with).
type Sample struct {
	Model      string
	Completion int64
}

// SettleResult is a Backend's answer to a SettleRequest.
type SettleResult struct {
	// Applied is false when the ID had already been settled: nothing changed.
	Applied bool
	// Spent is the window's spend after the call.
	Spent Amount
}

// Totals is a window's state in a store.
type Totals struct {
	Spent, Reserved Amount
	Holds           int
}

// Backend is the store side of budgets. Implementations are safe for
// concurrent use, sweep expired holds as part of every call, and make each
// call atomic. Requests have been validated by the Manager.
//
// Sweeping charges an expired hold: its amount moves from reserved to
// spent and its Charge is added to the usage rows (one request, counted
// Expired), and its ID is remembered as settled, with the charge, for the
// hold's Remember.
//
// Each window has a waiting line, first come first served, for requests
// that do not fit now but may once holds in flight settle below their
// amounts. A place lives for its waiter's lease unless renewed; a waiter
// whose lease passed (it died, or gave up without leaving) is dropped from
// the line by the next call that looks at it. The first live waiter is
// woken (Await) whenever a hold of the window ends (settled or released)
// and when the waiter ahead of it leaves the line or is admitted.
//
// The store also learns, per window and model, a completion estimate from
// the Sample of each settle (see LearnedEstimate), and reports it with
// every Reserve.
type Backend interface {
	// Reserve takes the hold if, in every dimension with a cap, spent +
	// reserved + hold ≤ cap and spent + reserved < cap. A hold that already
	// exists under the ID is reported as admitted and not taken again. It
	// returns ErrSettledID if the ID was settled within its Remember window.
	// A denial changes nothing but the line.
	//
	// With a WaiterLease, a request that has live waiters ahead of it in
	// the line is not admitted: it takes (or renews) its place behind
	// them, unless it could never fit (spent + hold above a cap), when it
	// is denied and leaves the line. A request first in line (or facing an
	// empty line) is admitted if it fits, and then leaves the line, waking
	// the next waiter; if it does not fit, it takes or keeps its place
	// when it may fit later (in every capped dimension that denies it,
	// something is reserved and spent + hold ≤ cap), and is otherwise
	// denied and leaves the line.
	Reserve(ctx context.Context, req ReserveRequest) (ReserveResult, error)
	// Await blocks until the waiter id of key's line is woken, timeout
	// passes or ctx ends, and reports whether it was woken. The waiter then
	// calls Reserve again (which also renews its place).
	Await(ctx context.Context, key Key, id string, timeout time.Duration) (bool, error)
	// Leave takes id out of key's line, waking the next waiter if id was
	// first. Leaving a line one is not in does nothing.
	Leave(ctx context.Context, key Key, id string) error
	// Settle ends the hold of the ID (if it still exists) and charges the
	// record, once per ID: a repeated Settle is a no-op with Applied false.
	// A record whose hold was released, or expired and was forgotten, is
	// still charged. A Settle of an expired hold whose charge is remembered
	// replaces that charge (spend and usage row) with the record's, and is
	// Applied. It learns from req.Learn and wakes the first waiter of the
	// line. When it returns nil, the charge is durable as far as the
	// store promises.
	Settle(ctx context.Context, req SettleRequest) (SettleResult, error)
	// Release ends the hold of the ID without charging anything, or takes
	// back the remembered charge of its expired hold (and forgets the ID,
	// so that a later Settle is charged), waking the first waiter of the
	// line; it reports whether a hold or a charge was found.
	Release(ctx context.Context, key Key, id string) (bool, error)
	// Renew extends the live hold of the ID and raises it (see
	// RenewRequest); it reports false, changing nothing, when there is no
	// live hold: it was settled, released or has expired (and is charged).
	Renew(ctx context.Context, req RenewRequest) (bool, error)
	// Totals returns the window's spend and live holds.
	Totals(ctx context.Context, key Key) (Totals, error)
	// Usage returns the window's usage rows in any order, after the sweep:
	// expired holds are counted in them.
	Usage(ctx context.Context, key Key) ([]UsageRow, error)
}

package gateway

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/ratelimit"
)

// deployment is a Deployment with what the gateway learns about it.
type deployment struct {
	*Deployment
	scope string // rate-limit scope
	// inScope and outScope are the scopes of the input and output tokens
	// limits (ITPM, OTPM).
	inScope, outScope string
	// nameHeader is the X-Llmgate-Deployment value, made once: header
	// values are only read once set (by servers, transports and us).
	nameHeader []string
	// headroom is the smaller of the remaining requests and tokens
	// fractions last seen for this deployment, in millionths (1e6 = all
	// left); used to send a request to the least-loaded key.
	headroom atomic.Int64
	// observing is set while a provider's remaining count is being shared.
	observing atomic.Bool
	// learned are the per-minute limits the provider reports for this key
	// and model (x-ratelimit-limit-*, or a 429's message), by kind
	// (learnedRequests, learnedTokens). This replica's admissions use the
	// lower of them and the configured limits; the ones below the
	// configuration are also shared with every replica through the limiter
	// (ratelimit.Limiter.Learn), which holds them for learnTTL.
	learned [learnedKinds]learnedLimit
	// sharing is set while learned limits are being shared outside a 429.
	sharing atomic.Bool
	// slowStart is how many requests may be in flight on the deployment,
	// across replicas, until its provider first answers this replica (see
	// Options.Admission.SlowStart); 0 after that, or when slow start is
	// off. slowStartOver is closed when it ends.
	slowStart     atomic.Int64
	slowStartOver chan struct{}
	endSlowOnce   sync.Once
}

// Indexes of deployment.learned.
const (
	learnedRequests = iota
	learnedTokens
	// learnedInput and learnedOutput are Anthropic's input and output
	// tokens per minute (anthropic-ratelimit-{input,output}-tokens-*),
	// on the deployment's inScope and outScope.
	learnedInput
	learnedOutput
	learnedKinds
)

// learnTTL is how long a limit the provider reported holds, here and in the
// shared limiter, unless reported again; within it, replicas renew what
// they share every half.
const learnTTL = ratelimit.DefaultLearnTTL

// learnedLimit is one limit the provider reported.
type learnedLimit struct {
	limit atomic.Int64 // 0 until reported
	until atomic.Int64 // unix ns: the report holds until then
	// shared is the limit this replica last shared with the others, at
	// sharedAt (unix ns; 0: share again at the next report).
	shared, sharedAt atomic.Int64
}

// get returns the limit in force at now; 0 if none.
func (l *learnedLimit) get(now time.Time) int64 {
	v := l.limit.Load()
	if v > 0 && now.UnixNano() >= l.until.Load() {
		return 0
	}
	return v
}

// reportedLimit is a per-minute limit a provider response reported, with
// what it says is left (-1 when it does not say); limit <= 0: none.
type reportedLimit struct {
	limit, remaining int64
}

// providerLimits returns the per-minute requests and tokens limits a
// response reported: the x-ratelimit-* headers, or else what a 429's
// message said about the limit it hit (a per-day one is not a per-minute
// one: it is left out).
func providerLimits(f provider.Feedback) [learnedKinds]reportedLimit {
	out := [learnedKinds]reportedLimit{{f.LimitRequests, f.RemainingRequests}, {f.LimitTokens, f.RemainingTokens},
		{f.LimitInputTokens, f.RemainingInputTokens}, {f.LimitOutputTokens, f.RemainingOutputTokens}}
	r := f.Reported
	if r.Limit <= 0 || r.Window != time.Minute {
		return out
	}
	k := learnedRequests
	switch r.Kind {
	case "requests":
	case "tokens":
		k = learnedTokens
	default:
		return out
	}
	if out[k].limit <= 0 {
		out[k] = reportedLimit{limit: r.Limit, remaining: -1}
		if r.Used >= 0 {
			out[k].remaining = max(r.Limit-r.Used, 0)
		}
	}
	return out
}

func newDeployment(d *Deployment, slowStart int64) *deployment {
	dep := &deployment{Deployment: d, scope: "dep:" + d.Name, nameHeader: []string{d.Name}, slowStartOver: make(chan struct{})}
	dep.inScope, dep.outScope = dep.scope+inputSuffix, dep.scope+outputSuffix
	dep.headroom.Store(1e6)
	if slowStart > 0 {
		dep.slowStart.Store(slowStart)
	} else {
		dep.endSlowStart()
	}
	return dep
}

// slowStartScope is the scope of the deployment's slow-start window: one
// concurrency limit shared by every replica.
func (d *deployment) slowStartScope() string { return d.scope + slowStartSuffix }

// Suffixes of a deployment's scope naming its other limits' scopes.
const (
	inputSuffix     = "#input"
	outputSuffix    = "#output"
	slowStartSuffix = "#slow-start"
)

// endSlowStart ends the slow start: the provider answered, with its limits
// in x-ratelimit-* headers or a 429 (which the shared limits now keep to),
// or without a word about them (then waiting longer would not tell more).
func (d *deployment) endSlowStart() {
	d.endSlowOnce.Do(func() {
		d.slowStart.Store(0)
		close(d.slowStartOver)
	})
}

// inSlowStart returns the channel closed when the slow start ends if ch
// holds its window's charge, else nil.
func (d *deployment) inSlowStart(ch []ratelimit.Charge) <-chan struct{} {
	if d.slowStart.Load() == 0 {
		return nil
	}
	scope := d.slowStartScope()
	for i := range ch {
		if ch[i].Scope == scope {
			return d.slowStartOver
		}
	}
	return nil
}

// learn records the remaining quota a decision reported for this
// deployment's limits.
func (d *deployment) learn(st []ratelimit.Status) {
	h := int64(1e6)
	seen := false
	for _, s := range st {
		if s.Scope != d.scope || s.Kind == ratelimit.Concurrency || s.Limit <= 0 {
			continue
		}
		seen = true
		h = min(h, s.Remaining*1e6/s.Limit)
	}
	if seen {
		d.headroom.Store(h)
	}
}

// lowest returns the smaller of two limits where 0 means none.
func lowest(a, b int64) int64 {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}

// learnProvider records the limits and remaining quota the provider itself
// reported, by kind.
func (d *deployment) learnProvider(rep [learnedKinds]reportedLimit, now time.Time) {
	h := int64(1e6)
	seen := false
	for k, r := range rep {
		if r.limit <= 0 {
			continue
		}
		l := &d.learned[k]
		if r.limit != l.limit.Load() {
			l.limit.Store(r.limit)
		}
		if until := now.Add(learnTTL).UnixNano(); until-l.until.Load() > int64(time.Second) {
			l.until.Store(until) // not on every response: once a second is plenty
		}
		if r.remaining >= 0 {
			h, seen = min(h, r.remaining*1e6/r.limit), true
		}
	}
	if seen {
		d.headroom.Store(h)
	}
}

// configured returns the deployment's limit of kind k as configured (0:
// none).
func (d *deployment) configured(k int) int64 {
	switch k {
	case learnedRequests:
		return d.Limits.RPM
	case learnedInput:
		return d.Limits.ITPM
	case learnedOutput:
		return d.Limits.OTPM
	}
	return d.Limits.TPM
}

// kindScope is the rate-limit scope of the deployment's limits of kind k.
func (d *deployment) kindScope(k int) string {
	switch k {
	case learnedInput:
		return d.inScope
	case learnedOutput:
		return d.outScope
	}
	return d.scope
}

// shareDue reports whether a reported limit v of kind k should be shared
// with the other replicas now. One below the configured limit (or with
// none configured): when this replica has not shared it yet, or shared it
// half a learnTTL ago, and on every 429 (its remaining count matters
// then). One at or above it: once, when this replica has not shared it
// yet, so that it replaces a lower one shared before (a raised quota,
// perhaps reported to another replica) at once.
func (d *deployment) shareDue(k int, v int64, now time.Time, on429 bool) bool {
	l := &d.learned[k]
	base := d.configured(k)
	prev := l.shared.Load()
	if base > 0 && v >= base {
		return v != prev
	}
	return on429 || v != prev || now.UnixNano() >= l.sharedAt.Load()+int64(learnTTL/2)
}

// markShared records that v of kind k is being shared at now.
func (d *deployment) markShared(k int, v int64, now time.Time) {
	d.learned[k].shared.Store(v)
	d.learned[k].sharedAt.Store(now.UnixNano())
}

// charged returns the limit of kind k as this deployment's charges carry it
// without a learned one: what the shared bucket has been refilling at.
// reported stands in for a tokens limit that is not configured.
func (d *deployment) charged(k int, reported int64) int64 {
	switch base := d.configured(k); {
	case base > 0:
		return base
	case k == learnedRequests && !d.Limits.any():
		return unlimitedRPM
	}
	return reported
}

// unlimitedRPM stands for "no request limit" on a deployment: requests still
// pass through its scope so that a provider's 429 cooldown (which blocks a
// scope) holds back every replica even when no quota is configured.
const unlimitedRPM = 1 << 40

// ioCharges appends the deployment's input and output tokens limits
// (ITPM, OTPM) as charges of a request of prompt and completion tokens.
func (d *deployment) ioCharges(dst []ratelimit.Charge, prompt, completion int64) []ratelimit.Charge {
	in, out := d.Limits.ITPM, d.Limits.OTPM
	if d.learned[learnedInput].limit.Load() > 0 || d.learned[learnedOutput].limit.Load() > 0 {
		now := time.Now()
		in, out = lowest(in, d.learned[learnedInput].get(now)), lowest(out, d.learned[learnedOutput].get(now))
	}
	for _, io := range [2]struct {
		scope       string
		limit, cost int64
	}{{d.inScope, in, prompt}, {d.outScope, out, completion}} {
		if io.limit > 0 {
			dst = append(dst, ratelimit.Charge{Scope: io.scope, Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: io.limit, Window: time.Minute},
				Cost: min(max(io.cost, 1), io.limit)})
		}
	}
	return dst
}

// ownScope reports whether scope is one of the deployment's.
func (d *deployment) ownScope(scope string) bool {
	return scope == d.scope || scope == d.inScope || scope == d.outScope
}

// charges returns the deployment's limits as charges of a request costing
// tokens.
func (d *deployment) charges(dst []ratelimit.Charge, tokens int64) []ratelimit.Charge {
	l := d.Limits
	if d.learned[learnedRequests].limit.Load() > 0 || d.learned[learnedTokens].limit.Load() > 0 {
		now := time.Now()
		l.RPM = lowest(l.RPM, d.learned[learnedRequests].get(now))
		l.TPM = lowest(l.TPM, d.learned[learnedTokens].get(now))
	}
	if !l.any() {
		l.RPM = unlimitedRPM
	}
	dst = appendCharges(dst, d.scope, l, tokens)
	if w := d.slowStart.Load(); w > 0 {
		dst = append(dst, ratelimit.Charge{Scope: d.slowStartScope(), Limit: ratelimit.Limit{Kind: ratelimit.Concurrency, Limit: w}, Cost: 1})
	}
	return dst
}

// appendCharges appends scope's limits. A token estimate above a whole
// window's allowance is charged as the full window, so the request waits for
// a full bucket instead of never fitting; Settle charges what it really used.
func appendCharges(dst []ratelimit.Charge, scope string, l Limits, tokens int64) []ratelimit.Charge {
	if l.RPM > 0 {
		dst = append(dst, ratelimit.Charge{Scope: scope, Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: l.RPM, Window: time.Minute}, Cost: 1})
	}
	if l.TPM > 0 {
		dst = append(dst, ratelimit.Charge{Scope: scope, Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: l.TPM, Window: time.Minute}, Cost: min(max(tokens, 1), l.TPM)})
	}
	if l.Concurrency > 0 {
		dst = append(dst, ratelimit.Charge{Scope: scope, Limit: ratelimit.Limit{Kind: ratelimit.Concurrency, Limit: l.Concurrency}, Cost: 1})
	}
	return dst
}

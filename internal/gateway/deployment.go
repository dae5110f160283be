package gateway

import (
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/ratelimit"
)

// deployment is a Deployment with what the gateway learns about it.
type deployment struct {
	*Deployment
	scope string // rate-limit scope
	// headroom is the smaller of the remaining requests and tokens
	// fractions last seen for this deployment, in millionths (1e6 = all
	// left); used to send a request to the least-loaded key.
	headroom atomic.Int64
	// observing is set while a provider's remaining count is being shared.
	observing atomic.Bool
	// learnedRPM and learnedTPM are the limits the provider reports for
	// this key and model (x-ratelimit-limit-*); 0 until seen. Admission
	// uses the lower of them and the configured limits, so a key whose
	// real quota is below the configuration is not overrun.
	learnedRPM, learnedTPM atomic.Int64
}

func newDeployment(d *Deployment) *deployment {
	dep := &deployment{Deployment: d, scope: "dep:" + d.Name}
	dep.headroom.Store(1e6)
	return dep
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
// reported.
func (d *deployment) learnProvider(limitReq, remReq, limitTok, remTok int64) {
	if limitReq > 0 && limitReq != d.learnedRPM.Load() {
		d.learnedRPM.Store(limitReq)
	}
	if limitTok > 0 && limitTok != d.learnedTPM.Load() {
		d.learnedTPM.Store(limitTok)
	}
	h := int64(1e6)
	seen := false
	if limitReq > 0 && remReq >= 0 {
		h, seen = min(h, remReq*1e6/limitReq), true
	}
	if limitTok > 0 && remTok >= 0 {
		h, seen = min(h, remTok*1e6/limitTok), true
	}
	if seen {
		d.headroom.Store(h)
	}
}

// unlimitedRPM stands for "no request limit" on a deployment: requests still
// pass through its scope so that a provider's 429 cooldown (which blocks a
// scope) holds back every replica even when no quota is configured.
const unlimitedRPM = 1 << 40

// charges returns the deployment's limits as charges of a request costing
// tokens.
func (d *deployment) charges(dst []ratelimit.Charge, tokens int64) []ratelimit.Charge {
	l := d.Limits
	l.RPM = lowest(l.RPM, d.learnedRPM.Load())
	l.TPM = lowest(l.TPM, d.learnedTPM.Load())
	if !l.any() {
		l.RPM = unlimitedRPM
	}
	return appendCharges(dst, d.scope, l, tokens)
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

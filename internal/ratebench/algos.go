package ratebench

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/ratelimit"
	rlredis "github.com/llmgate/llmgate/ratelimit/redis"
)

// Algorithm names for --algo.
const (
	AlgoLlmgate = "llmgate" // package ratelimit on its Redis backend
	AlgoGCRA    = "gcra"    // the redis_rate v10 GCRA script, one limit
)

//go:embed gcra.lua
var gcraSrc string

var gcraScript = rueidis.NewLuaScript(gcraSrc)

// decider makes one admission decision; used by one goroutine at a time.
type decider interface {
	decide(ctx context.Context) (allowed bool, err error)
}

// limiterDecider admits a request through a ratelimit.Limiter.
type limiterDecider struct {
	l      *ratelimit.Limiter
	req    ratelimit.Request
	wait   bool    // Wait (with ctx's deadline) instead of Allow
	settle []int64 // Settle each admission with these costs; nil: do not
}

func (d *limiterDecider) decide(ctx context.Context) (bool, error) {
	var dec ratelimit.Decision
	var err error
	if d.wait {
		dec, err = d.l.Wait(ctx, d.req)
		if ctx.Err() != nil && err != nil {
			return false, nil // the run ended while waiting
		}
	} else {
		dec, err = d.l.Allow(ctx, d.req)
	}
	if err != nil {
		return false, err
	}
	if dec.Degraded {
		return false, fmt.Errorf("ratebench: store unreachable (degraded decision)")
	}
	if dec.Allowed && d.settle != nil {
		if err := d.l.Settle(ctx, dec.ID, d.settle); err != nil {
			return true, err
		}
	}
	return dec.Allowed, nil
}

// newLimiter returns an llmgate limiter for group on c, with a local quota
// (ratelimit.WithLocalQuota) when local is set.
func newLimiter(c rueidis.Client, group string, local bool) *ratelimit.Limiter {
	var opts []ratelimit.Option
	if local {
		opts = append(opts, ratelimit.WithLocalQuota(ratelimit.LocalQuota{}))
	}
	return ratelimit.New(rlredis.New(c, rlredis.Config{Group: group}), opts...)
}

// newLimiterDecider returns the llmgate decider for one limits setting on l.
func newLimiterDecider(l *ratelimit.Limiter, req ratelimit.Request, wait, settle bool) *limiterDecider {
	d := &limiterDecider{l: l, req: req, wait: wait}
	if settle {
		d.settle = make([]int64, len(req.Charges))
		for i, c := range req.Charges {
			d.settle[i] = max(c.Cost, 1)
		}
	}
	return d
}

// gcraDecider runs the GCRA script on one key.
type gcraDecider struct {
	c    rueidis.Client
	key  string
	args []string // burst, rate, period in seconds, cost
}

func newGCRADecider(c rueidis.Client, key string, rate, burst int64, period time.Duration) *gcraDecider {
	return &gcraDecider{c: c, key: key, args: []string{
		strconv.FormatInt(burst, 10), strconv.FormatInt(rate, 10), strconv.FormatFloat(period.Seconds(), 'f', -1, 64), "1",
	}}
}

func (g *gcraDecider) decide(ctx context.Context) (bool, error) {
	vals, err := gcraScript.Exec(ctx, g.c, []string{g.key}, g.args).ToArray()
	if err != nil {
		return false, fmt.Errorf("ratebench: gcra: %w", err)
	}
	if len(vals) != 4 {
		return false, fmt.Errorf("ratebench: gcra: reply of %d values", len(vals))
	}
	n, err := vals[0].AsInt64()
	if err != nil {
		return false, fmt.Errorf("ratebench: gcra: %w", err)
	}
	return n > 0, nil
}

package lockbench

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/storeurl"
)

// pinger times bare PING round trips on its own client: the unit every
// latency is compared with.
type pinger struct {
	c rueidis.Client
}

func newPinger(store string) (*pinger, error) {
	c, err := storeurl.OpenRedis(store)
	if err != nil {
		return nil, err
	}
	return &pinger{c: c}, nil
}

// measure sends n PINGs one after another and returns their round trips.
func (p *pinger) measure(ctx context.Context, n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		d, err := p.once(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// once times one PING.
func (p *pinger) once(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	if err := p.c.Do(ctx, p.c.B().Ping().Build()).Error(); err != nil {
		return 0, fmt.Errorf("lockbench: PING: %w", err)
	}
	return time.Since(t0), nil
}

func (p *pinger) close() { p.c.Close() }

// pingOnce times one PING on m's own client if it is a Pinger, else on p.
func pingOnce(ctx context.Context, m Mutex, p *pinger) (time.Duration, error) {
	if mp, ok := asPinger(m); ok {
		t0 := time.Now()
		if err := mp.Ping(ctx); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	}
	if p == nil {
		return 0, fmt.Errorf("lockbench: no PING client")
	}
	return p.once(ctx)
}

// asPinger returns m, or the Mutex it wraps, as a Pinger.
func asPinger(m Mutex) (Pinger, bool) {
	for {
		if p, ok := m.(Pinger); ok {
			return p, true
		}
		u, ok := m.(interface{ Unwrap() Mutex })
		if !ok {
			return nil, false
		}
		m = u.Unwrap()
	}
}

package testutil

import (
	"context"
	"testing"
	"time"
)

// TestDelayProxyAddsRTT: a PING through the proxy takes at least the round
// trip added, and the server still answers it.
func TestDelayProxyAddsRTT(t *testing.T) {
	r := StartRedis(t)
	const rtt = 20 * time.Millisecond
	p := StartDelayProxy(t, r.Addr, rtt)
	via := &Redis{Addr: p.Addr}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	start := time.Now()
	got, err := via.Do(ctx, "PING")
	if err != nil || got != "+PONG" {
		t.Fatalf("PING through the proxy = %q, %v", got, err)
	}
	if d := time.Since(start); d < rtt {
		t.Fatalf("PING through the proxy took %v, less than the %v added", d, rtt)
	}
	p.SetRTT(0)
	if p.RTT() != 0 {
		t.Fatalf("RTT() = %v after SetRTT(0)", p.RTT())
	}
	// Held: nothing gets through until Resume.
	p.Hold()
	res := make(chan error, 1)
	go func() {
		_, err := via.Do(ctx, "PING")
		res <- err
	}()
	select {
	case err := <-res:
		t.Fatalf("PING answered during Hold (err %v)", err)
	case <-time.After(3 * rtt): // the window in which nothing may arrive
	}
	p.Resume()
	if err := <-res; err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
	p.Close()
	if _, err := via.Do(ctx, "PING"); err == nil {
		t.Fatalf("PING through a closed proxy succeeded")
	}
}

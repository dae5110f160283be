package simrun

import (
	"testing"
	"time"
)

// The built-in scenarios are scaled down here (fewer callers, a smaller
// quota, a shorter run) so that each test takes seconds; the shape of the
// experiment, and what it must show, is the same.

// TestBurstFits: a burst above the quota's bucket but within what the
// quota allows over the run. Through 3 replicas no 429 reaches the
// provider and at least 99% of the requests are served within their
// deadline; straight to the provider the burst gets 429s.
func TestBurstFits(t *testing.T) {
	sc := builtin(t, "burst")
	sc.Provider.RPM = 120 // a bucket of 120, then 2 a second
	sc.Provider.TTFT = 200 * time.Millisecond
	sc.Clients.Callers = 130 // fits: 120 + 2/s × 14s
	sc.Clients.Deadline = 14 * time.Second
	sc.Gateway.MaxWait = 0 // the default for this deadline
	sc.SetDefaults()
	sc.Duration = 16 * time.Second
	res := run(t, sc, 3)
	d, g := res.Arm(ArmDirect), res.Arm(ArmLlmgate)
	if d.Provider429 == 0 {
		t.Errorf("direct: no 429 at the provider; the burst does not exceed the bucket")
	}
	if g.Provider429 != 0 {
		t.Errorf("llmgate: %d 429s at the provider; want 0", g.Provider429)
	}
	if g.Requests != sc.Clients.Callers || g.SuccessRate < 0.99 {
		t.Errorf("llmgate: %d of %d requests served within the deadline (%.1f%%); want all %d sent, at least 99%% served",
			g.Succeeded, g.Requests, 100*g.SuccessRate, sc.Clients.Callers)
	}
}

// TestBurstExceeds: callers that keep sending, more than the quota allows.
// Through 3 replicas llmgate uses at least 95% of the quota without a
// single 429 at the provider.
func TestBurstExceeds(t *testing.T) {
	sc := builtin(t, "burst")
	sc.Provider.RPM = 120
	sc.Provider.TTFT = 200 * time.Millisecond
	sc.Clients.Callers = 60
	sc.Clients.Requests = 0 // until the end
	sc.Clients.Deadline = 5 * time.Second
	sc.Gateway.MaxWait = 0 // the default for this deadline
	sc.SetDefaults()
	sc.Duration = 10 * time.Second
	res := run(t, sc, 3)
	g := res.Arm(ArmLlmgate)
	if g.Provider429 != 0 {
		t.Errorf("llmgate: %d 429s at the provider; want 0", g.Provider429)
	}
	if g.QuotaUsed < 0.95 {
		t.Errorf("llmgate used %.1f%% of the quota; want at least 95%%; per second: %+v", 100*g.QuotaUsed, g.Series)
	}
	if d := res.Arm(ArmDirect); d.Provider429 == 0 {
		t.Errorf("direct: no 429 at the provider under a load above the quota")
	}
}

// TestDuplicates: groups of identical prompts sent at once through 3
// replicas make exactly one upstream call per group; straight to the
// provider every copy is a call.
func TestDuplicates(t *testing.T) {
	sc := builtin(t, "duplicates")
	sc.Clients.Callers = 60 // 3 groups of 20
	sc.Clients.Identical = 20
	sc.Duration = 20 * time.Second
	res := run(t, sc, 3)
	d, g := res.Arm(ArmDirect), res.Arm(ArmLlmgate)
	if g.Groups == nil || g.Groups.Groups != 3 {
		t.Fatalf("llmgate: groups %+v; want 3", g.Groups)
	}
	if g.Groups.CallsMin != 1 || g.Groups.CallsMax != 1 || g.UpstreamCalls != 3 {
		t.Errorf("llmgate: %d-%d upstream calls per group, %d in all; want exactly 1 per group", g.Groups.CallsMin, g.Groups.CallsMax, g.UpstreamCalls)
	}
	if g.Succeeded != sc.Clients.Callers {
		t.Errorf("llmgate: %d of %d callers answered", g.Succeeded, sc.Clients.Callers)
	}
	if d.UpstreamCalls != sc.Clients.Callers || d.Groups.CallsMax != 20 {
		t.Errorf("direct: %d upstream calls, up to %d per group; want one per caller", d.UpstreamCalls, d.Groups.CallsMax)
	}
}

// TestConversations: sessions whose turns overlap, under a provider that
// accepts few requests at once (scaled with the sessions), with 30%
// duplicate messages. Through 3
// replicas every session's turns reach the provider in send order and the
// tokens billed are at most 0.75 of those billed straight to it.
func TestConversations(t *testing.T) {
	sc := builtin(t, "conversations")
	sc.Conversations.Sessions = 30
	sc.Conversations.Turns = 4
	sc.Provider.Concurrency = 40
	sc.Clients.Deadline = 15 * time.Second
	sc.Gateway.MaxWait = 0
	sc.SetDefaults()
	sc.Duration = 25 * time.Second
	res := run(t, sc, 3)
	d, g := res.Arm(ArmDirect), res.Arm(ArmLlmgate)
	if g.Turns == nil || g.Turns.OutOfOrder != 0 {
		t.Errorf("llmgate: turns out of order: %+v; want none", g.Turns)
	}
	if g.SuccessRate < 0.99 {
		t.Errorf("llmgate: %.1f%% of the messages answered; want at least 99%%", 100*g.SuccessRate)
	}
	if d.TokensBilled == 0 || float64(g.TokensBilled) > 0.75*float64(d.TokensBilled) {
		t.Errorf("billed %d tokens through llmgate, %d straight (%.2fx); want at most 0.75x",
			g.TokensBilled, d.TokensBilled, float64(g.TokensBilled)/float64(max(d.TokensBilled, 1)))
	}
	if d.Turns.Duplicates == 0 || d.Turns.Duplicates != g.Turns.Duplicates {
		t.Errorf("duplicates sent: direct %d, llmgate %d; want the same workload with some", d.Turns.Duplicates, g.Turns.Duplicates)
	}
}

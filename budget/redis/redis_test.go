package redis_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/budget/budgettest"
	"github.com/llmgate/llmgate/budget/redis"
	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/testutil"
)

func TestConformance(t *testing.T) {
	r := testutil.StartRedis(t)
	budgettest.Run(t, func(t *testing.T, _ clock.Clock) func() budget.Backend {
		// Each replica is its own client (its own connections).
		return func() budget.Backend { return redis.New(r.Client(t), redis.Config{}) }
	})
}

var testBudget = budget.Budget{Tenant: "acme", Period: budget.Month, Tokens: 1_000_000, MicroUSD: 1_000_000}

func newManager(t *testing.T, c rueidis.Client, mod ...func(*budget.Config)) *budget.Manager {
	t.Helper()
	cfg := budget.Config{Prices: budgettest.Prices()}
	for _, f := range mod {
		f(&cfg)
	}
	m, err := budget.New(redis.New(c, redis.Config{}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func spend(t *testing.T, m *budget.Manager, prompt, completion int64) budget.Reservation {
	t.Helper()
	u := budget.Usage{PromptTokens: prompt, CompletionTokens: completion}
	r, err := m.Reserve(t.Context(), testBudget, "", "test-model", u)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Settle(t.Context(), r, budget.Record{Deployment: "dep", Usage: u}); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRestartKeepsSpendWithAOF kills Redis (SIGKILL) after settles and
// checks that a server running with appendonly yes and appendfsync always
// has every settled charge after it restarts.
func TestRestartKeepsSpendWithAOF(t *testing.T) {
	r := testutil.StartRedisArgs(t, "--appendonly", "yes", "--appendfsync", "always")
	c := r.Client(t)
	cfg, err := c.Do(t.Context(), c.B().ConfigGet().Parameter("append*").Build()).AsStrMap()
	if err != nil || cfg["appendonly"] != "yes" || cfg["appendfsync"] != "always" {
		t.Fatalf("server config %v, %v; want appendonly yes, appendfsync always", cfg, err)
	}
	m := newManager(t, c)
	var settled budget.Reservation
	for range 10 {
		settled = spend(t, m, 100, 50) // 150 tokens, 200 µUSD each
	}
	held, err := m.Reserve(t.Context(), testBudget, "", "test-model", budget.Usage{PromptTokens: 7})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()

	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	m2 := newManager(t, r.Client(t))
	st, err := m2.Spend(t.Context(), testBudget, now)
	if err != nil {
		t.Fatal(err)
	}
	if st.Spent != (budget.Amount{Tokens: 1500, MicroUSD: 2000}) {
		t.Fatalf("spent after restart %+v, want 1500 tokens, 2000 µUSD", st.Spent)
	}
	// Holds survive too (and still expire on their own).
	if st.Reserved != held.Hold || st.Holds != 1 {
		t.Fatalf("reserved after restart %+v (%d holds), want %+v (1)", st.Reserved, st.Holds, held.Hold)
	}
	// So does idempotency: settling again charges nothing.
	if s, err := m2.Settle(t.Context(), settled, budget.Record{Usage: budget.Usage{PromptTokens: 100}}); err != nil || !s.Duplicate {
		t.Fatalf("repeated settle after restart: %+v, %v; want a duplicate", s, err)
	}
	rows, err := m2.Usage(t.Context(), testBudget.Tenant, held.Window.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Requests != 10 || rows[0].MicroUSD != 2000 {
		t.Fatalf("usage rows after restart: %+v", rows)
	}
}

// TestRestartWithoutPersistenceLosesSpend shows what docs/budget.md warns
// about: without AOF (or RDB) a Redis restart forgets every budget.
func TestRestartWithoutPersistenceLosesSpend(t *testing.T) {
	r := testutil.StartRedis(t) // --appendonly no --save ""
	m := newManager(t, r.Client(t))
	spend(t, m, 100, 0)
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	st, err := newManager(t, r.Client(t)).Spend(t.Context(), testBudget, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.Spent != (budget.Amount{}) {
		t.Fatalf("spent %+v after restarting a server without persistence; the test's premise is wrong", st.Spent)
	}
}

// TestOneRoundTripPerCall counts the commands the server executes.
func TestOneRoundTripPerCall(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	m := newManager(t, c)
	spend(t, m, 1, 1) // loads the scripts (EVALSHA, NOSCRIPT, EVAL) once

	if _, err := r.Do(t.Context(), "CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for range n {
		spend(t, m, 1, 1)
	}
	info, err := c.Do(t.Context(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ",")
		calls[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.Atoi(num)
	}
	// Commands run inside scripts are counted too; what the client sent is
	// the EVALSHAs. Any other command would be an extra round trip.
	inScripts := map[string]bool{"time": true, "zrangebyscore": true, "hget": true, "hdel": true, "zrem": true,
		"hincrby": true, "zremrangebyscore": true, "hmget": true, "zscore": true, "hexists": true, "hset": true,
		"zadd": true, "pexpireat": true, "hlen": true, "pttl": true, "pexpire": true, "zrange": true}
	for name, k := range calls {
		switch {
		case name == "evalsha":
			if k != 2*n {
				t.Errorf("%d reserve+settle pairs sent %d EVALSHA, want %d", n, k, 2*n)
			}
		case inScripts[name], name == "info", name == "config|resetstat", name == "ping":
		case name == "hello", strings.HasPrefix(name, "client|"):
			// The client's connection handshakes (it may open a connection
			// lazily): per connection, not per call.
		default:
			t.Errorf("%d reserve+settle pairs sent %d %s: more than one round trip per call", n, k, name)
		}
	}
}

// TestKeysShareOneSlot checks the hash tag of every key of a window,
// for tenant names with braces and colons in them.
func TestKeysShareOneSlot(t *testing.T) {
	b := redis.New(nil, redis.Config{})
	seen := map[string]string{}
	for _, tenant := range []string{"acme", "{x}", "a}b", "a{b", "a:b:c", "}{", "}", "%7D", "ünï"} {
		keys := b.Keys(budget.Key{Tenant: tenant, WindowID: "2026-11"})
		if len(keys) != 10 {
			t.Fatalf("%d keys", len(keys))
		}
		tag := hashTag(keys[0])
		escaped := strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(tenant)
		if want := escaped + ":2026-11"; tag != want {
			t.Errorf("tenant %q: hash tag %q, want %q", tenant, tag, want)
		}
		for _, k := range keys {
			if !strings.HasPrefix(k, redis.DefaultPrefix) {
				t.Errorf("key %q lacks the prefix", k)
			}
			if hashTag(k) != tag || tag == k {
				t.Errorf("tenant %q: key %q has hash tag %q, want %q shared by all keys", tenant, k, hashTag(k), tag)
			}
		}
		// Different windows and tenants do not share keys.
		other := b.Keys(budget.Key{Tenant: tenant, WindowID: "2026-12"})
		if other[0] == keys[0] {
			t.Errorf("tenant %q: two windows share key %q", tenant, keys[0])
		}
		if seen[keys[0]] != "" {
			t.Errorf("tenants %q and %q share key %q", seen[keys[0]], tenant, keys[0])
		}
		seen[keys[0]] = tenant
	}
}

// hashTag is the part of key Redis Cluster hashes: between the first "{"
// and the next "}", if that is not empty; else the whole key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

// TestStoreDown stops Redis and checks both outage policies.
func TestStoreDown(t *testing.T) {
	r := testutil.StartRedis(t)
	closed := newManager(t, r.Client(t))
	open := newManager(t, r.Client(t), func(c *budget.Config) { c.FailOpen = true })
	spend(t, closed, 1, 0) // connect while up
	spend(t, open, 1, 0)
	r.Stop()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	u := budget.Usage{PromptTokens: 10}
	_, err := closed.Reserve(ctx, testBudget, "", "test-model", u)
	if !errors.Is(err, budget.ErrStoreUnavailable) {
		t.Fatalf("fail-closed Reserve with Redis down = %v, want ErrStoreUnavailable", err)
	}
	if st := closed.Stats(); st.StoreErrors != 1 || st.FailedOpen != 0 {
		t.Fatalf("fail-closed stats %+v", st)
	}
	res, err := open.Reserve(ctx, testBudget, "", "test-model", u)
	if err != nil || !res.Unchecked {
		t.Fatalf("fail-open Reserve with Redis down = %+v, %v; want an unchecked reservation", res, err)
	}
	if st := open.Stats(); st.StoreErrors != 1 || st.FailedOpen != 1 {
		t.Fatalf("fail-open stats %+v", st)
	}
	if _, err := open.Settle(ctx, res, budget.Record{Usage: u}); !errors.Is(err, budget.ErrStoreUnavailable) {
		t.Fatalf("Settle with Redis down = %v, want ErrStoreUnavailable", err)
	}

	// Back up (empty: no persistence here): the retried settle charges.
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := open.Settle(ctx, res, budget.Record{Usage: u})
		if err == nil {
			if s.Duplicate || s.Spent.Tokens != 10 {
				t.Fatalf("settle after recovery %+v; want 10 tokens charged", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("settle still failing 10s after Redis came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // the client reconnects on its own schedule
	}
}

func TestUsageRejectsForeignFields(t *testing.T) {
	r := testutil.StartRedis(t)
	c := r.Client(t)
	b := redis.New(c, redis.Config{})
	key := budget.Key{Tenant: "acme", WindowID: "2026-11"}
	usageKey := b.Keys(key)[4]
	if err := c.Do(t.Context(), c.B().Hset().Key(usageKey).FieldValue().FieldValue("n:99:x", "1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Usage(t.Context(), key); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("Usage over a malformed field = %v, want an error", err)
	}
}

package memory_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/budget/budgettest"
	"github.com/llmgate/llmgate/budget/memory"
	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/testutil"
)

// Environment of the helper process (see TestHelperProcess).
const (
	envHelperPath = "LLMGATE_BUDGET_HELPER_PATH"
	helperReady   = "SETTLED"
)

func TestConformance(t *testing.T) {
	budgettest.Run(t, func(t *testing.T, clk clock.Clock) func() budget.Backend {
		b := open(t, filepath.Join(t.TempDir(), "budget.state"), clk)
		return func() budget.Backend { return b }
	})
}

func TestConformanceWithoutFile(t *testing.T) {
	budgettest.Run(t, func(t *testing.T, clk clock.Clock) func() budget.Backend {
		b := open(t, "", clk)
		return func() budget.Backend { return b }
	})
}

// open opens a backend that is closed when the test ends.
func open(t *testing.T, path string, clk clock.Clock) *memory.Backend {
	t.Helper()
	b, err := memory.Open(memory.Config{Path: path, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

func newManager(t *testing.T, b budget.Backend, clk clock.Clock) *budget.Manager {
	t.Helper()
	m, err := budget.New(b, budget.Config{Prices: budgettest.Prices(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var testBudget = budget.Budget{Tenant: "acme", Period: budget.Month, Tokens: 1_000_000, MicroUSD: 1_000_000}

// spend reserves and settles one request of prompt+completion tokens.
func spend(t *testing.T, m *budget.Manager, prompt, completion int64) budget.Settled {
	t.Helper()
	u := budget.Usage{PromptTokens: prompt, CompletionTokens: completion}
	r, err := m.Reserve(t.Context(), testBudget, "", "test-model", u)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Settle(t.Context(), r, budget.Record{Deployment: "dep", Usage: u})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func wantSpent(t *testing.T, m *budget.Manager, at time.Time, want budget.Amount, holds int) {
	t.Helper()
	st, err := m.Spend(t.Context(), testBudget, at)
	if err != nil {
		t.Fatal(err)
	}
	if st.Spent != want || st.Holds != holds {
		t.Fatalf("spent %+v with %d holds, want %+v with %d", st.Spent, st.Holds, want, holds)
	}
}

// TestRestartKeepsSpend: spend, usage rows and live holds survive a
// restart; a hold whose request died with the process expires and is
// charged, as a dead replica's is on Redis.
func TestRestartKeepsSpend(t *testing.T) {
	path := filepath.Join(t.TempDir(), "budget.state")
	now := time.Now()
	clk := clock.NewFake(now)
	b, err := memory.Open(memory.Config{Path: path, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(t, b, clk)
	spend(t, m, 100, 50) // 150 tokens, 100 + 100 µUSD
	spend(t, m, 10, 0)
	// A request in flight when the process stops.
	r, err := m.Reserve(t.Context(), testBudget, "", "test-model", budget.Usage{PromptTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Reserve(t.Context(), testBudget, "", "test-model", budget.Usage{}); !errors.Is(err, budget.ErrStoreUnavailable) || !errors.Is(err, memory.ErrClosed) {
		t.Fatalf("Reserve after Close = %v, want ErrStoreUnavailable wrapping ErrClosed", err)
	}

	b2 := open(t, path, clk)
	m2 := newManager(t, b2, clk)
	wantSpent(t, m2, now, budget.Amount{Tokens: 160, MicroUSD: 210}, 1)
	w, _ := testBudget.Window(now)
	rows, err := m2.Usage(t.Context(), "acme", w.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := []budget.UsageRow{{Model: "test-model", Deployment: "dep", Requests: 2, PromptTokens: 110, CompletionTokens: 50, MicroUSD: 210}}
	if len(rows) != 1 || rows[0] != want[0] {
		t.Fatalf("rows after restart %+v, want %+v", rows, want)
	}
	// Nobody renews the hold: it expires and is charged.
	clk.Advance(m2.TTL() + time.Second)
	charged := budget.Amount{Tokens: 160 + r.Hold.Tokens, MicroUSD: 210 + r.Hold.MicroUSD}
	wantSpent(t, m2, now, charged, 0)
	// And it keeps counting from there.
	spend(t, m2, 40, 0)
	wantSpent(t, m2, now, budget.Amount{Tokens: charged.Tokens + 40, MicroUSD: charged.MicroUSD + 40}, 0)
}

// TestCrashKeepsSettledSpend kills a process (SIGKILL, no Close) right after
// its Settle returned, and checks that the spend is in the file.
func TestCrashKeepsSettledSpend(t *testing.T) {
	path := filepath.Join(t.TempDir(), "budget.state")
	child := testutil.StartChild(t, t.Context(), "TestHelperProcess", envHelperPath+"="+path)
	if line := child.Line(t, time.Minute); line != helperReady {
		t.Fatalf("helper process said %q, want %q", line, helperReady)
	}
	// Crash it: no Close, no flush, no deferred anything.
	child.Kill()
	if st := child.Cmd.ProcessState; st == nil || st.Success() {
		t.Fatalf("helper process was not killed: %v", st)
	}

	// The kernel released its lock; the file has the spend.
	b := open(t, path, nil)
	wantSpent(t, newManager(t, b, nil), time.Now(), budget.Amount{Tokens: 300, MicroUSD: 500}, 0)
}

// TestHelperProcess is the crashing process of TestCrashKeepsSettledSpend;
// it does nothing in a normal test run.
func TestHelperProcess(t *testing.T) {
	path := os.Getenv(envHelperPath)
	if path == "" {
		t.Skip("helper process for TestCrashKeepsSettledSpend")
	}
	b, err := memory.Open(memory.Config{Path: path})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(3)
	}
	m := newManager(t, b, nil)
	spend(t, m, 100, 200) // 300 tokens, 100 + 400 µUSD
	testutil.Say(helperReady)
	// Wait to be killed (bounded, in case the parent died).
	time.Sleep(60 * time.Second)
	os.Exit(4)
}

func TestSecondOpenRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "budget.state")
	b, err := memory.Open(memory.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := memory.Open(memory.Config{Path: path}); !errors.Is(err, memory.ErrInUse) || !strings.Contains(err.Error(), path) {
		t.Fatalf("second Open = %v, want ErrInUse naming %s", err, path)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	open(t, path, nil)
}

func TestCorruptFileRefused(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.state")
	b, err := memory.Open(memory.Config{Path: good})
	if err != nil {
		t.Fatal(err)
	}
	spend(t, newManager(t, b, nil), 100, 100)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	valid, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	nl := strings.IndexByte(string(valid), '\n')
	flip := func(i int) []byte {
		c := []byte(string(valid))
		c[i] ^= 0x01
		return c
	}
	cases := []struct {
		name string
		data []byte
		msg  string
	}{
		{"empty", nil, "empty"},
		{"truncated body", valid[:len(valid)-7], "truncated"},
		{"truncated header", valid[:nl/2], "header"},
		{"appended", append([]byte(string(valid)), "xx"...), "header says"},
		{"flipped body byte", flip(len(valid) - 10), "checksum"},
		{"flipped header byte", flip(nl - 3), "checksum"},
		{"not a state file", []byte("{\"windows\":[]}\n"), "not a budget state file"},
		{"future version", []byte(strings.Replace(string(valid), "llmgate-budget-state 1 ", "llmgate-budget-state 9 ", 1)), "version"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "budget.state")
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := memory.Open(memory.Config{Path: path})
			if !errors.Is(err, memory.ErrCorrupt) {
				t.Fatalf("Open = %v, want ErrCorrupt", err)
			}
			if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, tc.msg) || !strings.Contains(msg, "move it away") {
				t.Fatalf("error %q should name %s, say %q and what to do", msg, path, tc.msg)
			}
			// The file is left exactly as it was, for the operator.
			if got, _ := os.ReadFile(path); string(got) != string(tc.data) {
				t.Fatal("a refused file was changed")
			}
			// And nothing holds its lock.
			if err := os.WriteFile(path, valid, 0o600); err != nil {
				t.Fatal(err)
			}
			open(t, path, nil)
		})
	}
}

func TestUnreadableFileRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "budget.state")
	if err := os.Mkdir(path, 0o700); err != nil { // a directory where the file should be
		t.Fatal(err)
	}
	_, err := memory.Open(memory.Config{Path: path})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open = %v, want an error naming %s", err, path)
	}
	missing := filepath.Join(t.TempDir(), "no-such-dir", "budget.state")
	if _, err := memory.Open(memory.Config{Path: missing}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Open in a missing directory = %v, want an error saying so", err)
	}
}

// TestGroupCommit holds the first write until 200 settles have been applied
// in memory, and checks that none returned before its write and that they
// all shared a couple of writes.
func TestGroupCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "budget.state")
	b, err := memory.Open(memory.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	gate := make(chan struct{})
	var once sync.Once
	memory.SetBeforeWrite(b, func() { once.Do(func() { <-gate }) })
	m := newManager(t, b, nil)
	const n = 200
	rs := make([]budget.Reservation, n)
	for i := range rs {
		r, err := m.Reserve(t.Context(), testBudget, "", "test-model", budget.Usage{PromptTokens: 1})
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = r
	}
	if w := b.Writes(); w != 0 {
		t.Fatalf("%d reservations wrote the file %d times; reservations are not persisted", n, w)
	}
	var returned atomic.Int64
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := m.Settle(t.Context(), rs[i], budget.Record{Usage: budget.Usage{PromptTokens: 1}})
			returned.Add(1)
			errs <- err
		}()
	}
	// All settles apply in memory while the first write is held.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := m.Spend(t.Context(), testBudget, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if st.Spent.Tokens == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d settles applied", st.Spent.Tokens, n)
		}
		time.Sleep(time.Millisecond) // settles have no "applied" signal
	}
	if got := returned.Load(); got != 0 {
		t.Fatalf("%d settles returned before any write finished", got)
	}
	close(gate)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if w := b.Writes(); w > 3 {
		t.Fatalf("%d concurrent settles took %d writes, want at most 3", n, w)
	} else {
		t.Logf("%d concurrent settles took %d writes", n, w)
	}
	// What they were told is durable is in the file.
	b2 := reopenCopy(t, path)
	wantSpent(t, newManager(t, b2, nil), time.Now(), budget.Amount{Tokens: n, MicroUSD: n}, 0)
}

// TestMinWriteInterval: with writes paced, two writes of the state file are
// at least the interval apart however fast settles arrive, and each settle
// still returns only once it is in the file.
func TestMinWriteInterval(t *testing.T) {
	const interval = 30 * time.Millisecond
	path := filepath.Join(t.TempDir(), "budget.state")
	b, err := memory.Open(memory.Config{Path: path, MinWriteInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	var mu sync.Mutex
	var writes []time.Time
	memory.SetBeforeWrite(b, func() {
		mu.Lock()
		writes = append(writes, time.Now())
		mu.Unlock()
	})
	m := newManager(t, b, nil)
	const workers, each = 4, 10
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				r, err := m.Reserve(t.Context(), testBudget, "", "test-model", budget.Usage{PromptTokens: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := m.Settle(t.Context(), r, budget.Record{Usage: budget.Usage{PromptTokens: 1}}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(writes); i++ {
		if gap := writes[i].Sub(writes[i-1]); gap < interval {
			t.Fatalf("writes %d and %d only %v apart, want at least %v", i-1, i, gap, interval)
		}
	}
	if len(writes) >= workers*each {
		t.Fatalf("%d settles took %d writes", workers*each, len(writes))
	}
	wantSpent(t, newManager(t, reopenCopy(t, path), nil), time.Now(), budget.Amount{Tokens: workers * each, MicroUSD: workers * each}, 0)
}

// reopenCopy opens a copy of the state file at path, as a restarted process
// would find it.
func reopenCopy(t *testing.T, path string) *memory.Backend {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "copy.state")
	if err := os.WriteFile(cp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return open(t, cp, nil)
}

// TestWriteFailureThenRetry makes writes fail, checks that Settle reports
// it, and that a retried Settle returns nil only once the charge is saved.
func TestWriteFailureThenRetry(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "budget.state")
	b := open(t, path, nil)
	m := newManager(t, b, nil)
	spend(t, m, 1, 0)

	if err := os.RemoveAll(dir); err != nil { // writes now fail
		t.Fatal(err)
	}
	u := budget.Usage{PromptTokens: 10}
	r, err := m.Reserve(t.Context(), testBudget, "", "test-model", u)
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Settle(t.Context(), r, budget.Record{Usage: u})
	if !errors.Is(err, budget.ErrStoreUnavailable) || !strings.Contains(err.Error(), "not saved") {
		t.Fatalf("Settle with a failing disk = %v, want ErrStoreUnavailable saying it was not saved", err)
	}
	if m.Stats().StoreErrors != 1 {
		t.Fatalf("store errors %d, want 1", m.Stats().StoreErrors)
	}
	// The charge counts in memory meanwhile (admission stays conservative).
	wantSpent(t, m, time.Now(), budget.Amount{Tokens: 11, MicroUSD: 11}, 0)
	// A retry while the disk still fails fails too, rather than claiming
	// the first one's charge is saved.
	if _, err := m.Settle(t.Context(), r, budget.Record{Usage: u}); err == nil {
		t.Fatal("retried Settle succeeded while nothing can be saved")
	}

	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := m.Settle(t.Context(), r, budget.Record{Usage: u})
	if err != nil || !s.Duplicate {
		t.Fatalf("retried Settle after the disk recovered = %+v, %v; want a duplicate, nil", s, err)
	}
	b2 := reopenCopy(t, path)
	wantSpent(t, newManager(t, b2, nil), time.Now(), budget.Amount{Tokens: 11, MicroUSD: 11}, 0)
}

func TestRetentionForgetsOldWindows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "budget.state")
	clk := clock.NewFake(budgettest.Start())
	b := open(t, path, clk)
	m, err := budget.New(b, budget.Config{Prices: budgettest.Prices(), Clock: clk, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	day := budget.Budget{Tenant: "acme", Period: budget.Day, Tokens: 1000}
	settleDay := func() budget.Window {
		r, err := m.Reserve(t.Context(), day, "", "test-model", budget.Usage{PromptTokens: 7})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Settle(t.Context(), r, budget.Record{Usage: budget.Usage{PromptTokens: 7}}); err != nil {
			t.Fatal(err)
		}
		return r.Window
	}
	first := settleDay()
	// The next day, within retention, the old day is still there.
	clk.Advance(first.End.Sub(clk.Now()) + 30*time.Minute)
	settleDay()
	if rows, _ := m.Usage(t.Context(), "acme", first.ID); len(rows) != 1 {
		t.Fatalf("rows of yesterday within retention: %+v", rows)
	}
	// Past it, it is gone, from memory and from the file.
	clk.Advance(2 * time.Hour)
	settleDay()
	if rows, _ := m.Usage(t.Context(), "acme", first.ID); len(rows) != 0 {
		t.Fatalf("rows of a window past its retention: %+v", rows)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), first.ID) {
		t.Fatalf("the state file still holds window %s", first.ID)
	}
}

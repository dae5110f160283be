package tenants

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/testutil"
)

// The conformance suite, run on every Store.
func TestMemoryStore(t *testing.T) {
	runSuite(t, func(t *testing.T) Store { return NewMemory() })
}

func TestRedisStore(t *testing.T) {
	srv := testutil.StartRedis(t)
	n := 0
	runSuite(t, func(t *testing.T) Store {
		n++ // a prefix per subtest: they share the server
		return NewRedis(srv.Client(t), "test"+string(rune('a'+n))+":")
	})
}

func runSuite(t *testing.T, newStore func(t *testing.T) Store) {
	for _, tc := range []struct {
		name string
		f    func(t *testing.T, r *Registry)
	}{
		{"Empty", testEmpty},
		{"CreateGetDelete", testCreateGetDelete},
		{"KeysAreUnique", testKeysAreUnique},
		{"UpdateUnderContention", testUpdateUnderContention},
		{"ConflictingApply", testConflictingApply},
		{"Watcher", testWatcher},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, NewRegistry(newStore(t), nil)) })
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func testEmpty(t *testing.T, r *Registry) {
	ctx := ctxT(t)
	v, err := r.Store().Version(ctx)
	if err != nil || v != 0 {
		t.Fatalf("Version = %d, %v; want 0", v, err)
	}
	s, err := r.Snapshot(ctx)
	if err != nil || s.Version != 0 || len(s.Tenants) != 0 {
		t.Fatalf("Snapshot = %+v, %v; want empty at 0", s, err)
	}
	if _, err := r.Get(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get = %v, want ErrNotFound", err)
	}
	if _, err := r.Delete(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Delete = %v, want ErrNotFound", err)
	}
}

func testCreateGetDelete(t *testing.T, r *Registry) {
	ctx := ctxT(t)
	_, k := NewKey(time.Now())
	in := Tenant{Name: "team-x", Limits: Limits{RPM: 5}, Keys: []Key{k}, Budget: &Budget{Period: "month", USD: 1.5}}
	got, v, err := r.Create(ctx, in)
	if err != nil || v != 1 {
		t.Fatalf("Create = %d, %v; want version 1", v, err)
	}
	if got.Created.IsZero() {
		t.Fatal("Create did not set Created")
	}
	if _, _, err := r.Create(ctx, in); !errors.Is(err, ErrExists) {
		t.Fatalf("second Create = %v, want ErrExists", err)
	}
	s, err := r.Snapshot(ctx)
	if err != nil || s.Version != 1 || len(s.Tenants) != 1 {
		t.Fatalf("Snapshot = %+v, %v", s, err)
	}
	st := s.Tenants[0]
	if st.Name != "team-x" || st.Limits.RPM != 5 || st.Budget == nil || st.Budget.USD != 1.5 || len(st.Keys) != 1 || st.Keys[0].SHA256 != k.SHA256 {
		t.Fatalf("stored %+v, want what was created", st)
	}
	v, err = r.Delete(ctx, "team-x")
	if err != nil || v != 2 {
		t.Fatalf("Delete = %d, %v; want version 2", v, err)
	}
	if _, err := r.Get(ctx, "team-x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete = %v", err)
	}
	// Its key is free again.
	if _, _, err := r.Create(ctx, Tenant{Name: "team-y", Keys: []Key{k}}); err != nil {
		t.Fatalf("Create with a deleted tenant's key: %v", err)
	}
}

func testKeysAreUnique(t *testing.T, r *Registry) {
	ctx := ctxT(t)
	_, k1 := NewKey(time.Now())
	_, k2 := NewKey(time.Now())
	if _, _, err := r.Create(ctx, Tenant{Name: "a", Keys: []Key{k1}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Create(ctx, Tenant{Name: "b", Keys: []Key{k1}}); !errors.Is(err, ErrKeyTaken) {
		t.Fatalf("Create with a's key = %v, want ErrKeyTaken", err)
	}
	if _, _, err := r.Create(ctx, Tenant{Name: "b", Keys: []Key{k2}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Update(ctx, "b", func(t *Tenant) error { t.Keys = append(t.Keys, k1); return nil }); !errors.Is(err, ErrKeyTaken) {
		t.Fatalf("adding a's key to b = %v, want ErrKeyTaken", err)
	}
	// a rotates: new key, then the old one revoked; b may then take it.
	_, k3 := NewKey(time.Now())
	if _, _, err := r.Update(ctx, "a", func(t *Tenant) error { t.Keys = append(t.Keys, k3); return nil }); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Update(ctx, "a", func(t *Tenant) error { t.Keys = t.Keys[1:]; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Update(ctx, "b", func(t *Tenant) error { t.Keys = append(t.Keys, k1); return nil }); err != nil {
		t.Fatalf("adding a's revoked key to b: %v", err)
	}
	a, _ := r.Get(ctx, "a")
	if len(a.Keys) != 1 || a.Keys[0].SHA256 != k3.SHA256 {
		t.Fatalf("a's keys = %+v, want only the new one", a.Keys)
	}
	v, _ := r.Store().Version(ctx)
	if v != 5 { // two creates, three updates; the refused changes count none
		t.Fatalf("version %d after 5 changes", v)
	}
}

func testUpdateUnderContention(t *testing.T, r *Registry) {
	ctx := ctxT(t)
	if _, _, err := r.Create(ctx, Tenant{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	const writers, each = 3, 5
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for range writers {
		wg.Go(func() {
			for range each {
				_, _, err := r.Update(ctx, "c", func(t *Tenant) error { t.Limits.RPM++; return nil })
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	c, err := r.Get(ctx, "c")
	if err != nil || c.Limits.RPM != writers*each {
		t.Fatalf("RPM = %d, %v; want %d (no update lost)", c.Limits.RPM, err, writers*each)
	}
}

func testConflictingApply(t *testing.T, r *Registry) {
	ctx := ctxT(t)
	s := r.Store()
	if _, err := s.Apply(ctx, Change{Name: "d", New: []byte(`{"name":"d","keys":[]}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, Change{Name: "d", Old: []byte(`{"name":"x"}`), New: []byte(`{"name":"d"}`)}); !errors.Is(err, ErrConflict) {
		t.Fatalf("Apply from a stale record = %v, want ErrConflict", err)
	}
	if _, err := s.Apply(ctx, Change{Name: "e", Old: []byte(`{"name":"e"}`)}); !errors.Is(err, ErrConflict) {
		t.Fatalf("Apply on a missing record = %v, want ErrConflict", err)
	}
	if v, _ := s.Version(ctx); v != 1 {
		t.Fatalf("version %d, want 1: refused changes must not count", v)
	}
}

func testWatcher(t *testing.T, r *Registry) {
	ctx := ctxT(t)
	var got []Snapshot
	w := NewWatcher(r, time.Hour, nil, func(s Snapshot) { got = append(got, s) })
	if err := w.Sync(ctx); err != nil || len(got) != 1 || got[0].Version != 0 {
		t.Fatalf("first Sync: %v, %+v", err, got)
	}
	if err := w.Sync(ctx); err != nil || len(got) != 1 {
		t.Fatalf("Sync without a change applied again: %v, %d", err, len(got))
	}
	if _, _, err := r.Create(ctx, Tenant{Name: "w"}); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(ctx); err != nil || len(got) != 2 || len(got[1].Tenants) != 1 || got[1].Tenants[0].Name != "w" {
		t.Fatalf("Sync after a change: %v, %+v", err, got)
	}
}

func TestMemoryFile(t *testing.T) {
	ctx := ctxT(t)
	path := filepath.Join(t.TempDir(), "tenants.json")
	m, err := OpenMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRegistry(m, nil)
	_, k := NewKey(time.Now())
	if _, _, err := r.Create(ctx, Tenant{Name: "p", Keys: []Key{k}, Limits: Limits{TPM: 9}}); err != nil {
		t.Fatal(err)
	}
	m2, err := OpenMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	r2 := NewRegistry(m2, nil)
	p, err := r2.Get(ctx, "p")
	if err != nil || p.Limits.TPM != 9 {
		t.Fatalf("after reopening: %+v, %v", p, err)
	}
	if v, _ := m2.Version(ctx); v != 1 {
		t.Fatalf("version %d after reopening, want 1", v)
	}
	if _, _, err := r2.Create(ctx, Tenant{Name: "q", Keys: []Key{k}}); !errors.Is(err, ErrKeyTaken) {
		t.Fatalf("the reopened store forgot p's key: %v", err)
	}
}

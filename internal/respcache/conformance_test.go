package respcache_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/respcache"
)

// harness is one backend under the conformance suite.
type harness struct {
	store respcache.Store
	// tenant is the tenant the suite stores under ("t" when empty); each
	// harness on a shared Redis gets its own.
	tenant string
	// advance makes d pass for the store's TTLs.
	advance func(t *testing.T, d time.Duration)
}

// conformanceMaxEntry is the entry bound every backend under the suite is
// built with; each is given a tenant bound of conformanceTenantBytes (8
// times it), and Memory a maxBytes of 4 times that.
const (
	conformanceMaxEntry    = 64 << 10
	conformanceTenantBytes = 8 * conformanceMaxEntry
)

// runConformance runs the behaviour every Store must share against fresh
// backends made by newHarness.
func runConformance(t *testing.T, makeHarness func(t *testing.T) harness) {
	newHarness := func(t *testing.T) harness {
		h := makeHarness(t)
		if h.tenant == "" {
			h.tenant = "t"
		}
		return h
	}
	created := time.Date(2026, 11, 29, 13, 4, 5, 123456789, time.UTC)
	jsonEntry := func() *respcache.Entry {
		return &respcache.Entry{
			Status: 200,
			Header: http.Header{
				"Content-Type":   {"application/json"},
				"Openai-Model":   {"gpt-4o-2024-08-06"},
				"X-Multi":        {"a", "", "b"},
				"Openai-Version": {"2020-10-01"},
			},
			Body:    []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`),
			Created: created,
		}
	}
	streamEntry := func() *respcache.Entry {
		return &respcache.Entry{
			Status: 200,
			Header: http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}},
			Events: [][]byte{
				[]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n"),
				[]byte(": keep-alive\r\n\r\n"),
				{},
				[]byte("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"),
				[]byte("data: [DONE]\n\n"),
			},
			Created: created,
		}
	}
	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}

	t.Run("MissOnAbsentKey", func(t *testing.T) {
		h := newHarness(t)
		e, ok, err := h.store.Get(t.Context(), h.tenant, "absent")
		if e != nil || ok || err != nil {
			t.Fatalf("Get = %v, %v, %v; want a miss", e, ok, err)
		}
	})

	t.Run("RoundTrip", func(t *testing.T) {
		for name, e := range map[string]*respcache.Entry{
			"json":                   jsonEntry(),
			"stream":                 streamEntry(),
			"empty body, not nil":    {Status: 204, Body: []byte{}},
			"no body, no events":     {Status: 200},
			"empty events, not nil":  {Status: 200, Events: [][]byte{}},
			"binary body":            {Status: 299, Body: allBytes, Header: http.Header{"": {""}, "\x00": nil}},
			"zero created":           {Status: 200, Body: []byte("{}")},
			"created before 1970":    {Status: 100, Body: []byte("1"), Created: time.Date(1601, 1, 1, 0, 0, 0, 1, time.UTC)},
			"created not in UTC":     {Status: 999, Body: []byte("2"), Created: time.Date(2030, 5, 6, 7, 8, 9, 10, time.FixedZone("x", 3600))},
			"created with monotonic": {Status: 200, Body: []byte("3"), Created: time.Now()},
		} {
			t.Run(name, func(t *testing.T) {
				h := newHarness(t)
				if err := h.store.Put(t.Context(), h.tenant, "k", e, time.Hour); err != nil {
					t.Fatalf("Put: %v", err)
				}
				got, ok, err := h.store.Get(t.Context(), h.tenant, "k")
				if err != nil || !ok {
					t.Fatalf("Get = %v, %v; want a hit", ok, err)
				}
				assertEntry(t, got, e)
			})
		}
	})

	t.Run("Overwrite", func(t *testing.T) {
		h := newHarness(t)
		if err := h.store.Put(t.Context(), h.tenant, "k", jsonEntry(), time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := h.store.Put(t.Context(), h.tenant, "k", streamEntry(), time.Hour); err != nil {
			t.Fatal(err)
		}
		got, ok, err := h.store.Get(t.Context(), h.tenant, "k")
		if err != nil || !ok {
			t.Fatalf("Get = %v, %v", ok, err)
		}
		assertEntry(t, got, streamEntry())
	})

	t.Run("KeysAreIndependent", func(t *testing.T) {
		h := newHarness(t)
		a, b := jsonEntry(), streamEntry()
		if err := h.store.Put(t.Context(), h.tenant, "a", a, time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := h.store.Put(t.Context(), h.tenant, "b", b, time.Hour); err != nil {
			t.Fatal(err)
		}
		for k, want := range map[string]*respcache.Entry{"a": a, "b": b} {
			got, ok, err := h.store.Get(t.Context(), h.tenant, k)
			if err != nil || !ok {
				t.Fatalf("Get(%s) = %v, %v", k, ok, err)
			}
			assertEntry(t, got, want)
		}
	})

	t.Run("CallerOwnsGetResult", func(t *testing.T) {
		h := newHarness(t)
		if err := h.store.Put(t.Context(), h.tenant, "j", jsonEntry(), time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := h.store.Put(t.Context(), h.tenant, "s", streamEntry(), time.Hour); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			j, _, _ := h.store.Get(t.Context(), h.tenant, "j")
			s, _, _ := h.store.Get(t.Context(), h.tenant, "s")
			if j == nil || s == nil {
				t.Fatal("miss")
			}
			j.Body[0] = 'X'
			j.Header.Set("Content-Type", "text/plain")
			j.Header.Add("X-New", "1")
			_ = append(j.Body[:1], 'Y') // must not write into shared memory
			s.Events[0][0] = 'X'
			s.Events[1] = nil
			_ = append(s.Events[0][:1], 'Y')
			j.Status, s.Created = 500, time.Time{}
		}
		j, _, _ := h.store.Get(t.Context(), h.tenant, "j")
		s, _, _ := h.store.Get(t.Context(), h.tenant, "s")
		assertEntry(t, j, jsonEntry())
		assertEntry(t, s, streamEntry())
	})

	t.Run("PutCopies", func(t *testing.T) {
		h := newHarness(t)
		j, s := jsonEntry(), streamEntry()
		if err := h.store.Put(t.Context(), h.tenant, "j", j, time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := h.store.Put(t.Context(), h.tenant, "s", s, time.Hour); err != nil {
			t.Fatal(err)
		}
		j.Body[0], s.Events[0][0] = 'X', 'X'
		j.Header.Set("Content-Type", "text/plain")
		s.Events[1] = nil
		got, _, _ := h.store.Get(t.Context(), h.tenant, "j")
		assertEntry(t, got, jsonEntry())
		got, _, _ = h.store.Get(t.Context(), h.tenant, "s")
		assertEntry(t, got, streamEntry())
	})

	t.Run("TTL", func(t *testing.T) {
		h := newHarness(t)
		if err := h.store.Put(t.Context(), h.tenant, "short", jsonEntry(), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := h.store.Put(t.Context(), h.tenant, "long", streamEntry(), time.Minute); err != nil {
			t.Fatal(err)
		}
		h.advance(t, 5*time.Second)
		if _, ok, err := h.store.Get(t.Context(), h.tenant, "short"); !ok || err != nil {
			t.Fatalf("after 5s of a 10s TTL: Get = %v, %v; want a hit", ok, err)
		}
		h.advance(t, 6*time.Second)
		if e, ok, err := h.store.Get(t.Context(), h.tenant, "short"); ok || e != nil || err != nil {
			t.Fatalf("after 11s of a 10s TTL: Get = %v, %v, %v; want a miss", e, ok, err)
		}
		if _, ok, err := h.store.Get(t.Context(), h.tenant, "long"); !ok || err != nil {
			t.Fatalf("after 11s of a 1m TTL: Get = %v, %v; want a hit", ok, err)
		}
		// A Put restarts the TTL.
		if err := h.store.Put(t.Context(), h.tenant, "long", streamEntry(), 20*time.Second); err != nil {
			t.Fatal(err)
		}
		h.advance(t, 50*time.Second) // past the first TTL
		if _, ok, err := h.store.Get(t.Context(), h.tenant, "long"); ok || err != nil {
			t.Fatalf("after 50s of a 20s TTL: Get = %v, %v; want a miss", ok, err)
		}
	})

	t.Run("InvalidPut", func(t *testing.T) {
		h := newHarness(t)
		for _, tc := range []struct {
			name string
			e    *respcache.Entry
			ttl  time.Duration
			want error
		}{
			{"nil entry", nil, time.Hour, respcache.ErrInvalidEntry},
			{"zero status", &respcache.Entry{Body: []byte("{}")}, time.Hour, respcache.ErrInvalidEntry},
			{"status 99", &respcache.Entry{Status: 99}, time.Hour, respcache.ErrInvalidEntry},
			{"status 1000", &respcache.Entry{Status: 1000}, time.Hour, respcache.ErrInvalidEntry},
			{"body and events", &respcache.Entry{Status: 200, Body: []byte("{}"), Events: [][]byte{}}, time.Hour, respcache.ErrInvalidEntry},
			{"zero ttl", jsonEntry(), 0, respcache.ErrInvalidTTL},
			{"negative ttl", jsonEntry(), -time.Second, respcache.ErrInvalidTTL},
		} {
			if err := h.store.Put(t.Context(), h.tenant, "k", tc.e, tc.ttl); !errors.Is(err, tc.want) {
				t.Errorf("%s: Put = %v, want %v", tc.name, err, tc.want)
			}
			if _, ok, _ := h.store.Get(t.Context(), h.tenant, "k"); ok {
				t.Fatalf("%s: stored", tc.name)
			}
		}
	})

	t.Run("TooLarge", func(t *testing.T) {
		h := newHarness(t)
		small := jsonEntry()
		if err := h.store.Put(t.Context(), h.tenant, "k", small, time.Hour); err != nil {
			t.Fatal(err)
		}
		big := &respcache.Entry{Status: 200, Body: bytes.Repeat([]byte("x"), conformanceMaxEntry+1)}
		if err := h.store.Put(t.Context(), h.tenant, "k", big, time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
			t.Fatalf("Put(%d bytes) = %v, want ErrTooLarge", len(big.Body), err)
		}
		manyEvents := &respcache.Entry{Status: 200, Events: make([][]byte, 0, 1024)}
		for range 1024 {
			manyEvents.Events = append(manyEvents.Events, bytes.Repeat([]byte("e"), conformanceMaxEntry/1024+1))
		}
		if err := h.store.Put(t.Context(), h.tenant, "k", manyEvents, time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
			t.Fatalf("Put(a long stream) = %v, want ErrTooLarge", err)
		}
		// A refused Put leaves the previous entry in place.
		got, ok, err := h.store.Get(t.Context(), h.tenant, "k")
		if err != nil || !ok {
			t.Fatalf("Get = %v, %v; want the earlier entry", ok, err)
		}
		assertEntry(t, got, small)
		if _, ok, _ := h.store.Get(t.Context(), h.tenant, "absent"); ok {
			t.Fatal("hit on an absent key")
		}
		// Half the bound fits.
		half := &respcache.Entry{Status: 200, Body: bytes.Repeat([]byte("x"), conformanceMaxEntry/2)}
		if err := h.store.Put(t.Context(), h.tenant, "half", half, time.Hour); err != nil {
			t.Fatalf("Put(half the bound) = %v", err)
		}
	})

	t.Run("TenantsAreApart", func(t *testing.T) {
		h := newHarness(t)
		other := h.tenant + "-2"
		if err := h.store.Put(t.Context(), h.tenant, "k", jsonEntry(), time.Hour); err != nil {
			t.Fatal(err)
		}
		if e, ok, err := h.store.Get(t.Context(), other, "k"); ok || e != nil || err != nil {
			t.Fatalf("another tenant's Get = %v, %v, %v; want a miss", e, ok, err)
		}
		if err := h.store.Put(t.Context(), other, "k", streamEntry(), time.Hour); err != nil {
			t.Fatal(err)
		}
		for tenant, want := range map[string]*respcache.Entry{h.tenant: jsonEntry(), other: streamEntry()} {
			got, ok, err := h.store.Get(t.Context(), tenant, "k")
			if err != nil || !ok {
				t.Fatalf("Get(%s) = %v, %v", tenant, ok, err)
			}
			assertEntry(t, got, want)
		}
	})

	// TenantBound: a tenant that stores more than its bound loses its
	// oldest entries (none was read: least recently used and closest to
	// expiry are the same), and nobody else's.
	t.Run("TenantBound", func(t *testing.T) {
		h := newHarness(t)
		other := h.tenant + "-2"
		if err := h.store.Put(t.Context(), other, "keep", jsonEntry(), time.Hour); err != nil {
			t.Fatal(err)
		}
		// 60 KiB each, with the key and framing: 8 fit in the bound, 9 do not.
		e := &respcache.Entry{Status: 200, Body: bytes.Repeat([]byte("x"), conformanceTenantBytes/8*15/16)}
		const n, fit = 20, 8
		for i := range n {
			if err := h.store.Put(t.Context(), h.tenant, fmt.Sprintf("k%02d", i), e, time.Hour); err != nil {
				t.Fatalf("Put(k%02d): %v", i, err)
			}
		}
		for i := range n {
			_, ok, err := h.store.Get(t.Context(), h.tenant, fmt.Sprintf("k%02d", i))
			if err != nil {
				t.Fatal(err)
			}
			if want := i >= n-fit; ok != want {
				t.Errorf("after %d puts of 60 KiB under a 512 KiB bound: k%02d kept %v, want %v", n, i, ok, want)
			}
		}
		got, ok, err := h.store.Get(t.Context(), other, "keep")
		if err != nil || !ok {
			t.Fatalf("the other tenant's entry: Get = %v, %v; want a hit", ok, err)
		}
		assertEntry(t, got, jsonEntry())
		// Over an eighth of the tenant bound is too large.
		big := &respcache.Entry{Status: 200, Body: bytes.Repeat([]byte("x"), conformanceTenantBytes/8)}
		if err := h.store.Put(t.Context(), h.tenant, "big", big, time.Hour); !errors.Is(err, respcache.ErrTooLarge) {
			t.Fatalf("Put(an eighth of the tenant bound and a key) = %v, want ErrTooLarge", err)
		}
	})
}

// assertEntry compares two entries: Created as an instant, an empty header
// like a missing one.
func assertEntry(t *testing.T, got, want *respcache.Entry) {
	t.Helper()
	if got == nil {
		t.Fatal("got nil entry")
	}
	if got.Status != want.Status {
		t.Errorf("Status = %d, want %d", got.Status, want.Status)
	}
	if len(got.Header) != 0 || len(want.Header) != 0 {
		if !reflect.DeepEqual(normHeader(got.Header), normHeader(want.Header)) {
			t.Errorf("Header = %q, want %q", got.Header, want.Header)
		}
	}
	if (got.Body == nil) != (want.Body == nil) || !bytes.Equal(got.Body, want.Body) {
		t.Errorf("Body = %q (nil %v), want %q (nil %v)", got.Body, got.Body == nil, want.Body, want.Body == nil)
	}
	if (got.Events == nil) != (want.Events == nil) || len(got.Events) != len(want.Events) {
		t.Fatalf("Events = %q (nil %v), want %q (nil %v)", got.Events, got.Events == nil, want.Events, want.Events == nil)
	}
	for i := range got.Events {
		if !bytes.Equal(got.Events[i], want.Events[i]) {
			t.Errorf("Events[%d] = %q, want %q", i, got.Events[i], want.Events[i])
		}
	}
	if !got.Created.Equal(want.Created) {
		t.Errorf("Created = %v, want %v", got.Created, want.Created)
	}
}

// normHeader maps empty value lists to nil: both mean "no values".
func normHeader(h http.Header) http.Header {
	n := make(http.Header, len(h))
	for k, vs := range h {
		if len(vs) == 0 {
			vs = nil
		}
		n[k] = vs
	}
	return n
}

package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/ratelimit"
)

// FuzzDecode feeds decode arbitrary script replies (decisions and hints):
// it never panics, and whatever it accepts is a well-formed Decision for the
// request: one status per charge (or none, for a hint) with the charge's
// scope, kind and limit; no retry-after or refusing scope on an admission; a
// refusing scope that is one of the request's; never a negative duration.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		"1 0 0 9 1000 3 0 0 60000",
		"0 2500000 2 0 6000 5 0 1 0",
		"0 -1 3 1 1 2 2 0 0",
		"0 1234 1", // a hint
		"0 9223372036854775807 9 1 2 3",
		"2 0 -1", "", "x", "1 0 0 9223372036854775807 9223372036854775807 0 0 0 0",
		"1  0\t0 1 1 1 1 1 1",
	} {
		f.Add(s, uint8(3))
	}
	f.Fuzz(func(t *testing.T, raw string, n uint8) {
		r := &ratelimit.Request{ID: "id", Lane: "dep"}
		kinds := []ratelimit.Kind{ratelimit.Requests, ratelimit.Tokens, ratelimit.Concurrency}
		for i := range int(n % 5) {
			r.Charges = append(r.Charges, ratelimit.Charge{Scope: string(rune('a' + i)), Limit: ratelimit.Limit{Kind: kinds[i%3], Limit: int64(i + 1), Window: time.Minute}, Cost: 1})
		}
		d, err := decode(r, raw)
		if err != nil {
			if fields := len(strings.Fields(raw)); fields == 3 || fields == 3+2*len(r.Charges) {
				// Only non-integers may be refused at a valid length.
				for _, x := range strings.Fields(raw) {
					if _, perr := parseInt(x); perr != nil {
						return
					}
				}
				t.Fatalf("decode(%q) = %v for a well-formed reply", raw, err)
			}
			return
		}
		if d.ID != r.ID {
			t.Fatalf("ID = %q, want %q", d.ID, r.ID)
		}
		if len(d.Limits) != 0 && len(d.Limits) != len(r.Charges) {
			t.Fatalf("%d statuses for %d charges", len(d.Limits), len(r.Charges))
		}
		for i, st := range d.Limits {
			c := r.Charges[i]
			if st.Scope != c.Scope || st.Kind != c.Limit.Kind || st.Limit != c.Limit.Limit {
				t.Fatalf("status %d = %+v for charge %+v", i, st, c)
			}
			if st.Reset < 0 {
				t.Fatalf("negative reset %v", st.Reset)
			}
		}
		if d.Allowed && (d.RetryAfter != 0 || d.DeniedBy != "" || d.DeniedKind != 0) {
			t.Fatalf("admitted with a refusal: %+v", d)
		}
		if d.RetryAfter < 0 {
			t.Fatalf("negative RetryAfter %v", d.RetryAfter)
		}
		if d.DeniedBy != "" {
			found := false
			for _, c := range r.Charges {
				found = found || (c.Scope == d.DeniedBy && c.Limit.Kind == d.DeniedKind)
			}
			if !found {
				t.Fatalf("denied by %q %v, not a charge of the request", d.DeniedBy, d.DeniedKind)
			}
		}
	})
}

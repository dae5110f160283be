package ratelimit

import (
	"slices"
	"strings"
	"testing"
)

// FuzzShardID: an ID that decodes re-encodes to itself, and every ID
// Sharded writes decodes to what it was made of, whatever bytes the groups
// and the request ID hold.
func FuzzShardID(f *testing.F) {
	f.Add("s::12:dep:key/gpt-4:9f86d081884c7d65", "dep:a", "tenant:b", "0101", "id")
	f.Add("s:0011:5:dep:a8:tenant:b:x", "a:b", "", "1", "s:0:1:x:y")
	f.Add("s:z:1:a:b", "", "", "", "")
	f.Fuzz(func(t *testing.T, id, g0, g1, index, rid string) {
		if groups, index, rid, ok := decodeShardID(id); ok {
			if got := encodeShardID(groups, index, rid); got != id {
				t.Fatalf("decode(%q) = %q %q %q, which encodes to %q", id, groups, index, rid, got)
			}
		}
		// An index of digits 0 and 1 over two groups, or none over one.
		groups := []string{g0, g1}
		index = strings.Map(func(r rune) rune { return rune('0' + r%2) }, index)
		if !strings.Contains(index, "1") {
			groups = groups[:1]
			index = strings.Repeat("0", len(index))
		}
		id = encodeShardID(groups, index, rid)
		got, gotIndex, gotRID, ok := decodeShardID(id)
		if !ok || !slices.Equal(got, groups) || gotIndex != index || gotRID != rid {
			t.Fatalf("encode(%q, %q, %q) = %q, which decodes to %q %q %q %v", groups, index, rid, id, got, gotIndex, gotRID, ok)
		}
	})
}

// TestSubActual: a part's actual costs are its charges', in order; a
// charge the caller left out is left out of its part.
func TestSubActual(t *testing.T) {
	for _, tc := range []struct {
		actual []int64
		index  string
		k      int
		want   []int64
	}{
		{[]int64{1, 2, 3, 4}, "0101", 0, []int64{1, 3}},
		{[]int64{1, 2, 3, 4}, "0101", 1, []int64{2, 4}},
		{[]int64{1, 2, 3}, "0101", 1, []int64{2}},
		{[]int64{}, "01", 0, []int64{}},
		{nil, "01", 1, nil},
		{[]int64{5, 6}, "", 0, []int64{5, 6}},
	} {
		got := subActual(tc.actual, tc.index, tc.k)
		if !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("subActual(%v, %q, %d) = %v, want %v", tc.actual, tc.index, tc.k, got, tc.want)
		}
	}
}

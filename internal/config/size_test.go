package config

import (
	"math"
	"strconv"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Size
	}{
		{"0", 0},
		{"1500", 1500},
		{"1500B", 1500},
		{"512KiB", 512 << 10},
		{"4MiB", 4 << 20},
		{"4 MiB", 4 << 20},
		{" 4mib ", 4 << 20},
		{"10MB", 10_000_000},
		{"10kb", 10_000},
		{"2GiB", 2 << 30},
		{"3GB", 3_000_000_000},
		{"1TiB", 1 << 40},
		{"8388608", 8 << 20},
		{"9223372036854775807", math.MaxInt64},
	} {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "-1MiB", "1.5MiB", "4M", "4 mebibytes", "0x10", "1e6", "9223372036854775808", "8589934592GiB", "1_000"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestSizeString(t *testing.T) {
	for _, tc := range []struct {
		in   Size
		want string
	}{
		{0, "0B"}, {1, "1B"}, {1500, "1500B"}, {KiB, "1KiB"}, {8 * MiB, "8MiB"}, {MiB + KiB, "1025KiB"},
		{3 * GiB, "3GiB"}, {10 * MB, "10000000B"}, {1 << 40, "1TiB"}, {math.MaxInt64, "9223372036854775807B"},
	} {
		if got := tc.in.String(); got != tc.want {
			t.Errorf("Size(%d).String() = %q, want %q", int64(tc.in), got, tc.want)
		}
		if back, err := ParseSize(tc.in.String()); err != nil || back != tc.in {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in.String(), back, err, int64(tc.in))
		}
	}
}

func TestSizeYAML(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Size
		ok   bool
	}{
		{"v: 1024", 1024, true},
		{"v: 0x400", 1024, true},
		{"v: 4MiB", 4 << 20, true},
		{"v: '4MiB'", 4 << 20, true},
		{"v: ~", 7, true}, // null keeps what was there
		{"v: -1", 0, false},
		{"v: 1.5", 0, false},
		{"v: true", 0, false},
		{"v: [1]", 0, false},
		{"v: 99999999999999999999", 0, false},
	} {
		var out struct {
			V Size `yaml:"v"`
		}
		out.V = 7
		err := yaml.Unmarshal([]byte(tc.in), &out)
		if (err == nil) != tc.ok || (tc.ok && out.V != tc.want) {
			t.Errorf("%s: %d, %v", tc.in, out.V, err)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"0", "4MiB", "10 MB", "512kib", "-1", "1.5GiB", "9223372036854775807", "99999999999GiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d: negative", s, n)
		}
		// What String writes, ParseSize reads back to the same size.
		if back, err := ParseSize(n.String()); err != nil || back != n {
			t.Fatalf("ParseSize(%q) = %d; String %q reads back as %d, %v", s, n, n.String(), back, err)
		}
		// A plain integer is a number of bytes.
		if i, err := strconv.ParseInt(s, 10, 64); err == nil && Size(i) != n {
			t.Fatalf("ParseSize(%q) = %d, want %d", s, n, i)
		}
	})
}

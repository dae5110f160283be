package lockbench

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(xs ...int) []time.Duration {
		out := make([]time.Duration, len(xs))
		for i, x := range xs {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 50, 7 * time.Millisecond},
		{"one p99", ms(7), 99, 7 * time.Millisecond},
		{"median of odd", ms(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		{"median of even is the lower (nearest rank)", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p99 of 100", hundred, 99, 99 * time.Millisecond},
		{"p100 is the max", hundred, 100, 100 * time.Millisecond},
		{"p1 of 100", hundred, 1, time.Millisecond},
		{"p0 is the min", hundred, 0, time.Millisecond},
		{"p99 of 10 is the max", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
		{"p90 of 10", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 90, 9 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
			}
		})
	}
}

func TestJain(t *testing.T) {
	tests := []struct {
		name   string
		counts []int64
		want   float64
	}{
		{"empty", nil, 0},
		{"all zero", []int64{0, 0, 0}, 0},
		{"single worker", []int64{42}, 1},
		{"equal", []int64{10, 10, 10, 10}, 1},
		{"one has everything", []int64{100, 0, 0, 0}, 0.25},
		{"two of four share", []int64{5, 5, 0, 0}, 0.5},
		// (1+2+3+4)^2 / (4 * (1+4+9+16)) = 100/120
		{"ramp", []int64{1, 2, 3, 4}, 100.0 / 120},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Jain(tt.counts); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("Jain(%v) = %v, want %v", tt.counts, got, tt.want)
			}
		})
	}
}

func TestSelfReacquire(t *testing.T) {
	tests := []struct {
		name    string
		holders []int
		want    float64
	}{
		{"empty", nil, 0},
		{"first has no predecessor", []int{3}, 0},
		{"round robin", []int{0, 1, 2, 0, 1, 2}, 0},
		{"one worker keeps it", []int{5, 5, 5, 5}, 75},
		{"mixed", []int{0, 0, 1, 1, 0, 2, 2, 2}, 50}, // 4 of 8
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SelfReacquirePct(tt.holders); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("SelfReacquirePct(%v) = %v, want %v", tt.holders, got, tt.want)
			}
			// The harness counts the same thing online, per key.
			ks := newKeyStates(1)
			var self int64
			for i, w := range tt.holders {
				s, overlap := ks[0].enter(w)
				if overlap {
					t.Fatalf("acquisition %d reported an overlap", i)
				}
				if s {
					self++
				}
				if ks[0].leave(int64(i)) {
					t.Fatalf("release %d reported an overlap", i)
				}
			}
			if got := pct(self, int64(len(tt.holders))); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("keyState counted %v%% self-reacquisitions, want %v", got, tt.want)
			}
		})
	}
}

func TestKeyStateDetectsOverlap(t *testing.T) {
	ks := newKeyStates(1)
	if _, overlap := ks[0].enter(0); overlap {
		t.Fatal("first holder saw an overlap")
	}
	if _, overlap := ks[0].enter(1); !overlap {
		t.Error("second concurrent holder saw no overlap")
	}
	if !ks[0].leave(1) {
		t.Error("a holder leaving while another is inside saw no overlap")
	}
	if ks[0].leave(2) {
		t.Error("the last holder leaving alone saw an overlap")
	}
}

func TestSummarize(t *testing.T) {
	s := summarize([]time.Duration{5, 1, 4, 2, 3})
	if s.n != 5 || s.p50 != 3 || s.p99 != 5 || s.max != 5 {
		t.Errorf("summarize = %+v", s)
	}
	if got := us(1234567 * time.Nanosecond); got != 1234.6 {
		t.Errorf("us(1234567ns) = %v, want 1234.6", got)
	}
}

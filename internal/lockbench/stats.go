package lockbench

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, which must be in ascending order; 0 for an empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Jain returns Jain's fairness index (Σx)² / (n·Σx²) of counts: 1 when every
// count is equal, 1/n when one entry has everything. It is 0 when counts is
// empty or all zero.
func Jain(counts []int64) float64 {
	var sum, sq float64
	for _, c := range counts {
		x := float64(c)
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(counts)) * sq)
}

// SelfReacquirePct returns, for a sequence of holders of one key in
// acquisition order, the percentage of acquisitions whose holder was also the
// previous holder. The first acquisition has no previous holder and counts
// as a change.
func SelfReacquirePct(holders []int) float64 {
	if len(holders) == 0 {
		return 0
	}
	self := 0
	for i := 1; i < len(holders); i++ {
		if holders[i] == holders[i-1] {
			self++
		}
	}
	return pct(int64(self), int64(len(holders)))
}

func pct(part, whole int64) float64 {
	if whole == 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// summary holds the order statistics of one set of samples.
type summary struct {
	n             int
	p50, p99, max time.Duration
}

func summarize(samples []time.Duration) summary {
	slices.Sort(samples)
	s := summary{n: len(samples), p50: Percentile(samples, 50), p99: Percentile(samples, 99)}
	if len(samples) > 0 {
		s.max = samples[len(samples)-1]
	}
	return s
}

// us converts d to microseconds rounded to 0.1.
func us(d time.Duration) float64 {
	return math.Round(float64(d)/100) / 10
}

func round(x float64, places int) float64 {
	f := math.Pow(10, float64(places))
	return math.Round(x*f) / f
}

package e2eutil

import (
	"testing"
	"time"
)

// CheckBucketBound fails the test if some window [arrivals[i],
// arrivals[j]] holds more arrivals than a token bucket of size burst
// refilling at perSec admits: burst + perSec × the window's length. One
// arrival of slack covers the time between the recording and the
// provider's own clock reading.
func CheckBucketBound(t testing.TB, arrivals []time.Time, burst, perSec float64) {
	t.Helper()
	worst, worstI, worstJ := -1e18, 0, 0
	for i := range arrivals {
		for j := i; j < len(arrivals); j++ {
			n := float64(j - i + 1)
			allowed := burst + perSec*arrivals[j].Sub(arrivals[i]).Seconds()
			if n-allowed > worst {
				worst, worstI, worstJ = n-allowed, i, j
			}
		}
	}
	if len(arrivals) == 0 {
		return
	}
	span := arrivals[worstJ].Sub(arrivals[worstI])
	t.Logf("tightest window: %d arrivals in %v (the bucket allows %.1f)", worstJ-worstI+1, span.Round(time.Millisecond),
		burst+perSec*span.Seconds())
	if worst > 1 {
		t.Errorf("%d requests reached the provider within %v; a bucket of %.0f refilling at %.1f/s allows %.1f",
			worstJ-worstI+1, span, burst, perSec, burst+perSec*span.Seconds())
	}
}

package provider

import (
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	for _, tc := range []struct {
		in                    Config
		floor, ceil, base, mx time.Duration
	}{
		{Config{}, DefaultTimeoutFloor, DefaultTimeoutCeiling, DefaultBackoffBase, DefaultBackoffMax},
		{Config{TimeoutCeiling: 2 * time.Second}, 2 * time.Second, 2 * time.Second, DefaultBackoffBase, DefaultBackoffMax},
		{Config{TimeoutCeiling: time.Hour}, DefaultTimeoutFloor, time.Hour, DefaultBackoffBase, DefaultBackoffMax},
		{Config{TimeoutFloor: time.Hour}, time.Hour, time.Hour, DefaultBackoffBase, DefaultBackoffMax},
		{Config{TimeoutFloor: time.Second}, time.Second, DefaultTimeoutCeiling, DefaultBackoffBase, DefaultBackoffMax},
		{Config{BackoffBase: time.Minute}, DefaultTimeoutFloor, DefaultTimeoutCeiling, time.Minute, time.Minute},
		{Config{BackoffMax: time.Second}, DefaultTimeoutFloor, DefaultTimeoutCeiling, DefaultBackoffBase, time.Second},
	} {
		if err := tc.in.Validate(); err != nil {
			t.Fatalf("%+v: %v", tc.in, err)
		}
		c := tc.in.withDefaults()
		if c.TimeoutFloor != tc.floor || c.TimeoutCeiling != tc.ceil || c.BackoffBase != tc.base || c.BackoffMax != tc.mx {
			t.Errorf("%+v: floor %v ceiling %v base %v max %v; want %v %v %v %v", tc.in,
				c.TimeoutFloor, c.TimeoutCeiling, c.BackoffBase, c.BackoffMax, tc.floor, tc.ceil, tc.base, tc.mx)
		}
		if c.MaxAttempts != DefaultMaxAttempts || c.BreakerFailures != DefaultBreakerFailures || c.TimeoutMultiplier != DefaultTimeoutMultiplier ||
			c.Clock == nil || c.Rand == nil || c.Logger == nil || c.Transport == nil || c.MaxRetryWait != DefaultMaxRetryWait {
			t.Errorf("%+v: defaults missing: %+v", tc.in, c)
		}
	}
}

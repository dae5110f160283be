package dedup_test

import (
	"errors"
	"testing"
	"time"

	"github.com/llmgate/llmgate/dedup"
)

func TestOptionsDefaults(t *testing.T) {
	o := dedup.Options{}.WithDefaults()
	want := dedup.Options{LeaseTTL: dedup.DefaultLeaseTTL, Retain: dedup.DefaultRetain, MaxBytes: dedup.DefaultMaxBytes, MaxFrames: dedup.DefaultMaxFrames}
	if o != want {
		t.Fatalf("WithDefaults() = %+v, want %+v", o, want)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	set := dedup.Options{LeaseTTL: time.Second, Retain: time.Minute, MaxBytes: 5, MaxFrames: 6}
	if got := set.WithDefaults(); got != set {
		t.Fatalf("WithDefaults changed set fields: %+v", got)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []dedup.Options{
		{LeaseTTL: dedup.MinLeaseTTL - 1, Retain: time.Second, MaxBytes: 1, MaxFrames: 1},
		{LeaseTTL: time.Second, Retain: dedup.MinRetain - 1, MaxBytes: 1, MaxFrames: 1},
		{LeaseTTL: time.Second, Retain: time.Second, MaxBytes: 0, MaxFrames: 1},
		{LeaseTTL: time.Second, Retain: time.Second, MaxBytes: 1, MaxFrames: 0},
	} {
		if err := o.Validate(); !errors.Is(err, dedup.ErrInvalid) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalid", o, err)
		}
	}
}

func TestNilBackend(t *testing.T) {
	g := dedup.New(nil, dedup.Options{})
	if _, _, err := g.Join(t.Context(), "k", "fp", 0); !errors.Is(err, dedup.ErrInvalid) {
		t.Fatalf("Join on a nil Backend = %v, want ErrInvalid", err)
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[dedup.State]string{dedup.StateNone: "none", dedup.StateRunning: "running", dedup.StateFinished: "finished", 9: "invalid"} {
		if s.String() != want {
			t.Errorf("State(%d).String() = %q, want %q", s, s.String(), want)
		}
	}
}

package budget_test

import (
	"errors"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
)

func TestWindow(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		p          budget.Period
		at         time.Time
		loc        *time.Location
		id         string
		start, end time.Time
	}{
		{"day UTC", budget.Day, time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC), nil, "2026-11-29",
			time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)},
		{"month UTC, last instant", budget.Month, time.Date(2026, 11, 30, 23, 59, 59, 999999999, time.UTC), time.UTC, "2026-11",
			time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{"month rolls over the year", budget.Month, time.Date(2026, 12, 31, 12, 0, 0, 0, time.UTC), nil, "2026-12",
			time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"month in New York from a UTC instant", budget.Month, time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC), ny, "2026-11",
			time.Date(2026, 11, 1, 0, 0, 0, 0, ny), time.Date(2026, 12, 1, 0, 0, 0, 0, ny)},
		{"day in Tokyo ahead of UTC", budget.Day, time.Date(2026, 11, 29, 16, 0, 0, 0, time.UTC), tokyo, "2026-11-30",
			time.Date(2026, 11, 30, 0, 0, 0, 0, tokyo), time.Date(2026, 12, 1, 0, 0, 0, 0, tokyo)},
		{"23-hour day (DST starts)", budget.Day, time.Date(2026, 3, 8, 12, 0, 0, 0, ny), ny, "2026-03-08",
			time.Date(2026, 3, 8, 0, 0, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny)},
		{"February of a leap year", budget.Month, time.Date(2028, 2, 29, 12, 0, 0, 0, time.UTC), nil, "2028-02",
			time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := tc.p.Window(tc.at, tc.loc)
			if err != nil {
				t.Fatal(err)
			}
			if w.ID != tc.id || !w.Start.Equal(tc.start) || !w.End.Equal(tc.end) || w.Period != tc.p {
				t.Fatalf("Window = %+v, want %s [%v, %v)", w, tc.id, tc.start, tc.end)
			}
			if tc.at.Before(w.Start) || !tc.at.Before(w.End) {
				t.Fatalf("%v is not inside its window [%v, %v)", tc.at, w.Start, w.End)
			}
		})
	}
	dst, _ := budget.Day.Window(time.Date(2026, 3, 8, 12, 0, 0, 0, ny), ny)
	if d := dst.End.Sub(dst.Start); d != 23*time.Hour {
		t.Fatalf("DST start day lasts %v, want 23h", d)
	}
	if _, err := budget.Period("week").Window(time.Now(), nil); !errors.Is(err, budget.ErrInvalid) {
		t.Fatalf("week window: %v, want ErrInvalid", err)
	}
}

func TestParsePeriod(t *testing.T) {
	for in, want := range map[string]budget.Period{"day": budget.Day, " Daily ": budget.Day, "MONTH": budget.Month, "monthly": budget.Month} {
		if got, err := budget.ParsePeriod(in); err != nil || got != want {
			t.Errorf("ParsePeriod(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "week", "days", "1d"} {
		if _, err := budget.ParsePeriod(in); !errors.Is(err, budget.ErrInvalid) {
			t.Errorf("ParsePeriod(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

func TestParseWindowID(t *testing.T) {
	for in, want := range map[string]budget.Period{"2026-11": budget.Month, "2026-11-29": budget.Day, "2028-02-29": budget.Day} {
		if got, err := budget.ParseWindowID(in); err != nil || got != want {
			t.Errorf("ParseWindowID(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "2026", "2026-13", "2026-1-01", "2026-02-30", "2027-02-29", "2026/11", "2026-11-29T00", " 2026-11"} {
		if _, err := budget.ParseWindowID(in); !errors.Is(err, budget.ErrInvalid) {
			t.Errorf("ParseWindowID(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

func FuzzParsePeriod(f *testing.F) {
	for _, s := range []string{"day", "month", " Monthly", "week", "", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := budget.ParsePeriod(s)
		if err != nil {
			if !errors.Is(err, budget.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("ParsePeriod(%q) = %q, which does not validate: %v", s, p, err)
		}
		if _, err := p.Window(time.Now(), nil); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzParseWindowID(f *testing.F) {
	for _, s := range []string{"2026-11", "2026-11-29", "2026-13", "0000-01", "9999-12-31", "", "2026-02-29"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := budget.ParseWindowID(s)
		if err != nil {
			if !errors.Is(err, budget.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		// A valid ID is the ID of the window that starts at it.
		layout := map[budget.Period]string{budget.Day: "2006-01-02", budget.Month: "2006-01"}[p]
		start, err := time.Parse(layout, s)
		if err != nil {
			t.Fatalf("accepted %q, which does not parse as %s: %v", s, layout, err)
		}
		w, err := p.Window(start, time.UTC)
		if err != nil || w.ID != s || !w.Start.Equal(start) {
			t.Fatalf("window of %q is %+v, %v", s, w, err)
		}
	})
}

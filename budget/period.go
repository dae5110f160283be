package budget

import (
	"fmt"
	"strings"
	"time"
)

// Period is the length of a budget's calendar window.
type Period string

// The periods a budget can have.
const (
	// Day runs from local midnight to the next local midnight.
	Day Period = "day"
	// Month runs from local midnight on the 1st to the 1st of the next month.
	Month Period = "month"
)

// Layouts of window IDs.
const (
	dayLayout   = "2006-01-02"
	monthLayout = "2006-01"
)

// ParsePeriod reads a period name as written in configuration: "day" or
// "month" (also "daily" and "monthly"), in any case, surrounding spaces
// ignored.
func ParsePeriod(s string) (Period, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "day", "daily":
		return Day, nil
	case "month", "monthly":
		return Month, nil
	}
	return "", fmt.Errorf("%w: period %q: want day or month", ErrInvalid, truncate(s, 40))
}

// Validate reports whether p is Day or Month.
func (p Period) Validate() error {
	switch p {
	case Day, Month:
		return nil
	case "":
		return fmt.Errorf("%w: period is empty: set it to day or month", ErrInvalid)
	}
	return fmt.Errorf("%w: period %q: want day or month", ErrInvalid, truncate(string(p), 40))
}

// Window is one calendar period: the span a budget's spend accumulates over
// before it starts again from zero.
type Window struct {
	// Period is the window's length.
	Period Period
	// ID names the window: "2026-11" for a month, "2026-11-29" for a day,
	// in the window's time zone.
	ID string
	// Start is the window's first instant.
	Start time.Time
	// End is the first instant after the window: when spend resets.
	End time.Time
}

// Window returns the window of p that contains t, calendar-aligned in loc
// (nil means UTC).
func (p Period) Window(t time.Time, loc *time.Location) (Window, error) {
	if err := p.Validate(); err != nil {
		return Window{}, err
	}
	if loc == nil {
		loc = time.UTC
	}
	t = t.In(loc)
	y, m, d := t.Date()
	switch p {
	case Day:
		start := time.Date(y, m, d, 0, 0, 0, 0, loc)
		return Window{Period: p, ID: start.Format(dayLayout), Start: start, End: time.Date(y, m, d+1, 0, 0, 0, 0, loc)}, nil
	default: // Month
		start := time.Date(y, m, 1, 0, 0, 0, 0, loc)
		return Window{Period: p, ID: start.Format(monthLayout), Start: start, End: time.Date(y, m+1, 1, 0, 0, 0, 0, loc)}, nil
	}
}

// ParseWindowID reads a window ID ("2026-11" or "2026-11-29") and returns
// the period it names.
func ParseWindowID(id string) (Period, error) {
	var layout string
	var p Period
	switch len(id) {
	case len(monthLayout):
		layout, p = monthLayout, Month
	case len(dayLayout):
		layout, p = dayLayout, Day
	default:
		return "", fmt.Errorf("%w: window ID %q: want YYYY-MM or YYYY-MM-DD", ErrInvalid, truncate(id, 40))
	}
	t, err := time.Parse(layout, id)
	if err != nil || t.Format(layout) != id {
		return "", fmt.Errorf("%w: window ID %q: want YYYY-MM or YYYY-MM-DD", ErrInvalid, truncate(id, 40))
	}
	return p, nil
}

// truncate shortens s for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Size is a number of bytes. In YAML it is an integer (bytes) or a string
// with a unit: "512KiB", "8MiB", "10MB", "1GiB".
type Size int64

// Binary and decimal size units.
const (
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
	KB  Size = 1e3
	MB  Size = 1e6
	GB  Size = 1e9
)

// sizeUnits are the accepted unit suffixes, lowercased.
var sizeUnits = map[string]Size{
	"": 1, "b": 1,
	"kb": KB, "mb": MB, "gb": GB, "tb": 1e12,
	"kib": KiB, "mib": MiB, "gib": GiB, "tib": 1 << 40,
}

// errSizeSyntax is what every unparsable size says.
var errSizeSyntax = errors.New("want a whole number of bytes, optionally with a unit: B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024), e.g. 8MiB")

// ParseSize reads a size: decimal digits, then an optional unit (B, KB, MB,
// GB, TB, KiB, MiB, GiB, TiB, any case), with optional spaces around and
// between. Fractions and negative sizes are refused.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		if strings.HasPrefix(t, "-") {
			return 0, fmt.Errorf("size %s is negative; %w", quote(s), errSizeSyntax)
		}
		return 0, fmt.Errorf("size %s: %w", quote(s), errSizeSyntax)
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %s is too large", quote(s))
	}
	unit, ok := sizeUnits[strings.ToLower(strings.TrimSpace(t[i:]))]
	if !ok {
		return 0, fmt.Errorf("size %s: %w", quote(s), errSizeSyntax)
	}
	if n > math.MaxInt64/int64(unit) {
		return 0, fmt.Errorf("size %s is too large", quote(s))
	}
	return Size(n) * unit, nil
}

// String renders s in the largest binary unit that divides it ("8MiB"),
// else in bytes ("1500B"); ParseSize reads it back.
func (s Size) String() string {
	for _, u := range []struct {
		n    Size
		name string
	}{{1 << 40, "TiB"}, {GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}} {
		if s != 0 && s%u.n == 0 {
			return strconv.FormatInt(int64(s/u.n), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}

// UnmarshalYAML reads an integer number of bytes or a string for ParseSize.
// Errors are *yaml.TypeError so that the decoder reports them with the
// others, by line.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	bad := func(msg string) error {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s", n.Line, msg)}}
	}
	if n.Kind != yaml.ScalarNode {
		return bad(errSizeSyntax.Error())
	}
	switch n.ShortTag() {
	case "!!null":
		return nil
	case "!!int":
		var v int64
		if err := n.Decode(&v); err != nil {
			return bad("size " + quote(n.Value) + " is too large")
		}
		if v < 0 {
			return bad(fmt.Sprintf("size %d is negative; %v", v, errSizeSyntax))
		}
		*s = Size(v)
		return nil
	case "!!str":
		v, err := ParseSize(n.Value)
		if err != nil {
			return bad(err.Error())
		}
		*s = v
		return nil
	}
	return bad("size " + quote(n.Value) + ": " + errSizeSyntax.Error())
}

// quote quotes a value from the configuration for a message, cut to a
// readable length.
func quote(s string) string {
	const maxLen = 64
	if len(s) > maxLen {
		s = s[:maxLen] + "..."
	}
	return strconv.Quote(s)
}

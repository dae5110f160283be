package scenario

import (
	"errors"
	"strings"
	"testing"
)

// TestBuiltins: every embedded scenario loads, validates, is listed with
// its description, and its source is what --show prints.
func TestBuiltins(t *testing.T) {
	list := List()
	if len(list) != len(order) {
		t.Fatalf("List() has %d scenarios; want the %d documented: %v", len(list), len(order), order)
	}
	for i, b := range list {
		if b.Name != order[i] {
			t.Errorf("List()[%d] = %q; want %q", i, b.Name, order[i])
		}
		if b.Description == "" {
			t.Errorf("%s has no description", b.Name)
		}
		s, err := Load(b.Name)
		if err != nil {
			t.Fatalf("Load(%q): %v", b.Name, err)
		}
		if s.Name != b.Name {
			t.Errorf("%s.yaml names itself %q", b.Name, s.Name)
		}
		if s.Duration > MaxDuration {
			t.Errorf("%s runs %v per arm; at most %v", b.Name, s.Duration, MaxDuration)
		}
		src, err := Source(b.Name)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse("copy.yaml", src)
		if err != nil || again.Name != s.Name {
			t.Errorf("the source of %s does not parse back: %v", b.Name, err)
		}
	}
}

// TestParseErrors: bad files get an error that says where and what to do.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		is         error
		want       string
	}{
		{"empty", "", ErrSyntax, "empty"},
		{"unknown key", "name: x\nclients: {callers: 1}\nbogus: 1\n", ErrSyntax, "field bogus not found"},
		{"wrong type", "name: x\nclients: {callers: many}\n", ErrSyntax, "line 2"},
		{"two documents", "name: x\nclients: {callers: 1}\n---\nname: y\n", ErrSyntax, "more than one"},
		{"no callers", "name: x\n", ErrInvalid, "clients.callers"},
		{"bad name", "name: X Y\nclients: {callers: 1}\n", ErrInvalid, "name:"},
		{"too long", "name: x\nduration: 2m\nclients: {callers: 1}\n", ErrInvalid, "duration"},
		{"unknown model in mix", "name: x\nclients: {callers: 1, mix: [{model: nope}]}\n", ErrInvalid, "not one of provider.models"},
		{"bad priority", "name: x\nclients: {callers: 1, mix: [{model: gpt-4.1, priority: urgent}]}\n", ErrInvalid, "interactive or batch"},
		{"bad share", "name: x\nclients: {callers: 1}\nconversations: {sessions: 1, duplicate_share: 0.9}\n", ErrInvalid, "duplicate_share"},
		{"outage past the end", "name: x\nprovider: {outage: {start: 50s, length: 20s}}\nclients: {callers: 1}\n", ErrInvalid, "outage"},
		{"fallback lacks a model", "name: x\nprovider: {models: [{name: a}, {name: b}]}\nfallback: {models: [{name: a}]}\nclients: {callers: 1}\n", ErrInvalid, `lacks "b"`},
		{"empty budget", "name: x\ngateway: {budget: {}}\nclients: {callers: 1}\n", ErrInvalid, "gateway.budget"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("my.yaml", []byte(tc.yaml))
			if !errors.Is(err, tc.is) {
				t.Fatalf("Parse = %v; want %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "my.yaml") {
				t.Errorf("error %q does not name the file and say %q", err, tc.want)
			}
		})
	}
}

// TestUnknownBuiltin names the built-ins.
func TestUnknownBuiltin(t *testing.T) {
	for _, name := range []string{"nope", "../burst", "Burst", ""} {
		_, err := Load(name)
		if !errors.Is(err, ErrUnknown) || !strings.Contains(err.Error(), "burst, duplicates") {
			t.Errorf("Load(%q) = %v; want ErrUnknown listing the built-ins", name, err)
		}
	}
}

// TestDefaults: the gateway's max wait leaves time for the longest answer
// before the client's deadline.
func TestDefaults(t *testing.T) {
	s, err := Parse("d.yaml", []byte("name: d\nprovider: {ttft: 1s}\nclients: {callers: 2, deadline: 10s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Gateway.MaxWait != 8*1e9 {
		t.Errorf("max wait %v; want 8s (10s deadline less a 1s answer and 1s)", s.Gateway.MaxWait)
	}
	if s.Duration != DefaultDuration || s.Seed != 1 || s.Replicas != 1 || len(s.Clients.Mix) != 1 || s.Clients.Mix[0].Model != DefaultModel {
		t.Errorf("defaults not filled: %+v", s)
	}
}

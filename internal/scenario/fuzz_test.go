package scenario

import (
	"errors"
	"testing"
)

// FuzzParse: no input panics, every error is ErrSyntax or ErrInvalid, and
// what parses is within the bounds.
func FuzzParse(f *testing.F) {
	for _, b := range List() {
		src, _ := Source(b.Name)
		f.Add(src)
	}
	f.Add([]byte("name: x\nclients: {callers: 1}\n"))
	f.Add([]byte("name: x\nclients: {callers: 1}\nconversations: {sessions: 2, turns: 3}\n"))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err != nil {
			if !errors.Is(err, ErrSyntax) && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is neither ErrSyntax nor ErrInvalid", err)
			}
			return
		}
		if s.Duration <= 0 || s.Duration > MaxDuration || s.Clients.Callers < 1 || s.Clients.Callers > MaxCallers || s.Clients.Deadline <= 0 {
			t.Fatalf("out of bounds: %+v", s)
		}
	})
}

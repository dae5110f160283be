package respcache

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestSpecial8 checks the eight-bytes-at-a-time scan against the byte
// table: every byte value at every position, among plain and random bytes.
func TestSpecial8(t *testing.T) {
	want := func(b []byte) bool {
		for _, x := range b {
			if !plain[x] {
				return true
			}
		}
		return false
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var b [8]byte
	for fill := range 3 {
		for pos := range 8 {
			for v := range 256 {
				for i := range b {
					switch fill {
					case 0:
						b[i] = 'a'
					case 1:
						b[i] = byte(0x20 + rng.IntN(0x60)) // printable ASCII and DEL
					default:
						b[i] = byte(rng.IntN(256))
					}
				}
				b[pos] = byte(v)
				if got := special8(binary.LittleEndian.Uint64(b[:])); got != want(b[:]) {
					t.Fatalf("special8(%q) = %v, want %v", b, got, want(b[:]))
				}
			}
		}
	}
}

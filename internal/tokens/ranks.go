package tokens

import (
	"bytes"
	"hash/maphash"
)

// rankTable maps a token's bytes to its rank (its ID) without a pointer
// the garbage collector has to follow: the tokens sit in one byte array
// and the index is open addressing over uint32s. As a map[string]uint32
// the 300,000 tokens of both encodings were as many heap strings, marked
// again in every GC cycle of the process (about 7 % of the gateway's CPU
// under load); this way a cycle skips them.
type rankTable struct {
	data  []byte   // every token's bytes, in ID order
	offs  []uint32 // token id is data[offs[id]:offs[id+1]] (empty: no such ID)
	slots []uint32 // id+1 of the token hashed there, 0 if free; len a power of two
	seed  maphash.Seed
}

// indexRanks returns the table of the tokens data[offs[id]:offs[id+1]]. A
// token repeated keeps its lowest ID.
func indexRanks(data []byte, offs []uint32) *rankTable {
	n := 0
	for id := range len(offs) - 1 {
		if offs[id+1] > offs[id] {
			n++
		}
	}
	nslots := 1
	for nslots < 2*n { // load factor at most 1/2: short probes
		nslots <<= 1
	}
	t := &rankTable{data: data, offs: offs, slots: make([]uint32, nslots), seed: maphash.MakeSeed()}
	mask := uint64(nslots - 1)
	for id := range len(offs) - 1 {
		tok := data[offs[id]:offs[id+1]]
		if len(tok) == 0 {
			continue
		}
		for i := maphash.Bytes(t.seed, tok) & mask; ; i = (i + 1) & mask {
			v := t.slots[i]
			if v == 0 {
				t.slots[i] = uint32(id) + 1
				break
			}
			if bytes.Equal(t.token(v-1), tok) {
				break // a repeat: the lower ID stays
			}
		}
	}
	return t
}

// rank returns the rank of the token s, if s is one.
func (t *rankTable) rank(s string) (uint32, bool) {
	mask := uint64(len(t.slots) - 1)
	for i := maphash.String(t.seed, s) & mask; ; i = (i + 1) & mask {
		v := t.slots[i]
		if v == 0 {
			return 0, false
		}
		if id := v - 1; string(t.token(id)) == s { // compared in place, not copied
			return id, true
		}
	}
}

func (t *rankTable) token(id uint32) []byte { return t.data[t.offs[id]:t.offs[id+1]] }

package tokens

import (
	"math"
	"unicode/utf8"
)

// counter counts tokens with a hand-written pre-tokenizer (split.go) and a
// byte-pair merge over the encoding's ranks (vocab.go).
type counter struct {
	split func(s string, p int) int
	ranks *rankTable
}

// longPiece is the piece length, in bytes, from which the merge keeps its
// candidates in a heap (O(n log n)) instead of scanning for the lowest rank
// (O(n^2), faster for short pieces).
const longPiece = 96

// count returns the tokens of s. It differs from the codec's Count only
// where the codec's generated matcher cuts text elsewhere than OpenAI's
// expressions do (split_test.go).
func (k *counter) count(s string) int {
	s = validText(s)
	n := 0
	for p := 0; p < len(s); {
		end := k.split(s, p)
		n += k.pieceTokens(s[p:end])
		p = end
	}
	return n
}

// pieceTokens merges one piece.
func (k *counter) pieceTokens(piece string) int {
	if len(piece) == 1 {
		return 1
	}
	if _, ok := k.ranks.rank(piece); ok {
		return 1
	}
	if len(piece) >= longPiece {
		return k.longPieceTokens(piece)
	}
	// The leftmost pair of lowest rank merges first, until none has a
	// rank: parts[i] is the start of a part, rank[i] that of it merged
	// with the next part (math.MaxUint32 if that is no token).
	var partBuf [longPiece + 1]int32
	var rankBuf [longPiece + 1]uint32
	parts, rank := partBuf[:len(piece)+1], rankBuf[:len(piece)+1]
	for i := range parts {
		parts[i] = int32(i)
	}
	pair := func(i int) uint32 {
		if i+2 >= len(parts) {
			return math.MaxUint32
		}
		if r, ok := k.ranks.rank(piece[parts[i]:parts[i+2]]); ok {
			return r
		}
		return math.MaxUint32
	}
	for i := range rank {
		rank[i] = pair(i)
	}
	for len(parts) > 2 {
		best, bestRank := -1, uint32(math.MaxUint32)
		for i, r := range rank[:len(parts)-2] {
			if r < bestRank {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			break
		}
		parts = append(parts[:best+1], parts[best+2:]...)
		rank = append(rank[:best+1], rank[best+2:]...)
		rank[best] = pair(best)
		if best > 0 {
			rank[best-1] = pair(best - 1)
		}
	}
	return len(parts) - 1
}

// longPieceTokens is pieceTokens for long pieces: the same merges, in the
// same order (lowest rank, then leftmost), over a linked list of parts
// with the candidate pairs in a min-heap. A candidate whose pair changed
// since it was pushed is skipped when it comes up.
func (k *counter) longPieceTokens(piece string) int {
	n := int32(len(piece))
	next := make([]int32, n+1) // next[i]: start of the part after the one at i; -1 after the last
	prev := make([]int32, n+1)
	rank := make([]uint32, n+1) // rank of the part at i merged with the next one
	for i := range next {
		next[i], prev[i], rank[i] = int32(i)+1, int32(i)-1, math.MaxUint32
	}
	next[n] = -1
	pairRank := func(i int32) uint32 {
		j := next[i]
		if j < 0 || next[j] < 0 {
			return math.MaxUint32
		}
		if r, ok := k.ranks.rank(piece[i:next[j]]); ok {
			return r
		}
		return math.MaxUint32
	}
	h := make(mergeHeap, 0, n)
	for i := int32(0); i+2 <= n; i++ {
		if rank[i] = pairRank(i); rank[i] != math.MaxUint32 {
			h = append(h, mergeCandidate{rank[i], i})
		}
	}
	h.init()
	parts := int(n)
	for len(h) > 0 {
		c := h.pop()
		if rank[c.at] != c.rank {
			continue // stale: the part changed after this was pushed
		}
		i := c.at
		j := next[i]
		rank[j] = math.MaxUint32 // j is merged into i
		next[i] = next[j]
		if next[i] >= 0 {
			prev[next[i]] = i
		}
		parts--
		for _, b := range [2]int32{i, prev[i]} {
			if b >= 0 {
				if rank[b] = pairRank(b); rank[b] != math.MaxUint32 {
					h.push(mergeCandidate{rank[b], b})
				}
			}
		}
	}
	return parts
}

// mergeCandidate is a pair that can merge: the part at at with the next.
type mergeCandidate struct {
	rank uint32
	at   int32
}

// mergeHeap is a binary min-heap by rank, then position, so that of pairs
// of equal rank the leftmost merges first.
type mergeHeap []mergeCandidate

func (h mergeHeap) less(a, b int) bool {
	return h[a].rank < h[b].rank || h[a].rank == h[b].rank && h[a].at < h[b].at
}

func (h mergeHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *mergeHeap) push(c mergeCandidate) {
	*h = append(*h, c)
	for i := len(*h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			break
		}
		(*h)[i], (*h)[parent] = (*h)[parent], (*h)[i]
		i = parent
	}
}

func (h *mergeHeap) pop() mergeCandidate {
	old := *h
	top := old[0]
	last := len(old) - 1
	old[0] = old[last]
	*h = old[:last]
	h.down(0)
	return top
}

func (h mergeHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// validText returns s with every byte that is not part of valid UTF-8
// replaced by U+FFFD, as the codec's regular expression engine reads it
// (one replacement per byte, unlike strings.ToValidUTF8).
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+16)
	for _, r := range s {
		b = utf8.AppendRune(b, r) // invalid bytes range as RuneError, one at a time
	}
	return string(b)
}

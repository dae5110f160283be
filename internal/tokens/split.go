package tokens

import (
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizers: text is cut into pieces before the BPE runs on each.
// OpenAI defines the cut with one regular expression per encoding; the
// dependency runs it through a backtracking engine, which costs more than
// the BPE itself. These functions cut at the same places by hand, from the
// same Unicode classes (the engine's \s is unicode.IsSpace, \p{..} the
// unicode tables, and (?i) lowers the text with unicode.ToLower). Each
// returns the end of the piece that starts at s[p:]; s must be valid UTF-8
// (the engine reads invalid bytes as U+FFFD: see validText). FuzzSplit
// checks them against the expressions.
//
// o200k_base:
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// cl100k_base:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+

// class is what the expressions ask of one character.
type class uint8

const (
	clLetter  class = 1 << iota // \p{L}
	clNumber                    // \p{N}
	clSpace                     // \s
	clNewline                   // \r or \n
	clUpper                     // o200k's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	clLower                     // o200k's [\p{Ll}\p{Lm}\p{Lo}\p{M}]
)

// prefix is [^\r\n\p{L}\p{N}]: what may stand before a word.
func (c class) prefix() bool { return c&(clNewline|clLetter|clNumber) == 0 }

// other is [^\s\p{L}\p{N}]: punctuation, symbols, marks, controls.
func (c class) other() bool { return c&(clSpace|clLetter|clNumber) == 0 }

var asciiClass = func() (t [utf8.RuneSelf]class) {
	for r := range rune(utf8.RuneSelf) {
		t[r] = classifyRune(r)
	}
	return t
}()

func classifyRune(r rune) class {
	var c class
	switch {
	case unicode.IsLetter(r):
		c |= clLetter
		switch {
		case unicode.Is(unicode.Lu, r), unicode.Is(unicode.Lt, r):
			c |= clUpper
		case unicode.Is(unicode.Ll, r):
			c |= clLower
		case unicode.Is(unicode.Lm, r), unicode.Is(unicode.Lo, r):
			c |= clUpper | clLower
		}
	case unicode.IsMark(r):
		c |= clUpper | clLower
	case unicode.IsNumber(r):
		c |= clNumber
	}
	if unicode.IsSpace(r) {
		c |= clSpace
	}
	if r == '\r' || r == '\n' {
		c |= clNewline
	}
	return c
}

// at returns the class of the character at s[i:] and its size (0 at the end).
func at(s string, i int) (class, int) {
	if i >= len(s) {
		return 0, 0
	}
	if b := s[i]; b < utf8.RuneSelf {
		return asciiClass[b], 1
	}
	r, size := utf8.DecodeRuneInString(s[i:])
	return classifyRune(r), size
}

// run returns the end of the characters from s[i:] whose class has a bit of want.
func run(s string, i int, want class) int {
	for {
		c, size := at(s, i)
		if size == 0 || c&want == 0 {
			return i
		}
		i += size
	}
}

// contraction returns the end of (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i:], or i.
func contraction(s string, i int) int {
	if i >= len(s) || s[i] != '\'' {
		return i
	}
	r1, n1 := lowerAt(s, i+1)
	switch r1 {
	case 's', 't', 'm', 'd':
		return i + 1 + n1
	case 'r', 'v', 'l':
		want := 'e'
		if r1 == 'l' {
			want = 'l'
		}
		if r2, n2 := lowerAt(s, i+1+n1); n2 > 0 && r2 == want {
			return i + 1 + n1 + n2
		}
	}
	return i
}

func lowerAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return 0, 0
	}
	r, size := utf8.DecodeRuneInString(s[i:])
	return unicode.ToLower(r), size
}

// splitO200k returns the end of the o200k_base piece at s[p:] (p < len(s)).
func splitO200k(s string, p int) int {
	c0, n0 := at(s, p)
	// The two word alternatives, each with the optional prefix character
	// and then without it, in the order the engine tries them.
	for _, upperFirst := range [2]bool{false, true} {
		for _, withPrefix := range [2]bool{true, false} {
			q := p
			if withPrefix {
				if !c0.prefix() {
					continue
				}
				q += n0
			}
			var end int
			if upperFirst {
				end = upperWord(s, q)
			} else {
				end = lowerWord(s, q)
			}
			if end > q {
				return contraction(s, end)
			}
		}
	}
	if c0&clNumber != 0 {
		return digits(s, p)
	}
	if end := punctuation(s, p, c0); end > p {
		for end < len(s) && (s[end] == '\r' || s[end] == '\n' || s[end] == '/') {
			end++
		}
		return end
	}
	return spaces(s, p)
}

// lowerWord matches [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+
// at s[q:]: the end, or q. When the upper run is not followed by a lower
// character, the engine gives back upper characters until the last one that
// is also lower (Lm, Lo, M) ends the match.
func lowerWord(s string, q int) int {
	i, lastLowerEnd := q, -1
	for {
		c, size := at(s, i)
		if size == 0 || c&clUpper == 0 {
			break
		}
		i += size
		if c&clLower != 0 {
			lastLowerEnd = i
		}
	}
	if end := run(s, i, clLower); end > i {
		return end
	}
	if lastLowerEnd > 0 {
		return lastLowerEnd
	}
	return q
}

// upperWord matches [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*
// at s[q:]: the end, or q.
func upperWord(s string, q int) int {
	i := run(s, q, clUpper)
	if i == q {
		return q
	}
	return run(s, i, clLower)
}

// digits matches \p{N}{1,3} at s[p:], which starts with a number.
func digits(s string, p int) int {
	i := p
	for range 3 {
		c, size := at(s, i)
		if size == 0 || c&clNumber == 0 {
			break
		}
		i += size
	}
	return i
}

// punctuation matches " ?[^\s\p{L}\p{N}]+" at s[p:] (c0 is the class of
// its first character): the end, or p.
func punctuation(s string, p int, c0 class) int {
	q := p
	if s[p] == ' ' {
		q++
	} else if !c0.other() {
		return p
	}
	end := q
	for {
		c, size := at(s, end)
		if size == 0 || !c.other() {
			break
		}
		end += size
	}
	if end == q {
		return p
	}
	return end
}

// spaces matches \s*[\r\n]+|\s+(?!\S)|\s+ at s[p:]. Any character no
// other alternative takes is white space, but a piece of one character is
// returned for anything else rather than none.
func spaces(s string, p int) int {
	end, lastNewlineEnd, lastSize := p, -1, 0
	for {
		c, size := at(s, end)
		if size == 0 || c&clSpace == 0 {
			break
		}
		end += size
		lastSize = size
		if c&clNewline != 0 {
			lastNewlineEnd = end
		}
	}
	switch {
	case end == p:
		_, size := at(s, p)
		return p + size
	case lastNewlineEnd > 0:
		return lastNewlineEnd // \s*[\r\n]+: up to the last line break
	case end == len(s) || end-lastSize == p:
		return end // \s+ at the end of the text, or a single character
	}
	return end - lastSize // \s+(?!\S): leave the last one to the next word
}

// splitCL100k returns the end of the cl100k_base piece at s[p:] (p < len(s)).
func splitCL100k(s string, p int) int {
	if end := contraction(s, p); end > p {
		return end
	}
	c0, n0 := at(s, p)
	if c0.prefix() {
		if c1, _ := at(s, p+n0); c1&clLetter != 0 {
			return run(s, p+n0, clLetter)
		}
	}
	if c0&clLetter != 0 {
		return run(s, p, clLetter)
	}
	if c0&clNumber != 0 {
		return digits(s, p)
	}
	if end := punctuation(s, p, c0); end > p {
		for end < len(s) && (s[end] == '\r' || s[end] == '\n') {
			end++
		}
		return end
	}
	return spaces(s, p)
}

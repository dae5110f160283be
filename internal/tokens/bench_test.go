package tokens

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// shortChat is a 3-message request of about 60 tokens; prefix makes its
// text unique, so that nothing is memoised.
func shortChat(prefix string) json.RawMessage {
	msgs := []map[string]string{
		{"role": "system", "content": prefix + "You are a helpful assistant that answers questions about the weather."},
		{"role": "user", "content": prefix + "What's the weather like in San Francisco today, and should I bring an umbrella?"},
		{"role": "assistant", "content": prefix + "It is 18 degrees and cloudy with a 40% chance of rain in the afternoon; an umbrella is a good idea."},
	}
	b, _ := json.Marshal(msgs)
	return b
}

func BenchmarkChatShort(b *testing.B) {
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			b.StopTimer()
			msgs := shortChat(strconv.Itoa(i) + " ")
			b.StartTimer()
			Chat("gpt-4o", msgs, nil)
		}
	})
	b.Run("repeated", func(b *testing.B) {
		msgs := shortChat("")
		b.ReportAllocs()
		for b.Loop() {
			Chat("gpt-4o", msgs, nil)
		}
	})
}

func BenchmarkChatTools(b *testing.B) {
	c := loadRecorded(b)
	var tools, msgs json.RawMessage
	for _, rc := range c {
		if len(rc.Tools) > len(tools) {
			tools, msgs = rc.Tools, rc.Messages
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		Chat("gpt-4o", msgs, tools)
	}
}

// prose4KB is about 4 KiB of English text.
var prose4KB = strings.Repeat("The gateway reserves rate-limit capacity before each upstream call, using an estimate of the prompt's tokens. ", 38)

func BenchmarkText4KB(b *testing.B) {
	b.Run("new", func(b *testing.B) {
		b.SetBytes(int64(len(prose4KB)))
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			Text("gpt-4o", strconv.Itoa(i)+prose4KB)
		}
	})
	b.Run("repeated", func(b *testing.B) {
		b.SetBytes(int64(len(prose4KB)))
		b.ReportAllocs()
		for b.Loop() {
			Text("gpt-4o", prose4KB)
		}
	})
}

// BenchmarkText4MB measures large prompts without the memo, including the
// inputs that are slow per byte for the BPE: one long run of one letter,
// and one long "word" of random letters.
func BenchmarkText4MB(b *testing.B) {
	const size = 4 << 20
	r := rand.New(rand.NewPCG(1, 2))
	letters := make([]byte, size)
	for i := range letters {
		letters[i] = byte('a' + r.IntN(26))
	}
	ascii := make([]byte, size)
	for i := range ascii {
		ascii[i] = byte(' ' + r.IntN(95))
	}
	for _, in := range []struct{ name, s string }{
		{"prose", strings.Repeat(prose4KB, size/len(prose4KB))},
		{"one-letter", strings.Repeat("a", size)},
		{"spaces", strings.Repeat(" ", size)},
		{"random-letters", string(letters)},
		{"random-ascii", string(ascii)},
	} {
		b.Run(in.name, func(b *testing.B) {
			b.SetBytes(int64(len(in.s)))
			for b.Loop() {
				o200k.countUncached(in.s)
			}
		})
	}
}

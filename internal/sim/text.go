package sim

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/llmgate/llmgate/internal/tokens"
)

// chatPromptTokens is what OpenAI would bill a chat request's prompt: the
// tokens of its messages and tool definitions in the model's encoding (see
// internal/tokens).
func chatPromptTokens(r *chatRequest) int64 {
	return int64(tokens.Chat(r.Model, r.rawMessages, r.rawTools))
}

// vocabulary feeds the deterministic answers; each word is one token.
var vocabulary = strings.Fields(`the a quota token request limit gateway model answer
	stream lock budget replica minute window bucket provider retry latency
	prompt cache fair queue tenant cost usage deadline shared store lease
	fence signal replay burst steady simulated careful quick bright quiet
	reliable every many one few is are was will can should may runs waits
	counts keeps sends holds serves and or but so then while because`)

// completionSeed hashes what determines a legacy completion: the model and
// the prompt. (A chat role is never empty, so no chat prompt hashes alike.)
func completionSeed(model, prompt string) [32]byte {
	return answerSeed(model, []message{{text: prompt}})
}

// answerSeed hashes what determines an answer: the model and the prompt.
func answerSeed(model string, msgs []message) [32]byte {
	h := sha256.New()
	h.Write([]byte(model))
	for _, m := range msgs {
		h.Write([]byte{0})
		h.Write([]byte(m.Role))
		h.Write([]byte{0})
		h.Write([]byte(m.text))
	}
	var s [32]byte
	h.Sum(s[:0])
	return s
}

// answerWords returns the deterministic answer, one token per word: between
// 8 and 47 words, the first capitalised, the last ending with a period.
func answerWords(seed [32]byte) []string {
	r := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:16])))
	n := 8 + r.IntN(40)
	words := make([]string, n)
	for i := range words {
		words[i] = vocabulary[r.IntN(len(vocabulary))]
	}
	words[0] = strings.ToUpper(words[0][:1]) + words[0][1:]
	words[n-1] += "."
	return words
}

// joinWords renders words as streamed: each after the first with a leading
// space, so that concatenating the chunks gives the whole answer.
func joinWords(words []string) string { return strings.Join(words, " ") }

// embedding returns a deterministic unit vector of dims values for input.
func embedding(model, input string, dims int) []float32 {
	seed := sha256.Sum256([]byte(model + "\x00" + input))
	r := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:16])))
	v := make([]float32, dims)
	var sum float64
	for i := range v {
		x := r.NormFloat64()
		v[i] = float32(x)
		sum += x * x
	}
	if norm := math.Sqrt(sum); norm > 0 {
		for i := range v {
			v[i] = float32(float64(v[i]) / norm)
		}
	}
	return v
}

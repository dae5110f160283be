package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"testing"
)

// chatBody is a typical three-message chat request.
var chatBody = []byte(`{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"},{"role":"assistant","content":"The capital of France is Paris."}],"temperature":0.2,"max_tokens":256,"stream":true,"stream_options":{"include_usage":true}}`)

// fullAnswer is a chat completion as OpenAI sends it, usage details included.
var fullAnswer = []byte(`{"id":"chatcmpl-sim-3f2a","object":"chat.completion","created":1764633600,"model":"gpt-4.1-mini","choices":[{"index":0,"message":{"role":"assistant","content":"The weather in San Francisco is mild today with fog early.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":57,"completion_tokens":10,"total_tokens":67,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_sim"}`)

func BenchmarkParseUsage(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(fullAnswer)))
	for b.Loop() {
		if u := ParseUsage(fullAnswer); u == nil || u.TotalTokens != 67 {
			b.Fatal(u)
		}
	}
}

func BenchmarkParseRequest(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(chatBody)))
	for b.Loop() {
		if _, err := ParseRequest(ChatCompletions, chatBody); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRewrite is what the gateway does to a stream request: ask the
// provider for usage.
func BenchmarkRewrite(b *testing.B) {
	set := map[string]json.RawMessage{"stream_options": json.RawMessage(`{"include_usage":true}`)}
	b.ReportAllocs()
	b.SetBytes(int64(len(chatBody)))
	for b.Loop() {
		if _, err := Rewrite(chatBody, set); err != nil {
			b.Fatal(err)
		}
	}
}

// chatStream returns an OpenAI chat stream of n content chunks, the finish
// chunk, the usage chunk and [DONE].
func chatStream(n int) []byte {
	var buf bytes.Buffer
	const head = `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_eb9dce56a8",`
	fmt.Fprintf(&buf, "data: %s\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n", head)
	for i := range n {
		fmt.Fprintf(&buf, "data: %s\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word%d\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n", head, i)
	}
	fmt.Fprintf(&buf, "data: %s\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n", head)
	fmt.Fprintf(&buf, "data: %s\"choices\":[],\"usage\":{\"prompt_tokens\":19,\"completion_tokens\":%d,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":0,\"audio_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0}}}\n\n", head, n, 19+n)
	buf.WriteString("data: [DONE]\n\n")
	return buf.Bytes()
}

// BenchmarkEventReader reads a 200-chunk chat stream, alone and as the
// gateway does, with ParseChunk on every payload.
func BenchmarkEventReader(b *testing.B) {
	stream := chatStream(200)
	for _, parse := range []bool{false, true} {
		name := "read"
		if parse {
			name = "read+ParseChunk"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(stream)))
			r := bytes.NewReader(stream)
			for b.Loop() {
				r.Reset(stream)
				er := NewEventReader(r)
				events := 0
				for {
					_, data, err := er.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					if parse {
						ParseChunk(data)
					}
					events++
				}
				if events != 204 {
					b.Fatalf("%d events", events)
				}
			}
		})
	}
}

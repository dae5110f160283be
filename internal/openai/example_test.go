package openai_test

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/llmgate/llmgate/internal/openai"
)

func ExampleRewrite() {
	body := []byte(`{"model":"fast","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	opts, _ := openai.StreamOptionsWithUsage(body)
	out, err := openai.Rewrite(body, map[string]json.RawMessage{
		"model":          json.RawMessage(`"gpt-4o-mini"`),
		"stream_options": opts,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))
	// Output:
	// {"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}
}

func ExampleParseRequest() {
	_, aerr := openai.ParseRequest(openai.ChatCompletions, []byte(`{"model":"gpt-4o","messages":"hi"}`))
	os.Stdout.Write(aerr.Body())
	// Output:
	// {"error":{"message":"Invalid type for 'messages': expected an array of message objects.","type":"invalid_request_error","param":"messages","code":null}}
}

func ExampleEventReader() {
	stream := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
		": keep-alive\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n" +
		"data: [DONE]\n\n"
	er := openai.NewEventReader(strings.NewReader(stream))
	for {
		raw, data, err := er.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			panic(err)
		}
		c := openai.ParseChunk(data)
		switch {
		case c.Done:
			fmt.Println("done")
		case c.UsageOnly:
			fmt.Printf("usage: %d prompt, %d completion\n", c.Usage.PromptTokens, c.Usage.CompletionTokens)
		case data == nil:
			fmt.Printf("comment, forwarded as %q\n", raw)
		default:
			fmt.Println("content:", c.Content)
		}
	}
	// Output:
	// content: true
	// comment, forwarded as ": keep-alive\n\n"
	// usage: 9 prompt, 1 completion
	// done
}

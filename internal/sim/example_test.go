package sim_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/llmgate/llmgate/clock"

	"github.com/llmgate/llmgate/internal/sim"
)

// A simulated provider with a limit of 2 requests per minute: the same
// prompt always gets the same answer, and the third request gets OpenAI's 429.
func Example() {
	// A fake clock keeps the buckets still; leave Clock unset for real time.
	s, err := sim.New(sim.Config{RPM: 2, Clock: clock.NewFake(time.Unix(0, 0))})
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()

	for range 3 {
		resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"model":"gpt-4.1-mini","max_tokens":6,"messages":[{"role":"user","content":"Hello!"}]}`))
		if err != nil {
			panic(err)
		}
		var body struct {
			Choices []struct {
				Message struct{ Content string }
			}
			Usage struct {
				PromptTokens, CompletionTokens int64 `json:",omitempty"`
			}
			Error struct{ Type, Code string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			fmt.Println(resp.StatusCode, body.Error.Type, body.Error.Code, "retry-after", resp.Header.Get("retry-after"))
			continue
		}
		fmt.Printf("%d %q remaining-requests=%s\n", resp.StatusCode, body.Choices[0].Message.Content, resp.Header.Get("x-ratelimit-remaining-requests"))
	}
	fmt.Printf("%+v\n", s.Stats().Total)
	// Output:
	// 200 "Are minute quota answer keeps every" remaining-requests=1
	// 200 "Are minute quota answer keeps every" remaining-requests=0
	// 429 requests rate_limit_exceeded retry-after 30
	// {Calls:2 RateLimited:1 ErrorsInjected:0 StreamsDropped:0 PromptTokens:18 CompletionTokens:12}
}

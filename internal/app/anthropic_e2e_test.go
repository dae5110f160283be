//go:build unix

package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// anthropicYAML is cfg's configuration with provider "sim" of type
// anthropic.
func anthropicYAML(t *testing.T, cfg gatewayConfig) string {
	t.Helper()
	y := cfg.YAML()
	const anchor = "  - name: sim\n"
	if strings.Count(y, anchor) != 1 {
		t.Fatalf("provider sim not found in:\n%s", y)
	}
	return strings.Replace(y, anchor, anchor+"    type: anthropic\n", 1)
}

// anthropicSDK is an official Anthropic SDK client for the replica.
func anthropicSDK(r *replica, key string) anthropic.Client {
	return anthropic.NewClient(aoption.WithBaseURL(r.URL), aoption.WithAPIKey(key), aoption.WithMaxRetries(0), aoption.WithHTTPClient(e2eutil.HTTP))
}

// TestE2EAnthropicReplicasShareTokenLimits: three replicas on one Redis
// send Anthropic SDK requests to a provider with Anthropic-style input
// and output tokens per minute, at several times what those allow. The
// replicas share the limits: the provider answers no request 429.
func TestE2EAnthropicReplicasShareTokenLimits(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a burst of a few hundred requests over about 15s; runs without -short")
	}
	e2eutil.LogRuntime(t)
	const (
		model     = "claude-sonnet-4-5"
		warmModel = "claude-haiku-4-5"
		itpm      = 2400
		otpm      = 3000
		maxTokens = 40
		requests  = 360
		clients   = 30
		maxWait   = 2 * time.Second
	)
	rds := testutil.StartRedis(t)
	s := newE2ESim(t, sim.Config{Models: []string{model, warmModel}, ITPM: itpm, OTPM: otpm, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicasYAML(t, 3, anthropicYAML(t, gatewayConfig{
		Store: rds.URL(), SimURL: s.url, Models: []string{model, warmModel}, LogLevel: "info",
		Limits: fmt.Sprintf("{itpm: %d, otpm: %d}", itpm, otpm), MaxWait: maxWait.String(), RequestTimeout: "60s",
	}))
	sdks := make([]anthropic.Client, len(reps))
	for i, r := range reps {
		sdks[i] = anthropicSDK(r, e2eutil.TenantKey)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	params := func(prompt string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{Model: model, MaxTokens: maxTokens,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}}
	}
	// Warm-up: every replica's connections and code paths on another
	// model (its own buckets), then one request starts the shared buckets
	// and the provider's as close together as they can be.
	for i, c := range sdks {
		p := params("warm-up")
		p.Model = warmModel
		if _, err := c.Messages.New(ctx, p); err != nil {
			t.Fatalf("warm-up via %s: %v", reps[i].Name, err)
		}
	}
	first, err := sdks[0].Messages.New(ctx, params("first"))
	if err != nil {
		t.Fatal(err)
	}

	var next atomic.Int64
	var ok, limited, output, input atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	begin := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= requests || ctx.Err() != nil {
					return
				}
				p := params(fmt.Sprintf("request %d", i))
				var m *anthropic.Message
				var err error
				if i%2 == 0 {
					m, err = sdks[i%len(sdks)].Messages.New(ctx, p)
				} else {
					stream := sdks[i%len(sdks)].Messages.NewStreaming(ctx, p)
					acc := anthropic.Message{}
					for stream.Next() {
						if aerr := acc.Accumulate(stream.Current()); aerr != nil {
							err = aerr
						}
					}
					if err == nil {
						err = stream.Err()
					}
					m = &acc
				}
				var ae *anthropic.Error
				switch {
				case err == nil:
					ok.Add(1)
					output.Add(m.Usage.OutputTokens)
					input.Add(m.Usage.InputTokens)
				case errors.As(err, &ae) && ae.StatusCode == http.StatusTooManyRequests && ae.Response.Header.Get("X-Llmgate-Deployment") == "":
					limited.Add(1) // the gateway's own 429, after max_wait
				default:
					mu.Lock()
					failures = append(failures, fmt.Sprintf("request %d: %v", i, err))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(begin)
	for _, f := range failures {
		t.Error(f)
	}
	st := s.Stats().Total
	allowedOut := otpm + int64(float64(otpm)*took.Minutes())
	offered := int64(requests) * maxTokens
	t.Logf("%d requests (%d output tokens asked for, %.1fx the %d the OTPM allows in %v): %d answered (%d input, %d output tokens), %d got the gateway's 429; provider: %d calls, %d 429s",
		requests, offered, float64(offered)/float64(allowedOut), allowedOut, took.Round(time.Millisecond), ok.Load(), input.Load(), output.Load(), limited.Load(), st.Calls, st.RateLimited)
	if st.RateLimited != 0 {
		t.Errorf("the provider answered %d requests with 429; the replicas must share its input and output token limits", st.RateLimited)
	}
	if offered < 3*allowedOut {
		t.Errorf("the demand (%d output tokens) is not 3x what the limit allows (%d): the test proves nothing", offered, allowedOut)
	}
	if limited.Load() == 0 || ok.Load() == 0 {
		t.Errorf("%d answered, %d limited: want both", ok.Load(), limited.Load())
	}
	if out := output.Load() + first.Usage.OutputTokens; out > allowedOut+maxTokens*int64(len(reps)) {
		t.Errorf("%d output tokens served, above the %d the OTPM allows", out, allowedOut)
	}
}

//go:build unix

package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	assestream "github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestE2EKilledReplicaGivesBackUnusedTokens: replica A runs streams that
// take a deployment's whole output-tokens-per-minute bucket (max_tokens
// reserved each); each has streamed one token when A renews its
// reservations, with that usage, and is killed with SIGKILL. The provider
// (Anthropic's OTPM, which gives back what a cut stream did not generate)
// has its capacity back at once; the gateway's comes back when the dead
// replica's reservations expire, within reservation_hold of the kill,
// charged the one token each had streamed: a request through replica B
// that needs nearly the whole bucket is admitted then, about a minute
// before the bucket would have refilled, and not before the reservations
// could have expired. The provider answers no 429: the gateway gave back
// no more than the provider did.
type messageStream = assestream.Stream[anthropic.MessageStreamEventUnion]

func TestE2EKilledReplicaGivesBackUnusedTokens(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	const (
		model   = "claude-sonnet-4-5"
		hold    = 2 * time.Second // ratelimit.reservation_hold: the least allowed; renewed every half
		otpm    = 1000
		streams = 4
		each    = otpm / streams // max_tokens of each stream: the whole bucket
		// next needs nearly the whole bucket: it fits once the streams'
		// unused tokens are back, not before (about 54s of refill).
		next = 900
	)
	rds := testutil.StartRedis(t)
	// A stream sends its first token at once, then waits a minute per
	// token: the one token is all it streams before the kill.
	s := newE2ESim(t, sim.Config{Models: []string{model}, OTPM: otpm, TokenDelay: time.Minute, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicasYAML(t, 2, anthropicYAML(t, gatewayConfig{
		Store: rds.URL(), SimURL: s.url, Models: []string{model}, LogLevel: "info",
		Limits: fmt.Sprintf("{otpm: %d}", otpm), MaxWait: "60s", RequestTimeout: "120s",
		Extra: fmt.Sprintf("ratelimit: {reservation_hold: %s}\n", hold),
	}))
	a, b := reps[0], reps[1]
	late := rds.LateBound(t, 50, 2*time.Second) // how late "at once" may be on a loaded machine
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	params := func(prompt string, maxTokens int64) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{Model: model, MaxTokens: maxTokens,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}}
	}
	// firstToken streams a message through r until its first content
	// event, which comes only once the request was admitted.
	firstToken := func(ctx context.Context, r *replica, prompt string, maxTokens int64) (*messageStream, error) {
		c := anthropicSDK(r, e2eutil.TenantKey)
		st := c.Messages.NewStreaming(ctx, params(prompt, maxTokens))
		for st.Next() {
			if st.Current().Type == "content_block_delta" {
				return st, nil
			}
		}
		_ = st.Close()
		return nil, fmt.Errorf("%s: no content: %v", r.Name, st.Err())
	}

	// The streams through A take the whole bucket.
	started := time.Now()
	held := make([]*messageStream, streams)
	for i := range held {
		st, err := firstToken(ctx, a, fmt.Sprintf("a long story %d", i), each)
		if err != nil {
			t.Fatal(err)
		}
		held[i] = st
	}
	// A renews each reservation half a hold after its admission, with the
	// one token streamed: each is then in the store's list of reservations
	// whose usage is recorded.
	recorded := rds.Client(t)
	const recordedKey = "llmgate:rl:{default}:x"
	e2eutil.WaitUntil(t, hold+late, "A renews every stream's reservation with its usage", func() bool {
		n, err := recorded.Do(ctx, recorded.B().Zcard().Key(recordedKey).Build()).AsInt64()
		return err == nil && n == streams
	})

	a.Kill(t)
	killedAt := time.Now()
	for i, st := range held {
		for st.Next() {
		}
		if st.Err() == nil {
			t.Errorf("stream %d through the killed replica ended without an error", i)
		}
		_ = st.Close()
	}

	// B's request waits for the dead replica's reservations to expire.
	st, err := firstToken(ctx, b, "after the kill", next)
	if err != nil {
		t.Fatal(err)
	}
	admitted := time.Now()
	_ = st.Close()
	took := admitted.Sub(killedAt)
	refill := time.Duration(float64(next) / otpm * float64(time.Minute))
	t.Logf("a request for %d of the %d output tokens a minute was admitted %v after the kill (hold %v; refilling them would take %v)",
		next, otpm, took.Round(time.Millisecond), hold, refill.Round(time.Second))
	// Each reservation expires a hold after its last renewal, which was
	// before the kill; the keeper checks every quarter hold.
	if most := hold + hold/4 + late; took > most {
		t.Errorf("the dead replica's unused tokens came back %v after the kill, want within %v (hold %v + a keeper period + %v)", took, most, hold, late)
	}
	// And not before they could: a reservation is first renewed half a
	// hold after its admission, and expires a hold after that.
	if earliest := started.Add(hold + hold/2); admitted.Before(earliest.Add(-5 * time.Millisecond)) {
		t.Errorf("the request was admitted %v after the streams started, before their reservations could expire (%v)", admitted.Sub(started), hold+hold/2)
	}
	if st := s.Stats().Total; st.RateLimited != 0 {
		t.Errorf("the provider answered %d 429s: the gateway gave back more than the provider did", st.RateLimited)
	}
}

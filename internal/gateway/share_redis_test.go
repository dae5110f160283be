package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/dedup"
	dedupredis "github.com/llmgate/llmgate/dedup/redis"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestDedupStreamLiveAcrossReplicas: two gateways on one redis-server; a
// follower on the second relays the leader's stream event by event as the
// provider produces it, not once the leader is done: it has the first event
// while the provider still holds back the rest.
func TestDedupStreamLiveAcrossReplicas(t *testing.T) {
	rds := testutil.StartRedis(t)
	more := make(chan struct{}) // lets the provider finish its stream
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := func(content, finish string) {
			fin := "null"
			if finish != "" {
				fin = `"` + finish + `"`
			}
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4.1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n", content, fin)
			w.(http.Flusher).Flush()
		}
		chunk("first", "")
		select {
		case <-more:
		case <-r.Context().Done():
			return
		}
		chunk(" second", "stop")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	replica := func() *harness {
		return newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
			for i := range o.Deployments {
				o.Deployments[i].Target.BaseURL = up.URL + "/v1"
			}
			o.Dedup.Group = dedup.New(dedupredis.New(rds.Client(t), dedupredis.Config{}), dedup.Options{LeaseTTL: time.Second})
		}})
	}
	a, b := replica(), replica()
	t.Cleanup(func() {
		select {
		case <-more:
		default:
			close(more)
		}
	})
	body := `{"model":"gpt-4.1","temperature":0,"stream":true,"messages":[{"role":"user","content":"live"}]}`

	leader := make(chan string, 1)
	go func() {
		resp := a.post("/v1/chat/completions", tenantKey, body)
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if resp.Header.Get("X-Llmgate-Dedup") != "leader" {
			got = []byte("not the leader: " + string(got))
		}
		leader <- string(got)
	}()
	waitFor(t, func() bool { return calls.Load() == 1 })

	resp := b.post("/v1/chat/completions", tenantKey, body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Llmgate-Dedup") != "follower" {
		t.Fatalf("second replica: %d %q", resp.StatusCode, resp.Header.Get("X-Llmgate-Dedup"))
	}
	br := bufio.NewReader(resp.Body)
	firstEvent := make(chan string, 1)
	go func() {
		var ev strings.Builder
		for !strings.HasSuffix(ev.String(), "\n\n") {
			line, err := br.ReadString('\n')
			ev.WriteString(line)
			if err != nil {
				break
			}
		}
		firstEvent <- ev.String()
	}()
	var first string
	select {
	case first = <-firstEvent:
		if !strings.Contains(first, `"first"`) {
			t.Fatalf("the follower's first event: %q", first)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follower got nothing while the provider was still streaming: frames are not relayed live")
	}
	close(more)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	want := <-leader
	got := first + string(rest)
	if got != want || !strings.HasSuffix(want, "data: [DONE]\n\n") {
		t.Fatalf("follower:\n%s\nleader:\n%s", got, want)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}
}

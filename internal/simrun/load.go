package simrun

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/internal/scenario"
)

// maxRecords bounds the requests one arm makes, whatever the scenario.
const maxRecords = 200_000

// record is one client request (its retries included).
type record struct {
	start, end time.Duration // since the start of the arm
	class      int
	ok         bool
	status     int  // the last answer's status, 0 for none
	cut        bool // still running when the arm ended
}

// clients runs a scenario's workload against targets and records it.
type clients struct {
	sc      *scenario.Scenario
	targets []string // base URLs ending in /v1
	key     string   // bearer token
	client  *http.Client
	start   time.Time
	up      *upstream // the primary provider, for the queue gauge

	outstanding atomic.Int64
	got429      atomic.Int64
	count       atomic.Int64

	mu      sync.Mutex // protects records, rejects
	records []record
	rejects []time.Duration // when each 429 was received
}

func newClients(sc *scenario.Scenario, targets []string, key string, up *upstream, start time.Time) *clients {
	tr := &http.Transport{
		MaxIdleConns:        4 * scenario.MaxCallers,
		MaxIdleConnsPerHost: 4 * scenario.MaxCallers,
		IdleConnTimeout:     30 * time.Second,
	}
	return &clients{sc: sc, targets: targets, key: key, up: up, start: start,
		client: &http.Client{Transport: tr}}
}

func (c *clients) close() { c.client.CloseIdleConnections() }

// wordList is what generated prompts are made of.
var wordList = strings.Fields(`alpha bravo cargo delta engine falcon garden harbor island jungle kernel ladder meadow
nickel orbit pepper quartz river saddle timber umbrella valley walnut xenon yonder zephyr amber basil cedar dune ember
fjord glacier hazel indigo jasper kelp lilac maple nectar onyx pebble quill rust sage thistle ultra velvet willow yarrow`)

func prompt(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(wordList[rng.IntN(len(wordList))])
	}
	return b.String()
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatBody struct {
	Model       string    `json:"model"`
	Messages    []chatMsg `json:"messages"`
	Temperature float64   `json:"temperature"`
	MaxTokens   int64     `json:"max_tokens,omitempty"`
}

type chatAnswer struct {
	Choices []struct {
		Message chatMsg `json:"message"`
	} `json:"choices"`
}

// pick chooses a class of the mix by weight.
func (c *clients) pick(rng *rand.Rand) int {
	total := 0.0
	for _, cl := range c.sc.Clients.Mix {
		total += cl.Weight
	}
	x := rng.Float64() * total
	for i, cl := range c.sc.Clients.Mix {
		if x < cl.Weight {
			return i
		}
		x -= cl.Weight
	}
	return len(c.sc.Clients.Mix) - 1
}

// run plays the workload until it is done or ctx ends.
func (c *clients) run(ctx context.Context) {
	if c.sc.Conversations != nil {
		c.runConversations(ctx)
		return
	}
	cl := &c.sc.Clients
	group := max(cl.Identical, 1)
	groups := (cl.Callers + group - 1) / group
	var wg sync.WaitGroup
	for i := range cl.Callers {
		g := i / group
		wg.Go(func() {
			// The callers of a group draw the same choices: same
			// prompts, same moments.
			rng := rand.New(rand.NewPCG(c.sc.Seed, uint64(g)+1))
			if cl.Spread > 0 && groups > 1 {
				if !sleepCtx(ctx, time.Duration(int64(cl.Spread)*int64(g)/int64(groups))) {
					return
				}
			}
			for j := 0; cl.Requests == 0 || j < cl.Requests; j++ {
				if ctx.Err() != nil || c.count.Add(1) > maxRecords {
					return
				}
				class := c.pick(rng)
				body := chatBody{Model: cl.Mix[class].Model, MaxTokens: cl.MaxTokens, Messages: []chatMsg{
					{Role: "system", Content: "You are a helpful assistant."},
					{Role: "user", Content: fmt.Sprintf("request %d-%d: %s", g, j, prompt(rng, cl.PromptWords))},
				}}
				target := rng.IntN(len(c.targets))
				retrySeed := rng.Uint64() ^ uint64(i)
				c.do(ctx, body, class, "", target, retrySeed)
				if cl.Think > 0 && !sleepCtx(ctx, cl.Think) {
					return
				}
			}
		})
	}
	wg.Wait()
}

// runConversations plays chat sessions: each sends its user messages on
// a schedule, without waiting for the answers, each with the session's
// earlier messages as context; some messages are delivered twice (the
// same bytes, up to 100ms apart, to any replica).
func (c *clients) runConversations(ctx context.Context) {
	cv := c.sc.Conversations
	cl := &c.sc.Clients
	rng := rand.New(rand.NewPCG(c.sc.Seed, 0xc0))
	total := cv.Sessions * cv.Turns
	dups := int(math.Round(cv.DuplicateShare / (1 - cv.DuplicateShare) * float64(total)))
	dupOf := map[int]bool{}
	for _, k := range rng.Perm(total)[:min(dups, total)] {
		dupOf[k] = true
	}
	var wg sync.WaitGroup
	for s := range cv.Sessions {
		// Sessions start spread over one gap.
		offset := time.Duration(int64(cv.Gap) * int64(s) / int64(cv.Sessions))
		msgs := []chatMsg{{Role: "system", Content: "You are a helpful assistant."}}
		for t := range cv.Turns {
			k := s*cv.Turns + t
			msgs = append(msgs, chatMsg{Role: "user", Content: fmt.Sprintf("[s%d t%d] %s", s, t, prompt(rng, cl.PromptWords))})
			body := chatBody{Model: cl.Mix[0].Model, MaxTokens: cl.MaxTokens, Messages: slices.Clone(msgs)}
			at := offset + time.Duration(t)*cv.Gap
			copies := 1
			if dupOf[k] {
				copies = 2
			}
			for cp := range copies {
				delay := time.Duration(0)
				if cp > 0 {
					delay = time.Duration(rng.Int64N(int64(100 * time.Millisecond)))
				}
				target, seed := rng.IntN(len(c.targets)), rng.Uint64()
				wg.Go(func() {
					if !sleepUntil(ctx, c.start.Add(at+delay)) || c.count.Add(1) > maxRecords {
						return
					}
					c.do(ctx, body, 0, fmt.Sprintf("sim-session-%d", s), target, seed)
				})
			}
		}
	}
	wg.Wait()
}

// do sends one request, retrying 429s and 5xx as the OpenAI SDKs do, and
// records it. It returns the answer's text.
func (c *clients) do(ctx context.Context, body chatBody, class int, session string, target int, seed uint64) (string, bool) {
	cl := &c.sc.Clients
	rng := rand.New(rand.NewPCG(seed, 2))
	rec := record{start: time.Since(c.start), class: class}
	c.outstanding.Add(1)
	defer c.outstanding.Add(-1)
	dctx, cancel := context.WithTimeout(ctx, cl.Deadline)
	defer cancel()
	payload, _ := json.Marshal(body)
	var answer string
	for attempt := 0; ; attempt++ {
		status, retryAfter, text := c.send(dctx, payload, cl.Mix[class].Priority, session, c.targets[(target+attempt)%len(c.targets)])
		rec.status = status
		if status == http.StatusTooManyRequests {
			c.got429.Add(1)
			c.mu.Lock()
			c.rejects = append(c.rejects, time.Since(c.start))
			c.mu.Unlock()
		}
		if status == http.StatusOK {
			rec.ok, answer = true, text
			break
		}
		retryable := status == http.StatusTooManyRequests || status >= 500
		if !retryable || attempt >= cl.Retries || dctx.Err() != nil {
			break
		}
		// The SDKs' backoff: retry-after when it is short, else 0.5s
		// doubling up to 8s, less up to 25% jitter.
		wait := retryAfter
		if wait <= 0 || wait > time.Minute {
			wait = time.Duration(float64(500*time.Millisecond) * math.Pow(2, float64(attempt)) * (1 - 0.25*rng.Float64()))
			wait = min(wait, 8*time.Second)
		}
		if !sleepCtx(dctx, wait) {
			break
		}
	}
	rec.end = time.Since(c.start)
	if rec.end-rec.start > cl.Deadline {
		rec.ok = false
	}
	rec.cut = !rec.ok && ctx.Err() != nil
	c.mu.Lock()
	c.records = append(c.records, rec)
	c.mu.Unlock()
	return answer, rec.ok
}

// send makes one attempt; status 0 means no answer (deadline, connection).
func (c *clients) send(ctx context.Context, payload []byte, priority, session, base string) (int, time.Duration, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/chat/completions", bytes.NewReader(payload))
	if err != nil {
		return 0, 0, ""
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.key)
	if priority == scenario.PriorityBatch {
		req.Header.Set("X-Llmgate-Priority", priority)
	}
	if session != "" {
		req.Header.Set("X-Session-Id", session)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, 0, ""
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, 0, ""
	}
	var wait time.Duration
	if v := resp.Header.Get("retry-after-ms"); v != "" {
		if n, err := strconv.ParseFloat(v, 64); err == nil && n > 0 {
			wait = time.Duration(n * float64(time.Millisecond))
		}
	} else if v := resp.Header.Get("retry-after"); v != "" {
		if n, err := strconv.ParseFloat(v, 64); err == nil && n > 0 {
			wait = time.Duration(n * float64(time.Second))
		}
	}
	var text string
	if resp.StatusCode == http.StatusOK {
		var a chatAnswer
		if json.Unmarshal(data, &a) == nil && len(a.Choices) > 0 {
			text = a.Choices[0].Message.Content
		}
	}
	return resp.StatusCode, wait, text
}

// sampleQueue records, every 100ms until ctx ends, how many requests are
// waiting: sent by a client and not at the provider.
func (c *clients) sampleQueue(ctx context.Context, ups []*upstream, out *[]float64) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n := c.outstanding.Load()
			for _, u := range ups {
				n -= u.inflight.Load()
			}
			*out = append(*out, float64(max(n, 0)))
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func sleepUntil(ctx context.Context, at time.Time) bool { return sleepCtx(ctx, time.Until(at)) }

// warmUp sends each replica a few requests of every kind the workload
// makes (de-duplicated, in a session) for a model the provider answers
// without a quota, so that the first requests of the arm do not pay for
// loading vocabularies, scripts and connections.
func warmUp(ctx context.Context, targets []string) error {
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make(chan error, 4*len(targets))
	for i, base := range targets {
		for j := range 4 {
			wg.Go(func() {
				body := fmt.Sprintf(`{"model":%q,"temperature":0,"messages":[{"role":"user","content":"warm up %d %d"}]}`, warmupModel, i, j)
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/chat/completions", strings.NewReader(body))
				if err != nil {
					errs <- err
					return
				}
				req.Header.Set("Authorization", "Bearer "+tenantKey)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Session-Id", fmt.Sprintf("sim-warmup-%d-%d", i, j))
				resp, err := client.Do(req)
				if err != nil {
					errs <- fmt.Errorf("warming up %s: %w", base, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("warming up %s: %s", base, resp.Status)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	return <-errs
}

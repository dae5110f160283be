package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/llmgate/llmgate/internal/tokens"
)

// maxStoredResponses bounds the responses the simulator keeps for GET and
// previous_response_id; the oldest are forgotten first.
const maxStoredResponses = 4096

// responsesRequest is the part of a Responses request the simulator reads.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	Tools              json.RawMessage `json:"tools"`
	MaxOutputTokens    *int64          `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	PreviousResponseID *string         `json:"previous_response_id"`
	// text is the input flattened, for the answer's seed.
	text string
}

func parseResponsesRequest(body []byte) (*responsesRequest, *reqError) {
	var r responsesRequest
	if e := decodeJSON(body, &r); e != nil {
		return nil, e
	}
	if r.Model == "" {
		return nil, badRequest("model", "Missing required parameter: 'model'.")
	}
	if m := r.MaxOutputTokens; m != nil && *m < 1 {
		return nil, badRequest("max_output_tokens", "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 1, but got %d instead.", *m)
	}
	in := bytes.TrimSpace(r.Input)
	switch {
	case len(in) == 0 || bytes.Equal(in, []byte("null")):
		if r.PreviousResponseID == nil {
			return nil, badRequest("input", "Missing required parameter: 'input'.")
		}
	case in[0] == '"':
		_ = json.Unmarshal(in, &r.text) // valid: decodeJSON read it
	case in[0] == '[':
		var items []message
		if err := json.Unmarshal(in, &items); err != nil {
			return nil, badRequest("input", "Invalid type for 'input': expected a string or an array of input items.")
		}
		for i := range items {
			text, ok := contentText(items[i].Content)
			if !ok {
				return nil, badRequest(fmt.Sprintf("input[%d].content", i), "Invalid type for 'input[%d].content'.", i)
			}
			r.text += items[i].Role + "\x00" + text + "\x00"
		}
	default:
		return nil, badRequest("input", "Invalid type for 'input': expected a string or an array of input items.")
	}
	return &r, nil
}

// promptTokens is what the request's own input costs (without the
// previous responses it continues).
func (r *responsesRequest) promptTokens() int64 {
	n := int64(0)
	if r.Instructions != nil {
		n += int64(tokens.Text(r.Model, *r.Instructions)) + 4
	}
	in := bytes.TrimSpace(r.Input)
	switch {
	case len(in) > 0 && in[0] == '[':
		n += int64(tokens.Chat(r.Model, in, r.Tools))
	case r.text != "":
		n += int64(tokens.Text(r.Model, r.text)) + 7 // one user message and the reply's priming
	}
	return n
}

// responsesUsage is the Responses API's usage object.
type responsesUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

type outputText struct {
	Type        string   `json:"type"`
	Text        string   `json:"text"`
	Annotations []string `json:"annotations"`
}

type outputMessage struct {
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

// responseObject is a response as the API returns it.
type responseObject struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Status             string             `json:"status"`
	Error              json.RawMessage    `json:"error"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    *int64             `json:"max_output_tokens"`
	Model              string             `json:"model"`
	Output             []outputMessage    `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Store              bool               `json:"store"`
	Temperature        float64            `json:"temperature"`
	ToolChoice         string             `json:"tool_choice"`
	Tools              []json.RawMessage  `json:"tools"`
	TopP               float64            `json:"top_p"`
	Truncation         string             `json:"truncation"`
	Usage              *responsesUsage    `json:"usage"`
	Metadata           map[string]string  `json:"metadata"`
}

// storedResponse is a response kept for GET and previous_response_id.
type storedResponse struct {
	key    string // the stats label of the key that created it
	body   []byte // its JSON
	tokens int64  // its input and output tokens: what a continuation re-reads
}

// responseStore holds the stored responses, oldest first.
type responseStore struct {
	mu    sync.Mutex // protects m, order
	m     map[string]*storedResponse
	order []string
}

func (rs *responseStore) put(id string, r *storedResponse) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.m == nil {
		rs.m = map[string]*storedResponse{}
	}
	for len(rs.order) >= maxStoredResponses {
		delete(rs.m, rs.order[0])
		rs.order = rs.order[1:]
	}
	rs.m[id] = r
	rs.order = append(rs.order, id)
}

// get returns the response id stored for key.
func (rs *responseStore) get(key, id string) *storedResponse {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r := rs.m[id]; r != nil && r.key == key {
		return r
	}
	return nil
}

func (rs *responseStore) delete(key, id string) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r := rs.m[id]; r != nil && r.key == key {
		delete(rs.m, id) // its place in order is dropped when it comes up
		return true
	}
	return false
}

func responseNotFound(w http.ResponseWriter, param, id string) {
	msg := fmt.Sprintf("No response found with id '%s'.", id)
	code := ""
	if param != "" {
		msg = fmt.Sprintf("Previous response with id '%s' not found.", id)
		code = "previous_response_not_found"
	}
	writeError(w, http.StatusNotFound, "invalid_request_error", code, param, msg)
}

// handleResponses serves POST /v1/responses under the same limits and
// faults as chat completions.
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	key, req, ok := acceptChatModel(s, w, r, parseResponsesRequest, func(r *responsesRequest) string { return r.Model })
	if !ok {
		return
	}
	prompt := req.promptTokens()
	seed := req.text
	if p := req.PreviousResponseID; p != nil {
		prev := s.responses.get(key, *p)
		if prev == nil {
			responseNotFound(w, "previous_response_id", *p)
			return
		}
		prompt += prev.tokens // the conversation so far is read again
		seed = *p + "\x00" + seed
	}
	words := answerWords(answerSeed(req.Model, []message{{Role: "user", text: seed}}))
	status, reason := "completed", ""
	limit := int64(0)
	if req.MaxOutputTokens != nil {
		limit = *req.MaxOutputTokens
	}
	if limit > 0 && limit < int64(len(words)) {
		words, status, reason = words[:limit], "incomplete", "max_output_tokens"
	}
	cost := prompt + int64(len(words))
	if limit > 0 {
		cost = prompt + min(limit, math.MaxInt64-prompt)
	}
	release, ok := s.admit(w, key, req.Model, cost)
	if !ok {
		return
	}
	defer release()
	if s.injectFault(w, key) {
		return
	}
	n := s.seq.Add(1)
	resp := &responseObject{
		ID: fmt.Sprintf("resp_sim%016x", n), Object: "response", CreatedAt: time.Now().Unix(), Status: "in_progress",
		Error: jsonNull, Instructions: req.Instructions, MaxOutputTokens: req.MaxOutputTokens, Model: req.Model,
		Output: []outputMessage{}, ParallelToolCalls: true, PreviousResponseID: req.PreviousResponseID,
		Store: req.Store == nil || *req.Store, Temperature: 1, ToolChoice: "auto", Tools: []json.RawMessage{}, TopP: 1,
		Truncation: "disabled", Metadata: map[string]string{},
	}
	msgID := fmt.Sprintf("msg_sim%016x", n)
	out := int64(len(words))
	finish := func() {
		resp.Status = status
		if reason != "" {
			resp.IncompleteDetails = &incompleteDetails{Reason: reason}
		}
		resp.Output = []outputMessage{{Type: "message", ID: msgID, Status: status, Role: "assistant",
			Content: []outputText{{Type: "output_text", Text: joinWords(words), Annotations: []string{}}}}}
		resp.Usage = &responsesUsage{InputTokens: prompt, OutputTokens: out, TotalTokens: prompt + out}
		if resp.Store {
			b, _ := json.Marshal(resp)
			s.responses.put(resp.ID, &storedResponse{key: key, body: b, tokens: prompt + out})
		}
	}
	ctx := r.Context()
	if !req.Stream {
		if !s.sleep(ctx, s.cfg.TTFT+time.Duration(len(words)-1)*s.cfg.TokenDelay) {
			return
		}
		s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += prompt; k.CompletionTokens += out })
		finish()
		writeJSON(w, http.StatusOK, resp)
		return
	}
	s.streamResponse(ctx, w, key, resp, msgID, words, prompt, finish)
}

// typedEvents writes the Responses API's typed server-sent events:
// "event: TYPE" then the data, with a growing sequence_number.
type typedEvents struct {
	*sse
	seq int
}

func (e *typedEvents) send(typ string, fields map[string]any) bool {
	fields["type"] = typ
	fields["sequence_number"] = e.seq
	e.seq++
	b, _ := json.Marshal(fields)
	if _, err := fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", typ, b); err != nil {
		return false
	}
	return e.rc.Flush() == nil
}

// streamResponse streams a response as OpenAI does: created, in_progress,
// the output item and its content part, one delta per token, the done
// events and response.completed (or response.incomplete) with the usage.
func (s *Server) streamResponse(ctx context.Context, w http.ResponseWriter, key string, resp *responseObject, msgID string, words []string, prompt int64, finish func()) {
	drop := s.dropAt(len(words))
	ev := &typedEvents{sse: startSSE(w)}
	s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += prompt })
	snapshot := func() json.RawMessage { b, _ := json.Marshal(resp); return b }
	if !ev.send("response.created", map[string]any{"response": snapshot()}) ||
		!ev.send("response.in_progress", map[string]any{"response": snapshot()}) {
		return
	}
	if !s.sleep(ctx, s.cfg.TTFT) {
		return
	}
	item := outputMessage{Type: "message", ID: msgID, Status: "in_progress", Role: "assistant", Content: []outputText{}}
	part := outputText{Type: "output_text", Annotations: []string{}}
	if !ev.send("response.output_item.added", map[string]any{"output_index": 0, "item": item}) ||
		!ev.send("response.content_part.added", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "part": part}) {
		return
	}
	for i, word := range words {
		if i == drop {
			s.drop(key)
		}
		if i > 0 {
			if !s.sleep(ctx, s.cfg.TokenDelay) {
				return
			}
			word = " " + word
		}
		s.count(key, func(k *KeyStats) { k.CompletionTokens++ })
		if !ev.send("response.output_text.delta", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0,
			"delta": word, "logprobs": []any{}}) {
			return
		}
	}
	finish()
	text := joinWords(words)
	part.Text = text
	if !ev.send("response.output_text.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "text": text, "logprobs": []any{}}) ||
		!ev.send("response.content_part.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "part": part}) ||
		!ev.send("response.output_item.done", map[string]any{"output_index": 0, "item": resp.Output[0]}) {
		return
	}
	final := "response.completed"
	if resp.Status == "incomplete" {
		final = "response.incomplete"
	}
	ev.send(final, map[string]any{"response": snapshot()})
}

// handleGetResponse serves GET /v1/responses/{id}: a response stored by
// the same key.
func (s *Server) handleGetResponse(w http.ResponseWriter, r *http.Request) {
	key, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	stored := s.responses.get(key, id)
	if stored == nil {
		responseNotFound(w, "", id)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(stored.body)
	_, _ = io.WriteString(w, "\n")
}

// handleDeleteResponse serves DELETE /v1/responses/{id}.
func (s *Server) handleDeleteResponse(w http.ResponseWriter, r *http.Request) {
	key, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if !s.responses.delete(key, id) {
		responseNotFound(w, "", id)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}

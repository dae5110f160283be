package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/provider"
)

// Anthropic's Messages API (POST /v1/messages) goes through the same
// pipeline as chat completions, to deployments of type anthropic only.
// Anthropic's SDKs send the key as x-api-key: on these routes it is read
// as the tenant's llmgate key. Errors the gateway makes are answered in
// Anthropic's shape ({"type":"error","error":{"type","message"}}), the
// provider's are relayed as they are.

func (g *Gateway) serveMessages(w http.ResponseWriter, r *http.Request) {
	anthropicKey(r)
	g.serve(&anthropicWriter{ResponseWriter: w}, r, openai.Messages)
}

// anthropicKey makes an x-api-key the request's bearer key when it has no
// Authorization of its own.
func anthropicKey(r *http.Request) {
	if r.Header.Get("Authorization") == "" {
		if k := strings.TrimSpace(r.Header.Get("X-Api-Key")); k != "" {
			r.Header.Set("Authorization", "Bearer "+k)
		}
	}
}

// serveCountTokens passes POST /v1/messages/count_tokens to an Anthropic
// deployment of the model asked for. It costs no tokens: authenticated,
// not rate-limited or charged.
func (g *Gateway) serveCountTokens(w http.ResponseWriter, r *http.Request) {
	anthropicKey(r)
	g.passThrough(&anthropicWriter{ResponseWriter: w}, r, passRoute{path: "/messages/count_tokens", kind: provider.KindAnthropic, byModel: true})
}

// errorTypes maps a status to Anthropic's error type.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestTimeout, http.StatusConflict:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, statusOverloaded:
		return "overloaded_error"
	}
	return "api_error"
}

// anthropicError rewrites an error body in OpenAI's shape (the gateway's
// own) into Anthropic's; nil when b is not one.
func anthropicError(status int, b []byte) []byte {
	var e struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil || e.Error == nil {
		return nil
	}
	out, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{
		"type": anthropicErrorType(status), "message": e.Error.Message,
	}})
	return append(out, '\n')
}

// anthropicWriter answers the gateway's errors in Anthropic's shape: whole
// error answers, and the in-band error events of a stream. The gateway
// writes each in one Write, so each is recognised by how it starts.
type anthropicWriter struct {
	http.ResponseWriter
	status int
}

var (
	openaiErrorStart  = []byte(`{"error":{`)
	openaiStreamError = []byte(`data: {"error":{`)
)

func (a *anthropicWriter) WriteHeader(code int) {
	if a.status == 0 {
		a.status = code
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *anthropicWriter) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	switch {
	case a.status >= 400 && bytes.HasPrefix(b, openaiErrorStart):
		if out := anthropicError(a.status, b); out != nil {
			_, err := a.ResponseWriter.Write(out)
			return len(b), err
		}
	case a.status < 300 && bytes.HasPrefix(b, openaiStreamError):
		status := http.StatusBadGateway
		if bytes.Contains(b, []byte(`"shutting_down"`)) {
			status = http.StatusServiceUnavailable
		}
		if out := anthropicError(status, bytes.TrimPrefix(b, []byte("data: "))); out != nil {
			ev := append([]byte("event: error\ndata: "), bytes.TrimRight(out, "\n")...)
			_, err := a.ResponseWriter.Write(append(ev, "\n\n"...))
			return len(b), err
		}
	}
	return a.ResponseWriter.Write(b)
}

func (a *anthropicWriter) Flush() {
	if f, ok := a.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the server's writer.
func (a *anthropicWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// servesEndpoint reports whether d can answer ep: Messages only on
// Anthropic deployments; chat completions on every kind (Anthropic's
// OpenAI-compatible /v1/chat/completions); the others not on Anthropic.
func servesEndpoint(d *deployment, ep openai.Endpoint) bool {
	anthropic := d.Target.Kind == provider.KindAnthropic
	switch ep {
	case openai.Messages:
		return anthropic
	case openai.ChatCompletions:
		return true
	}
	return !anthropic
}

func mustJSON(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// anyServes reports whether some deployment of c's targets, available or
// not, can answer c's endpoint.
func (g *Gateway) anyServes(c *call) bool {
	for _, t := range c.targets {
		for _, d := range g.byTarget[t] {
			if servesEndpoint(d, c.req.Endpoint) {
				return true
			}
		}
	}
	return false
}

package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/jsonscan"
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

// passRoute says where a passed-through request goes.
type passRoute struct {
	// path is the provider path ("" means the client's path below /v1).
	path string
	// kind, when byModel, restricts the deployments to those of a kind
	// ("" any).
	kind string
	// byModel picks the deployment by the "model" of the JSON body (or
	// multipart form); otherwise the first configured deployment answers.
	byModel bool
}

// passThrough sends a request the gateway does not account (no tokens are
// known before or after) to a deployment: authenticated, with the
// tenant's request limits, the answer relayed with secrets removed.
func (g *Gateway) passThrough(w http.ResponseWriter, r *http.Request, pr passRoute) {
	idHeader := setRequestID(w, r)
	g.pending.Add(1) // the settle may run in the background: Close waits for it
	defer g.pending.Done()
	t, aerr := g.authenticate(r)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	body, aerr := g.readBody(w, r)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	var dep *deployment
	if pr.byModel {
		model, _ := jsonscan.String(openai.Member(body, "model"))
		if model == "" {
			openai.BadRequest("model", "You must provide a model parameter.").Write(w)
			return
		}
		if t.Models != nil && !t.Models[model] {
			errf(http.StatusForbidden, openai.TypePermission, "model_not_allowed", "model",
				"The model '%s' is not allowed for this API key.", model).Write(w)
			return
		}
		targets, _ := g.opt.Route(model)
		for _, tg := range targets {
			for _, d := range g.available(tg) {
				if dep == nil && (pr.kind == "" && d.Target.Kind != provider.KindAnthropic || d.Target.Kind == pr.kind) {
					dep = d
				}
			}
		}
		if dep == nil {
			errf(http.StatusNotFound, openai.TypeInvalidRequest, "model_not_found", "model",
				"The model '%s' does not exist or you do not have access to it.", model).Write(w)
			return
		}
		if dep.Model != model {
			if b, err := openai.Rewrite(body, map[string]json.RawMessage{"model": mustJSON(dep.Model)}); err == nil {
				body = b
			}
		}
	} else {
		for _, d := range g.deps {
			if d.Target.Kind != provider.KindAnthropic && g.opt.Upstream.Available(d.Name) {
				dep = d
				break
			}
		}
		if dep == nil {
			errf(http.StatusServiceUnavailable, openai.TypeUnavailable, "upstream_unavailable", "",
				"No deployment can take this request right now.").Write(w)
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.opt.HTTP.RequestTimeout)
	defer cancel()
	// The deployment's and the tenant's request and concurrency limits
	// (a token is charged, and given back at the settle).
	c := &call{id: idHeader[0], idHeader: idHeader, start: time.Now(), tenant: t, req: &openai.Request{Model: dep.Model}, outcome: "error"}
	if aerr := g.readHints(r, c); aerr != nil {
		aerr.Write(w)
		return
	}
	adm, aerr := g.admit(ctx, c, []*deployment{dep})
	if aerr != nil {
		aerr.Write(w)
		return
	}
	path := pr.path
	if path == "" {
		path = strings.TrimPrefix(r.URL.Path, "/v1")
	}
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	h := http.Header{"X-Request-Id": idHeader}
	for _, k := range forwardHeaders {
		if v, ok := r.Header[k]; ok {
			h[k] = v
		}
	}
	resp, _, err := g.opt.Upstream.Do(ctx, &dep.Target, provider.Request{Method: r.Method, Path: path, Body: body, Header: h})
	if err != nil {
		g.refund(adm)
		g.upstreamError(c, dep, err).Write(w)
		return
	}
	defer resp.Body.Close()
	adm.refused = resp.StatusCode == http.StatusTooManyRequests
	defer g.finish(c, adm, budget.Reservation{}, nil)
	out, err := readAnswer(resp)
	if err != nil || len(out) > maxAnswerBytes {
		errf(http.StatusBadGateway, openai.TypeUpstream, "upstream_error", "", "The provider's answer could not be read.").Write(w)
		return
	}
	out = g.redact.Bytes(out)
	g.copyResponseHeader(w.Header(), resp.Header)
	w.Header()["X-Llmgate-Deployment"] = dep.nameHeader
	w.Header()["Content-Length"] = []string{itoa(int64(len(out)))}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
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

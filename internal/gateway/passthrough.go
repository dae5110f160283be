package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/jsonscan"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/provider"
)

// The routes the gateway passes through without knowing their tokens
// before the call: moderations, images, audio, files, batches, count_tokens
// and, when configured, any other /v1/ route. They are authenticated and
// admitted through the request and concurrency limits of the deployment
// and the tenant (a token is charged and given back); those that name a
// model go to one of its deployments and are charged to the tenant's
// budget with the usage their answer carries (images and transcriptions
// report tokens), or as a request without tokens.

// passRoute says where a passed-through request goes.
type passRoute struct {
	// path is the provider path ("" means the client's path below /v1).
	path string
	// kind restricts the deployments to one kind (provider.KindAnthropic
	// for count_tokens); "" means any but Anthropic.
	kind string
	// byModel picks the deployment by the "model" of the body (JSON or a
	// multipart form); modelOptional lets a body without one go to the
	// default deployment.
	byModel, modelOptional bool
	// account charges the tenant's budget (model routes but count_tokens).
	account bool
}

// Pass-through routes by the body's model, and those that go to the
// default deployment (their ids are the provider's state: files and
// batches must stay on one provider key).
func (g *Gateway) passRoutes(mux *http.ServeMux) {
	byModel := passRoute{byModel: true, account: true}
	for _, p := range []string{"/v1/images/generations", "/v1/images/edits", "/v1/images/variations",
		"/v1/audio/transcriptions", "/v1/audio/translations", "/v1/audio/speech"} {
		mux.HandleFunc("POST "+p, g.pass(byModel))
	}
	mux.HandleFunc("POST /v1/moderations", g.pass(passRoute{byModel: true, modelOptional: true, account: true}))
	def := passRoute{}
	for _, p := range []string{"POST /v1/files", "GET /v1/files", "GET /v1/files/{id}", "DELETE /v1/files/{id}",
		"GET /v1/files/{id}/content", "POST /v1/batches", "GET /v1/batches", "GET /v1/batches/{id}", "POST /v1/batches/{id}/cancel"} {
		mux.HandleFunc(p, g.pass(def))
	}
}

func (g *Gateway) pass(pr passRoute) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { g.passThrough(w, r, pr) }
}

// defaultDeployment is the deployment routes without a model go to: the
// first of Options.PassThrough.Provider, else the first OpenAI-type one.
func (g *Gateway) defaultDeployment() *deployment {
	for _, d := range g.deps {
		if d.Target.Kind == provider.KindOpenAI && (g.opt.PassThrough.Provider == "" || d.Provider == g.opt.PassThrough.Provider) {
			return d
		}
	}
	return nil
}

// serveUnknown answers a /v1/ route the gateway does not know: passed to
// the default deployment when Options.PassThrough.Unknown is set, else a
// 404 in OpenAI's shape.
func (g *Gateway) serveUnknown(w http.ResponseWriter, r *http.Request) {
	if g.opt.PassThrough.Unknown && strings.HasPrefix(r.URL.Path, "/v1/") {
		g.passThrough(w, r, passRoute{})
		return
	}
	g.serveNotFound(w, r)
}

// passThrough sends one such request to a deployment and relays the
// answer, secrets removed.
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
	dep, body, aerr := g.passTarget(r, t, pr, body)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.opt.HTTP.RequestTimeout)
	defer cancel()
	c := &call{id: idHeader[0], idHeader: idHeader, start: time.Now(), tenant: t, outcome: "error",
		req: &openai.Request{Model: dep.Model}, targets: []string{dep.Provider + "/" + dep.Model}}
	if aerr := g.readHints(r, c); aerr != nil {
		aerr.Write(w)
		return
	}
	var res budget.Reservation
	if pr.account {
		// A hold of nothing: a tenant whose budget is spent is refused.
		if res, aerr = g.reserveBudget(ctx, c); aerr != nil {
			aerr.Write(w)
			return
		}
	}
	adm, aerr := g.admit(ctx, c, []*deployment{dep})
	if aerr != nil {
		g.finish(c, admitted{}, res, nil)
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
		g.finish(c, admitted{}, res, nil)
		g.upstreamError(c, dep, err).Write(w)
		return
	}
	defer resp.Body.Close()
	adm.refused = resp.StatusCode == http.StatusTooManyRequests
	out, err := readAnswer(resp)
	if err != nil || len(out) > maxAnswerBytes {
		g.finish(c, adm, res, nil)
		errf(http.StatusBadGateway, openai.TypeUpstream, "upstream_error", "", "The provider's answer could not be read.").Write(w)
		return
	}
	out = g.redact.Bytes(out)
	g.copyResponseHeader(w.Header(), resp.Header)
	w.Header()["X-Llmgate-Deployment"] = dep.nameHeader
	w.Header()["Content-Length"] = []string{itoa(int64(len(out)))}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
	_ = http.NewResponseController(w).Flush()
	var usage *openai.Usage
	if resp.StatusCode/100 == 2 {
		c.outcome = "ok"
		if pr.account {
			if usage = openai.ParseUsage(out); usage == nil {
				usage = &openai.Usage{} // counted as a request
			}
		}
	}
	g.finish(c, adm, res, usage)
}

// passTarget picks the deployment of a passed-through request, and the
// body it is sent with (the deployment's model name in a JSON body).
func (g *Gateway) passTarget(r *http.Request, t *Tenant, pr passRoute, body []byte) (*deployment, []byte, *apiError) {
	model := ""
	if pr.byModel {
		model = requestModel(r.Header.Get("Content-Type"), body)
	}
	if model == "" {
		if pr.byModel && !pr.modelOptional {
			return nil, nil, openai.BadRequest("model", "You must provide a model parameter.")
		}
		dep := g.defaultDeployment()
		if pr.kind != "" {
			dep = nil
		}
		if dep == nil {
			return nil, nil, errf(http.StatusNotFound, openai.TypeInvalidRequest, "unknown_url", "",
				"No provider is configured for %s %s.", r.Method, r.URL.Path)
		}
		return dep, body, nil
	}
	if t.Models != nil && !t.Models[model] {
		return nil, nil, errf(http.StatusForbidden, openai.TypePermission, "model_not_allowed", "model",
			"The model '%s' is not allowed for this API key.", model)
	}
	targets, _ := g.opt.Route(model)
	var dep *deployment
	for _, tg := range targets {
		for _, d := range g.available(tg) {
			ok := d.Target.Kind == pr.kind || pr.kind == "" && d.Target.Kind != provider.KindAnthropic
			if dep == nil && ok {
				dep = d
			}
		}
	}
	if dep == nil {
		return nil, nil, errf(http.StatusNotFound, openai.TypeInvalidRequest, "model_not_found", "model",
			"The model '%s' does not exist or you do not have access to it.", model)
	}
	if dep.Model != model && jsonscan.Valid(jsonscan.TrimSpace(body)) {
		if b, err := openai.Rewrite(body, map[string]json.RawMessage{"model": mustJSON(dep.Model)}); err == nil {
			body = b
		}
	}
	return dep, body, nil
}

// maxModelBytes bounds a model name read from a form.
const maxModelBytes = 256

// requestModel is the "model" of a JSON body or of a multipart form
// (audio and image uploads); "" when it has none.
func requestModel(contentType string, body []byte) string {
	mt, params, err := mime.ParseMediaType(contentType)
	if err == nil && strings.HasPrefix(mt, "multipart/") {
		return multipartModel(body, params["boundary"])
	}
	s, _ := jsonscan.String(openai.Member(body, "model"))
	return s
}

// multipartModel reads the "model" field of a multipart form, scanning
// the parts before it without keeping them.
func multipartModel(body []byte, boundary string) string {
	if boundary == "" {
		return ""
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for range 64 { // a form has a handful of fields
		p, err := mr.NextPart()
		if err != nil {
			return ""
		}
		if p.FormName() == "model" && p.FileName() == "" {
			b, err := io.ReadAll(io.LimitReader(p, maxModelBytes+1))
			if err != nil && !errors.Is(err, io.EOF) || len(b) > maxModelBytes {
				return ""
			}
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

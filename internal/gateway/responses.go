package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/llmgate/llmgate/internal/jsonscan"
	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/provider"
)

// The Responses API keeps state at the provider: a response can be fetched
// (GET /v1/responses/{id}), deleted, and continued (previous_response_id),
// but only through the provider key that created it. So the gateway must
// send those requests to the deployment that answered, from any replica.
// It does so without any store: the ids clients see carry the deployment.
// A response id "resp_abc" from deployment D, answered for tenant T, reaches
// the client as
//
//	resp_lg<8 hex digits>_resp_abc
//
// where the digits are the first 4 bytes of SHA-256(T, D). Replicas share
// the configuration, so each finds D again from the id alone; a tenant
// other than T finds no deployment (its hash differs) and gets 404, so
// that one tenant cannot read another's responses through the gateway's
// shared provider key. Renaming a deployment makes its older ids unknown.

// responseIDPrefix starts every response id the gateway hands out.
const responseIDPrefix = "resp_lg"

// responseTag is the 8 hex digits naming tenant and deployment in an id.
func responseTag(tenant, deployment string) string {
	h := sha256.New()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(deployment))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:4])
}

// clientResponseID is the id the client sees for the upstream id up.
func clientResponseID(t *Tenant, d *deployment, up string) string {
	return responseIDPrefix + responseTag(t.Name, d.Name) + "_" + up
}

// decodeResponseID returns the deployment and upstream id a client's
// response id stands for; false when it names none of t's.
func (g *Gateway) decodeResponseID(t *Tenant, id string) (*deployment, string, bool) {
	rest, ok := strings.CutPrefix(id, responseIDPrefix)
	if !ok || len(rest) < 10 || rest[8] != '_' {
		return nil, "", false
	}
	tag, up := rest[:8], rest[9:]
	for _, d := range g.deps {
		if responseTag(t.Name, d.Name) == tag {
			return d, up, true
		}
	}
	return nil, "", false
}

// pinPrevious resolves a Responses request's previous_response_id: the
// request must go through the provider key that stored that response.
func (g *Gateway) pinPrevious(c *call) *apiError {
	id := c.req.PreviousResponseID
	if c.req.Endpoint != openai.Responses || id == "" {
		return nil
	}
	d, up, ok := g.decodeResponseID(c.tenant, id)
	if !ok {
		return errf(http.StatusNotFound, openai.TypeInvalidRequest, "previous_response_not_found", "previous_response_id",
			"Previous response with id '%s' not found.", id)
	}
	c.pin, c.previousUpstream = d, up
	return nil
}

// pinned keeps, of cands, the deployments on the pinned deployment's
// provider key (a continuation may ask for another model of the same key).
func pinned(cands []*deployment, pin *deployment) []*deployment {
	out := cands[:0:0]
	for _, d := range cands {
		if d.Target.BaseURL == pin.Target.BaseURL && d.Target.APIKey == pin.Target.APIKey {
			out = append(out, d)
		}
	}
	return out
}

// responseIDs rewrites the response ids of a Responses answer on its way
// to the client.
type responseIDs struct {
	up, client       string // the answer's id, upstream and as the client sees it
	prevUp, prevUser string // previous_response_id, upstream and as the client sent it
}

// newResponseIDs prepares the rewriting of c's answer from dep.
func newResponseIDs(c *call) *responseIDs {
	if c.req.Endpoint != openai.Responses {
		return nil
	}
	return &responseIDs{prevUp: c.previousUpstream, prevUser: c.req.PreviousResponseID}
}

// learn notes the answer's upstream id, once it is known.
func (r *responseIDs) learn(c *call, d *deployment, up string) {
	if r.up == "" && up != "" {
		r.up, r.client = up, clientResponseID(c.tenant, d, up)
	}
}

// rewrite returns b with the upstream ids replaced by the client's.
func (r *responseIDs) rewrite(b []byte) []byte {
	b = openai.ReplaceResponseID(b, r.up, r.client)
	return openai.ReplaceResponseID(b, r.prevUp, r.prevUser)
}

// serveResponseByID serves GET and DELETE /v1/responses/{id} (and GET
// /v1/responses/{id}/input_items, POST /v1/responses/{id}/cancel) on the
// deployment that created the response. These calls carry no tokens: they
// pass no rate limit or budget, and are not counted as requests.
func (g *Gateway) serveResponseByID(w http.ResponseWriter, r *http.Request) {
	setRequestID(w, r)
	t, aerr := g.authenticate(r)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	id := r.PathValue("id")
	d, up, ok := g.decodeResponseID(t, id)
	if !ok {
		errf(http.StatusNotFound, openai.TypeInvalidRequest, "", "",
			"No response found with id '%s'.", id).Write(w)
		return
	}
	path := "/responses/" + up
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/"+id); ok {
		path += rest // "/input_items", "/cancel"
	}
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.opt.HTTP.RequestTimeout)
	defer cancel()
	h := http.Header{"Accept": {"application/json"}, "X-Request-Id": w.Header()["X-Request-Id"]}
	resp, _, err := g.opt.Upstream.Do(ctx, &d.Target, provider.Request{Method: r.Method, Path: path, Header: h})
	if err != nil {
		c := &call{req: &openai.Request{Model: d.Model}}
		g.upstreamError(c, d, err).Write(w)
		return
	}
	defer resp.Body.Close()
	body, err := readAnswer(resp)
	if err != nil || len(body) > maxAnswerBytes {
		errf(http.StatusBadGateway, openai.TypeUpstream, "upstream_error", "", "The provider's answer could not be read.").Write(w)
		return
	}
	ids := &responseIDs{up: up, client: id}
	// A stored response names the one it continued: give it back in the
	// client's form (it came from the same tenant and key).
	if prev := previousID(body); prev != "" {
		ids.prevUp, ids.prevUser = prev, clientResponseID(t, d, prev)
	}
	body = g.redact.Bytes(ids.rewrite(body))
	g.copyResponseHeader(w.Header(), resp.Header)
	w.Header()["X-Llmgate-Deployment"] = d.nameHeader
	w.Header()["Content-Length"] = []string{itoa(int64(len(body)))}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
}

// previousID is the previous_response_id of a response object, "" if none.
func previousID(body []byte) string {
	s, _ := jsonscan.String(openai.Member(body, "previous_response_id"))
	return s
}

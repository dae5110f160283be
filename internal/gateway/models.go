package gateway

import (
	"encoding/json"
	"net/http"

	"github.com/llmgate/llmgate/internal/openai"
)

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// serveModels lists the models the caller's tenant may use.
func (g *Gateway) serveModels(w http.ResponseWriter, r *http.Request) {
	setRequestID(w, r)
	t, aerr := g.authenticate(r)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	list := struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{Object: "list", Data: []modelObject{}}
	for _, m := range g.opt.Models {
		if t.Models == nil || t.Models[m.ID] {
			list.Data = append(list.Data, modelObject{ID: m.ID, Object: "model", OwnedBy: m.OwnedBy})
		}
	}
	writeJSON(w, http.StatusOK, list)
}

// serveModel describes one model, as GET /v1/models/{model} does.
func (g *Gateway) serveModel(w http.ResponseWriter, r *http.Request) {
	setRequestID(w, r)
	t, aerr := g.authenticate(r)
	if aerr != nil {
		aerr.Write(w)
		return
	}
	id := r.PathValue("model")
	for _, m := range g.opt.Models {
		if m.ID == id && (t.Models == nil || t.Models[id]) {
			writeJSON(w, http.StatusOK, modelObject{ID: m.ID, Object: "model", OwnedBy: m.OwnedBy})
			return
		}
	}
	errf(http.StatusNotFound, openai.TypeInvalidRequest, "model_not_found", "model",
		"The model '%s' does not exist or you do not have access to it.", id).Write(w)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		errf(http.StatusInternalServerError, openai.TypeServer, "internal_error", "", "The answer could not be encoded.").Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

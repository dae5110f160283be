package sim

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/llmgate/llmgate/internal/tokens"
)

// The other OpenAI routes, as much of them as a gateway test needs:
// moderations, image generation and audio transcription (with the usage
// their answers carry), and files and batches kept per key.

// objects holds the files and batches created, per key; at most
// maxStoredResponses of each kind.
type objects struct {
	mu sync.Mutex // protects m
	m  map[string]storedObject
}

type storedObject struct {
	key  string
	body []byte
}

func (o *objects) put(id, key string, v any) []byte {
	b, _ := json.Marshal(v)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]storedObject{}
	}
	if len(o.m) >= maxStoredResponses {
		for k := range o.m { // forget one: the simulator is not a store
			delete(o.m, k)
			break
		}
	}
	o.m[id] = storedObject{key: key, body: b}
	return b
}

func (o *objects) get(id, key string) []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	if v, ok := o.m[id]; ok && v.key == key {
		return v.body
	}
	return nil
}

func (s *Server) otherRoutes() {
	s.mux.HandleFunc("POST /v1/moderations", s.handleModeration)
	s.mux.HandleFunc("POST /v1/images/generations", s.handleImage)
	s.mux.HandleFunc("POST /v1/audio/transcriptions", s.handleTranscription)
	s.mux.HandleFunc("POST /v1/files", s.handleFileUpload)
	s.mux.HandleFunc("GET /v1/files/{id}", s.handleGetObject(&s.files))
	s.mux.HandleFunc("POST /v1/batches", s.handleBatch)
	s.mux.HandleFunc("GET /v1/batches/{id}", s.handleGetObject(&s.batches))
}

// acceptJSON authenticates, reads a JSON body and admits one request of
// model (RPM and concurrency; cost tokens on TPM).
func (s *Server) acceptOther(w http.ResponseWriter, r *http.Request, model string, cost int64) (string, func(), bool) {
	key, ok := s.authenticate(w, r)
	if !ok {
		return "", nil, false
	}
	release, ok := s.admit(w, key, model, cost)
	if !ok {
		return "", nil, false
	}
	return key, release, true
}

func (s *Server) handleModeration(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if e := decodeJSON(body, &req); e != nil {
		e.write(w)
		return
	}
	if req.Model == "" {
		req.Model = "omni-moderation-latest"
	}
	key, release, ok := s.acceptOther(w, r, req.Model, 1)
	if !ok {
		return
	}
	defer release()
	s.count(key, func(k *KeyStats) { k.Calls++ })
	writeJSON(w, http.StatusOK, map[string]any{"id": fmt.Sprintf("modr-sim%016x", s.seq.Add(1)), "model": req.Model,
		"results": []map[string]any{{"flagged": false, "categories": map[string]bool{}, "category_scores": map[string]float64{}}}})
}

func (s *Server) handleImage(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		Model  string `json:"model"`
		Prompt string `json:"prompt"`
	}
	if e := decodeJSON(body, &req); e != nil {
		e.write(w)
		return
	}
	if req.Model == "" || req.Prompt == "" {
		invalidRequest(w, "prompt", "model and prompt are required.")
		return
	}
	in := int64(tokens.Text("gpt-4o", req.Prompt))
	const out = 272 // a low-quality square image's output tokens
	key, release, ok := s.acceptOther(w, r, req.Model, in+out)
	if !ok {
		return
	}
	defer release()
	s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += in; k.CompletionTokens += out })
	img := sha256.Sum256([]byte(req.Prompt))
	writeJSON(w, http.StatusOK, map[string]any{"created": time.Now().Unix(),
		"data":  []map[string]string{{"b64_json": base64.StdEncoding.EncodeToString(img[:])}},
		"usage": map[string]any{"input_tokens": in, "output_tokens": out, "total_tokens": in + out, "input_tokens_details": map[string]int64{"text_tokens": in, "image_tokens": 0}}})
}

func (s *Server) handleTranscription(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	if err := r.ParseMultipartForm(1 << 20); err != nil {
		invalidRequest(w, "file", "The request must be a multipart form with a file and a model.")
		return
	}
	model := r.FormValue("model")
	f, _, err := r.FormFile("file")
	if model == "" || err != nil {
		invalidRequest(w, "file", "file and model are required.")
		return
	}
	audio, _ := io.ReadAll(io.LimitReader(f, s.cfg.MaxBodyBytes))
	f.Close()
	in := int64(len(audio)/100 + 1) // audio tokens, roughly
	text := joinWords(answerWords(sha256.Sum256(audio)))
	out := int64(tokens.Text("gpt-4o", text))
	key, release, ok := s.acceptOther(w, r, model, in+out)
	if !ok {
		return
	}
	defer release()
	s.count(key, func(k *KeyStats) { k.Calls++; k.PromptTokens += in; k.CompletionTokens += out })
	writeJSON(w, http.StatusOK, map[string]any{"text": text,
		"usage": map[string]any{"type": "tokens", "input_tokens": in, "output_tokens": out, "total_tokens": in + out}})
}

func (s *Server) handleFileUpload(w http.ResponseWriter, r *http.Request) {
	key, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	if err := r.ParseMultipartForm(1 << 20); err != nil {
		invalidRequest(w, "file", "The request must be a multipart form with a file and a purpose.")
		return
	}
	f, hdr, err := r.FormFile("file")
	if err != nil || r.FormValue("purpose") == "" {
		invalidRequest(w, "file", "file and purpose are required.")
		return
	}
	n, _ := io.Copy(io.Discard, f)
	f.Close()
	id := fmt.Sprintf("file-sim%016x", s.seq.Add(1))
	s.count(key, func(k *KeyStats) { k.Calls++ })
	b := s.files.put(id, key, map[string]any{"id": id, "object": "file", "bytes": n, "created_at": time.Now().Unix(),
		"filename": hdr.Filename, "purpose": r.FormValue("purpose"), "status": "processed"})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request) {
	key, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		InputFileID      string `json:"input_file_id"`
		Endpoint         string `json:"endpoint"`
		CompletionWindow string `json:"completion_window"`
	}
	if e := decodeJSON(body, &req); e != nil {
		e.write(w)
		return
	}
	if s.files.get(req.InputFileID, key) == nil {
		writeError(w, http.StatusNotFound, "invalid_request_error", "", "input_file_id", fmt.Sprintf("No such File object: %s", req.InputFileID))
		return
	}
	id := fmt.Sprintf("batch_sim%016x", s.seq.Add(1))
	s.count(key, func(k *KeyStats) { k.Calls++ })
	b := s.batches.put(id, key, map[string]any{"id": id, "object": "batch", "endpoint": req.Endpoint, "input_file_id": req.InputFileID,
		"completion_window": req.CompletionWindow, "status": "validating", "created_at": time.Now().Unix()})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) handleGetObject(o *objects) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, ok := s.authenticate(w, r)
		if !ok {
			return
		}
		b := o.get(r.PathValue("id"), key)
		if b == nil {
			writeError(w, http.StatusNotFound, "invalid_request_error", "", "id", "No such object: "+strings.TrimSpace(r.PathValue("id")))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}
}

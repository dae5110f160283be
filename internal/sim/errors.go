package sim

import (
	"encoding/json"
	"net/http"
)

// apiError is OpenAI's error body: {"error":{"message","type","param","code"}}.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func strp(s string) *string { return &s }

// writeError answers status with OpenAI's error shape. code and param may
// be empty (sent as null).
func writeError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	e := apiError{Error: apiErrorBody{Message: msg, Type: typ}}
	if code != "" {
		e.Error.Code = strp(code)
	}
	if param != "" {
		e.Error.Param = strp(param)
	}
	writeJSON(w, status, e)
}

func invalidRequest(w http.ResponseWriter, param, msg string) {
	writeError(w, http.StatusBadRequest, "invalid_request_error", "", param, msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only our own types are marshalled; this is a bug
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"The simulator failed to encode its answer.","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

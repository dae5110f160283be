package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"

	"github.com/llmgate/llmgate/internal/openai"
)

type apiError = openai.Error

func errf(status int, typ, code, param, format string, args ...any) *apiError {
	return openai.Errorf(status, typ, code, param, format, args...)
}

// validRequestID accepts a client's x-request-id only if it is short and
// plain, so it can be logged and echoed safely.
func validRequestID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// setRequestID sets x-request-id on the response (the client's, if it sent
// a usable one) and returns it.
func setRequestID(w http.ResponseWriter, r *http.Request) []string {
	id := r.Header.Get("X-Request-Id")
	if !validRequestID(id) {
		var b [12]byte
		_, _ = rand.Read(b[:])
		var text [4 + 2*len(b)]byte
		copy(text[:], "req_")
		hex.Encode(text[4:], b[:])
		id = string(text[:])
	}
	v := []string{id}
	w.Header()["X-Request-Id"] = v
	return v
}

// jsonContentType is a Content-Type header value, shared: header values
// are only read once set.
var jsonContentType = []string{"application/json"}

// withHeaders adds the headers set by f to e's response.
func withHeaders(e *apiError, f func(http.Header)) *apiError {
	if e.Header == nil {
		e.Header = make(http.Header)
	}
	f(e.Header)
	return e
}

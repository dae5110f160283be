// Package openai holds the parts of the OpenAI HTTP API the gateway reads and
// writes: the request fields it needs, usage in answers and streams, and the
// error shape every client SDK understands.
package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Error types as OpenAI sends them in error.type.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeNotFound       = "not_found_error"
	TypeRateLimit      = "rate_limit_exceeded"
	TypeQuota          = "insufficient_quota"
	TypeServer         = "server_error"
	TypeUpstream       = "upstream_error"
	TypeTimeout        = "timeout_error"
	TypeUnavailable    = "service_unavailable"
)

// Error is an API error as the client sees it:
// {"error":{"message","type","param","code"}} with an HTTP status.
type Error struct {
	Status  int
	Type    string
	Code    string // empty is sent as null
	Param   string // empty is sent as null
	Message string
	// Header holds extra response headers (retry-after, x-ratelimit-*).
	Header http.Header
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

// Errorf returns an Error with a formatted message.
func Errorf(status int, typ, code, param, format string, args ...any) *Error {
	return &Error{Status: status, Type: typ, Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

// BadRequest is a 400 about param.
func BadRequest(param, format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, TypeInvalidRequest, "", param, format, args...)
}

// Body returns e in OpenAI's JSON shape, newline-terminated.
func (e *Error) Body() []byte {
	b := make([]byte, 0, 96+len(e.Message))
	b = append(b, `{"error":{"message":`...)
	b = appendString(b, e.Message)
	b = append(b, `,"type":`...)
	b = appendString(b, e.Type)
	b = append(b, `,"param":`...)
	b = appendNullable(b, e.Param)
	b = append(b, `,"code":`...)
	b = appendNullable(b, e.Code)
	return append(b, "}}\n"...)
}

// appendNullable appends s as a JSON string, or null when empty.
func appendNullable(b []byte, s string) []byte {
	if s == "" {
		return append(b, "null"...)
	}
	return appendString(b, s)
}

// appendString appends s as a JSON string. Messages can quote client input
// (a model name), so invalid UTF-8 and control bytes must come out valid.
func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// Write sends e to w with its status.
func (e *Error) Write(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range e.Header {
		h[k] = v
	}
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.Body())
}

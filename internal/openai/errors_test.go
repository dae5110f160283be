package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkErrorBody asserts that b is e in OpenAI's error shape: one line of
// valid JSON holding exactly error.{message,type,param,code}, param and code
// null when empty, and every string equal to e's (invalid UTF-8 replaced).
func checkErrorBody(t *testing.T, e *Error, b []byte) {
	t.Helper()
	if !bytes.HasSuffix(b, []byte("\n")) || bytes.Count(b, []byte("\n")) != 1 {
		t.Fatalf("body is not one newline-terminated line: %q", b)
	}
	if !json.Valid(b) {
		t.Fatalf("body is not valid JSON: %q", b)
	}
	var outer map[string]json.RawMessage
	if err := json.Unmarshal(b, &outer); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	if len(outer) != 1 || outer["error"] == nil {
		t.Fatalf("body has members %v, want only \"error\": %q", slices.Sorted(mapKeys(outer)), b)
	}
	var inner map[string]*string
	if err := json.Unmarshal(outer["error"], &inner); err != nil {
		t.Fatalf("error object %q: %v", outer["error"], err)
	}
	if got, want := slices.Sorted(mapKeys(inner)), []string{"code", "message", "param", "type"}; !slices.Equal(got, want) {
		t.Fatalf("error members %v, want %v: %q", got, want, b)
	}
	for _, f := range []struct {
		name     string
		want     string
		nullable bool
	}{
		{"message", e.Message, false}, {"type", e.Type, false},
		{"param", e.Param, true}, {"code", e.Code, true},
	} {
		got := inner[f.name]
		if f.nullable && f.want == "" {
			if got != nil {
				t.Errorf("%s = %q, want null: %q", f.name, *got, b)
			}
			continue
		}
		if got == nil {
			t.Errorf("%s is null, want %q: %q", f.name, f.want, b)
			continue
		}
		if want := validUTF8(f.want); *got != want {
			t.Errorf("%s = %q, want %q", f.name, *got, want)
		}
	}
}

// validUTF8 is s with every invalid byte replaced by U+FFFD, as
// encoding/json does.
func validUTF8(s string) string {
	var b strings.Builder
	for _, r := range s { // an invalid byte ranges as one RuneError of width 1
		b.WriteRune(r)
	}
	return b.String()
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestErrorBody(t *testing.T) {
	for _, msg := range []string{
		"",
		"You must provide a model parameter.",
		`The model 'gpt-"4o"\x' does not exist.`,
		"line\nbreak\r\ttab",
		"control \x00\x01\x1f\x7f bytes",
		"invalid utf-8 \xff\xfe\xc3 here",
		"html <script>&amp;</script>",
		"separators \u2028\u2029 and emoji 🚀",
		strings.Repeat("long ", 1000),
	} {
		for _, e := range []*Error{
			BadRequest("", "%s", msg),
			BadRequest("model", "%s", msg),
			Errorf(http.StatusTooManyRequests, TypeRateLimit, "rate_limit_exceeded", "", "%s", msg),
			{Status: 500, Type: msg, Code: msg, Param: msg, Message: msg},
			{Status: 502},
		} {
			checkErrorBody(t, e, e.Body())
		}
	}
}

func TestErrorBodyExact(t *testing.T) {
	e := BadRequest("model", "You must provide a model parameter.")
	want := `{"error":{"message":"You must provide a model parameter.","type":"invalid_request_error","param":"model","code":null}}` + "\n"
	if got := string(e.Body()); got != want {
		t.Fatalf("Body() = %s, want %s", got, want)
	}
	e = Errorf(http.StatusTooManyRequests, TypeRateLimit, "rate_limit_exceeded", "", "Slow down.")
	want = `{"error":{"message":"Slow down.","type":"rate_limit_exceeded","param":null,"code":"rate_limit_exceeded"}}` + "\n"
	if got := string(e.Body()); got != want {
		t.Fatalf("Body() = %s, want %s", got, want)
	}
}

func TestErrorf(t *testing.T) {
	e := Errorf(http.StatusNotFound, TypeNotFound, "model_not_found", "model", "The model '%s' does not exist (%d).", "x", 3)
	if e.Status != 404 || e.Type != TypeNotFound || e.Code != "model_not_found" || e.Param != "model" ||
		e.Message != "The model 'x' does not exist (3)." || e.Header != nil {
		t.Fatalf("Errorf = %+v", *e)
	}
	if got := e.Error(); got != "404 not_found_error: The model 'x' does not exist (3)." {
		t.Fatalf("Error() = %q", got)
	}
	b := BadRequest("n", "bad %s", "n")
	if b.Status != http.StatusBadRequest || b.Type != TypeInvalidRequest || b.Param != "n" || b.Code != "" || b.Message != "bad n" {
		t.Fatalf("BadRequest = %+v", *b)
	}
	// *Error is an error that errors.As finds through wrapping.
	var got *Error
	if err := fmt.Errorf("wrapped: %w", error(b)); !errors.As(err, &got) || got != b {
		t.Fatalf("errors.As did not find the *Error")
	}
}

func TestErrorWrite(t *testing.T) {
	e := Errorf(http.StatusServiceUnavailable, TypeUnavailable, "", "", "Try again.")
	e.Header = http.Header{"Retry-After": {"7"}, "Content-Length": {"1"}}
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Length", "12345") // left from a response that was being built
	rec.Header().Set("Content-Type", "text/event-stream")
	e.Write(rec)
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503", rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if ra := rec.Header().Get("Retry-After"); ra != "7" {
		t.Errorf("Retry-After %q, want the Error's 7", ra)
	}
	if cl, ok := rec.Header()["Content-Length"]; ok {
		t.Errorf("stale Content-Length %q kept", cl)
	}
	if !bytes.Equal(rec.Body.Bytes(), e.Body()) {
		t.Errorf("wrote %q, want %q", rec.Body.Bytes(), e.Body())
	}
	checkErrorBody(t, e, rec.Body.Bytes())
}

// FuzzErrorBody: any message, type, param and code give a body in OpenAI's
// shape that decodes back to them.
func FuzzErrorBody(f *testing.F) {
	f.Add("You must provide a model parameter.", TypeInvalidRequest, "model", "")
	f.Add("bad \xff\xfe utf-8 \x00 and \u2028", "", "", "code")
	f.Add(`"}}]{`, `\`, "\n", "\"")
	f.Fuzz(func(t *testing.T, msg, typ, param, code string) {
		e := &Error{Status: 400, Type: typ, Param: param, Code: code, Message: msg}
		checkErrorBody(t, e, e.Body())
		if !utf8.Valid(e.Body()) {
			t.Fatalf("body is not UTF-8: %q", e.Body())
		}
	})
}

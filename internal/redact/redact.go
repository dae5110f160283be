// Package redact removes configured secrets (provider keys, admin and metrics tokens) from bytes, headers and log records before they leave the gateway.
package redact

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
)

// Mask replaces every secret found.
const Mask = "[redacted]"

// MinLen is the shortest secret redacted: a shorter one would match
// ordinary text, and no real key is that short.
const MinLen = 8

// Redactor knows the secrets to remove. The zero value and nil remove
// nothing. It is safe for concurrent use.
type Redactor struct {
	secrets []string // longest first, so a secret inside another goes last
}

// New returns a Redactor for secrets; empty ones and ones shorter than
// MinLen are left out.
func New(secrets ...string) *Redactor {
	r := &Redactor{}
	for _, s := range secrets {
		if len(s) >= MinLen && !slices.Contains(r.secrets, s) {
			r.secrets = append(r.secrets, s)
		}
	}
	slices.SortFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
	return r
}

// Empty reports whether r removes nothing.
func (r *Redactor) Empty() bool { return r == nil || len(r.secrets) == 0 }

// Bytes returns b with every secret replaced by Mask. It returns b itself,
// not a copy, when b holds none, which is the common case.
func (r *Redactor) Bytes(b []byte) []byte {
	if r.Empty() {
		return b
	}
	for _, s := range r.secrets {
		if bytes.Contains(b, []byte(s)) {
			b = bytes.ReplaceAll(b, []byte(s), []byte(Mask))
		}
	}
	return b
}

// String is Bytes for a string.
func (r *Redactor) String(s string) string {
	if r.Empty() {
		return s
	}
	for _, sec := range r.secrets {
		if strings.Contains(s, sec) {
			s = strings.ReplaceAll(s, sec, Mask)
		}
	}
	return s
}

// Header redacts every value of h in place. Values are replaced in a new
// slice: the old one may be shared with the response it came from.
func (r *Redactor) Header(h http.Header) {
	if r.Empty() {
		return
	}
	for k, vs := range h {
		for i, v := range vs {
			if red := r.String(v); red != v {
				vs = slices.Clone(vs)
				vs[i] = red
				h[k] = vs
			}
		}
	}
}

// Handler wraps a slog.Handler so that no record it writes carries a
// secret: the message and every string, error and stringer value are
// redacted. Other kinds (numbers, times) cannot hold one.
func (r *Redactor) Handler(h slog.Handler) slog.Handler {
	if r.Empty() {
		return h
	}
	return &handler{next: h, r: r}
}

type handler struct {
	next slog.Handler
	r    *Redactor
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.r.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = h.attr(a)
	}
	return &handler{next: h.next.WithAttrs(red), r: h.r}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{next: h.next.WithGroup(name), r: h.r}
}

// attr redacts one attribute, groups included.
func (h *handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.r.String(v.String()))
	case slog.KindGroup:
		g := v.Group()
		red := make([]any, len(g))
		for i, ga := range g {
			red[i] = h.attr(ga)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, h.r.String(x.Error()))
		case interface{ String() string }:
			return slog.String(a.Key, h.r.String(x.String()))
		case []byte:
			return slog.String(a.Key, string(h.r.Bytes(x)))
		case string:
			return slog.String(a.Key, h.r.String(x))
		}
		// Anything else is printed with %+v: redact that text.
		return slog.String(a.Key, h.r.String(v.String()))
	}
	return slog.Attr{Key: a.Key, Value: v}
}

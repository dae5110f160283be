package gateway

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgate/llmgate/internal/openai"
)

// traceContext is W3C Trace Context (traceparent, tracestate): accepted
// from clients, sent upstream.
var traceContext = propagation.TraceContext{}

// traceRequest starts the request's span, a child of the client's
// traceparent if it sent one, and returns its context. Without a Tracer
// it does nothing (the client's traceparent is still forwarded upstream as
// it came, see forwardHeaders).
func (g *Gateway) traceRequest(ctx context.Context, r *http.Request, c *call, ep openai.Endpoint) context.Context {
	if g.opt.Tracer == nil {
		return ctx
	}
	ctx = traceContext.Extract(ctx, propagation.HeaderCarrier(r.Header))
	ctx, c.access.span = g.opt.Tracer.Start(ctx, "llmgate "+ep.String(), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(c.start), trace.WithAttributes(attribute.String("llmgate.request_id", c.id)))
	c.access.tctx = ctx
	return ctx
}

// endRequestSpan ends the request's span with what the access log says.
func (c *call) endRequestSpan(model string, status int, dep string) {
	s := c.access.span
	if s == nil {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String("llmgate.outcome", c.outcome),
		attribute.Int("http.response.status_code", status),
	}
	if c.tenant != nil {
		attrs = append(attrs, attribute.String("llmgate.tenant", c.tenant.Name))
	}
	if model != "" && c.targets != nil {
		attrs = append(attrs, attribute.String("gen_ai.request.model", model))
	}
	if dep != "" {
		attrs = append(attrs, attribute.String("llmgate.deployment", dep))
	}
	if u := c.access.usage; u != nil {
		attrs = append(attrs, attribute.Int64("gen_ai.usage.input_tokens", u.PromptTokens), attribute.Int64("gen_ai.usage.output_tokens", u.CompletionTokens))
	}
	s.SetAttributes(attrs...)
	if status >= 500 {
		s.SetStatus(codes.Error, c.outcome)
	}
	s.End()
}

// stage starts the span of one stage of c's pipeline, under the request's
// span; end ends it. Without a Tracer both are free.
func (g *Gateway) stage(ctx context.Context, c *call, name string) (context.Context, func()) {
	if c.access.span == nil {
		return ctx, func() {}
	}
	ctx, s := g.opt.Tracer.Start(ctx, name)
	return ctx, func() { s.End() }
}

// stageSince records a stage that already ran, from start to now.
func (g *Gateway) stageSince(c *call, name string, start time.Time) {
	if c.access.span == nil {
		return
	}
	_, s := g.opt.Tracer.Start(c.access.tctx, name, trace.WithTimestamp(start))
	s.End()
}

// traceUpstream starts the span of an upstream call and puts its context
// in the call's headers (traceparent), so that the provider's spans are
// its children; end ends it, marking a failure.
func (g *Gateway) traceUpstream(ctx context.Context, c *call, dep string, h http.Header) func(error) {
	if c.access.span == nil {
		return func(error) {}
	}
	ctx, s := g.opt.Tracer.Start(ctx, "upstream", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("llmgate.deployment", dep)))
	traceContext.Inject(ctx, propagation.HeaderCarrier(h))
	return func(err error) {
		if err != nil {
			s.SetStatus(codes.Error, "upstream call failed")
		}
		s.End()
	}
}

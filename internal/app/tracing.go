package app

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgate/llmgate/internal/config"
)

// tracingFlush bounds the export of the spans left at shutdown.
const tracingFlush = 5 * time.Second

// newTracer returns the tracer of cfg's spans, exported in batches over
// OTLP/HTTP, and how to flush and stop it; nil when tracing is off.
func newTracer(cfg config.Tracing, log *slog.Logger) (trace.Tracer, func(), error) {
	if !cfg.On() {
		return nil, func() {}, nil
	}
	endpoint := strings.TrimRight(cfg.OTLPEndpoint, "/")
	if !strings.HasSuffix(endpoint, "/v1/traces") {
		endpoint += "/v1/traces"
	}
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, nil, err
	}
	name := cfg.ServiceName
	if name == "" {
		name = "llmgate"
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", name))),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.Ratio()))),
	)
	// OpenTelemetry reports export failures through a process-wide
	// handler; this process has one gateway, so it is this one's logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: spans could not be exported", "err", err)
	}))
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracingFlush)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("tracing: the last spans could not be exported", "err", err)
		}
	}
	return tp.Tracer("github.com/llmgate/llmgate/internal/gateway"), stop, nil
}

package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/openai"
)

// accessInfo is what the access log line of a request says beyond what the
// call holds already: filled by the stages as they run (all on the
// request's goroutine).
type accessInfo struct {
	budgetWait, admissionWait, sessionWait time.Duration
	// upstreamStart is when the upstream call started (metrics).
	upstreamStart time.Time
	// span is the request's trace span (nil when tracing is off), tctx
	// its context (tracing.go).
	span trace.Span
	tctx context.Context
	// usage is what the upstream call used (nil: none, or unknown);
	// microUSD its price, known when priced.
	usage    *openai.Usage
	microUSD int64
	priced   bool
}

// used notes what the request used on its deployment's model.
func (g *Gateway) used(c *call, model string, usage *openai.Usage) {
	if usage == nil {
		return
	}
	c.access.usage = usage
	c.access.microUSD, c.access.priced = g.opt.Budgets.Prices().Cost(model, budget.Usage{
		PromptTokens: usage.PromptTokens, CompletionTokens: usage.CompletionTokens, CachedTokens: usage.Cached(),
	})
}

// usageHeaders sets the answer's token and cost headers (a non-streamed
// answer: its usage is known before the first byte is sent).
func (g *Gateway) usageHeaders(h http.Header, c *call, model string, usage *openai.Usage) {
	if usage == nil {
		return
	}
	g.used(c, model, usage)
	v := make([]string, 3) // one allocation for the three headers' values
	v[0], v[1] = strconv.FormatInt(usage.PromptTokens, 10), strconv.FormatInt(usage.CompletionTokens, 10)
	h["X-Llmgate-Prompt-Tokens"] = v[0:1:1]
	h["X-Llmgate-Completion-Tokens"] = v[1:2:2]
	if c.access.priced {
		v[2] = usdText(c.access.microUSD)
		h["X-Llmgate-Cost-Usd"] = v[2:3:3]
	}
}

// usdText writes µUSD as a plain decimal number of dollars ("0.000150").
func usdText(micro int64) string {
	if micro < 0 {
		micro = 0
	}
	var b [32]byte
	out := strconv.AppendInt(b[:0], micro/1_000_000, 10)
	out = append(out, '.')
	frac := micro % 1_000_000
	for d := int64(100_000); d > 0; d /= 10 {
		out = append(out, byte('0'+frac/d%10))
	}
	return string(out)
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// accessLog writes the request's access log line at info: who, what, where
// it went, how it ended, what it used and cost, and how long it waited.
// Never a key, a prompt or an answer.
func (g *Gateway) accessLog(ctx context.Context, c *call, ep openai.Endpoint, model string, status int, h http.Header) {
	if !g.opt.AccessLog || !g.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	tenant := ""
	if c.tenant != nil {
		tenant = c.tenant.Name
	}
	attrs := make([]slog.Attr, 0, 20)
	attrs = append(attrs,
		slog.String("request_id", c.id),
		slog.String("endpoint", ep.String()),
		slog.String("tenant", tenant),
		slog.String("model", model),
		slog.String("deployment", h.Get("X-Llmgate-Deployment")),
		slog.Int("status", status),
		slog.String("outcome", c.outcome),
		slog.Float64("duration_ms", ms(time.Since(c.start))),
	)
	if c.req != nil && c.req.Stream {
		attrs = append(attrs, slog.Bool("stream", true))
	}
	if u := c.access.usage; u != nil {
		attrs = append(attrs,
			slog.Int64("prompt_tokens", u.PromptTokens),
			slog.Int64("completion_tokens", u.CompletionTokens))
		if n := u.Cached(); n > 0 {
			attrs = append(attrs, slog.Int64("cached_tokens", n))
		}
		if c.access.priced {
			attrs = append(attrs, slog.String("cost_usd", usdText(c.access.microUSD)))
		}
	}
	if v := h.Get("X-Llmgate-Cache"); v != "" {
		attrs = append(attrs, slog.String("cache", v))
	}
	if v := h.Get("X-Llmgate-Dedup"); v != "" {
		attrs = append(attrs, slog.String("dedup", v))
	}
	if c.session != "" {
		attrs = append(attrs, slog.Float64("session_wait_ms", ms(c.access.sessionWait)))
	}
	attrs = append(attrs,
		slog.Float64("budget_wait_ms", ms(c.access.budgetWait)),
		slog.Float64("admission_wait_ms", ms(c.access.admissionWait)))
	if c.access.span != nil {
		if sc := c.access.span.SpanContext(); sc.IsValid() {
			attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
		}
	}
	g.log.LogAttrs(ctx, slog.LevelInfo, "access", attrs...)
}

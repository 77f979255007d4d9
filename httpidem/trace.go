package httpidem

import (
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// SpanName is the name of the span the middleware makes for each request
// it protects or rejects when Options.TracerProvider is set.
const SpanName = "idemkv.request"

// tracerName is the instrumentation scope of the middleware's spans.
const tracerName = "github.com/idemkv/idemkv/httpidem"

// startSpan starts q's span, a child of the span in r's context, and
// returns r with the span in its context so that the handler's own spans
// (a call downstream) are its children.
func (p *protected) startSpan(r *http.Request, q *request) *http.Request {
	ctx, span := p.m.tracer.Start(r.Context(), SpanName, trace.WithSpanKind(trace.SpanKindInternal))
	q.span = span
	return r.WithContext(ctx)
}

// endSpan sets q's attributes on its span, all at once at the end, when
// they are known, and ends it. A store error is recorded on the span;
// a 5xx answer sets its status to Error.
func (p *protected) endSpan(q *request) {
	span := q.span
	q.span = nil
	attrs := make([]attribute.KeyValue, 0, 8)
	if q.id.Key != "" {
		attrs = append(attrs,
			attribute.String("idemkv.tenant", q.id.Tenant),
			attribute.String("idemkv.endpoint", q.id.Endpoint),
			attribute.String("idemkv.key_hash", q.keyHash()),
		)
	}
	attrs = append(attrs,
		attribute.String("idemkv.request_id", q.requestID()),
		attribute.String("idemkv.disposition", string(q.report.Disposition)),
	)
	if q.attempt > 0 {
		attrs = append(attrs, attribute.Int("idemkv.attempt", int(q.attempt)))
	}
	if q.report.Renewals > 0 {
		attrs = append(attrs, attribute.Int("idemkv.renewals", q.report.Renewals))
	}
	if q.report.Status > 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", q.report.Status))
	}
	span.SetAttributes(attrs...)
	if err := q.report.Err; err != nil {
		// Recorded as RecordError would, but with the key taken out of
		// the message: the stores name it in their errors.
		span.AddEvent("exception", trace.WithAttributes(
			attribute.String("exception.type", fmt.Sprintf("%T", err)),
			attribute.String("exception.message", q.redact(err.Error())),
		))
	}
	if q.report.Status >= 500 || q.report.Disposition == Panicked {
		span.SetStatus(codes.Error, string(q.report.Disposition))
	}
	span.End()
}

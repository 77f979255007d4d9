package httpidem_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
)

// spanAttrs returns a span's attributes by key.
func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTraceSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	handlerSpans := make(chan trace.SpanContext, 10)
	h := func(w http.ResponseWriter, r *http.Request) {
		handlerSpans <- trace.SpanContextFromContext(r.Context())
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte("fail")) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}
	f := buildFixture(t, httpidem.Route{}, h, nil, func(o *httpidem.Options) { o.TracerProvider = tp })
	id := idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: secretKey}
	rid := map[string]string{httpidem.HeaderRequestID: "req-t"}

	// A first run: one span, the handler's context carries it.
	_, rep := f.doWith(secretBody, secretKey, rid)
	require.Equal(t, httpidem.Stored, rep.Disposition)
	spans := rec.Ended()
	require.Len(t, spans, 1)
	s := spans[0]
	assert.Equal(t, httpidem.SpanName, s.Name())
	assert.Equal(t, s.SpanContext(), <-handlerSpans, "the handler runs under the middleware's span")
	a := spanAttrs(s)
	assert.Equal(t, "acct_1", a["idemkv.tenant"].AsString())
	assert.Equal(t, id.Endpoint, a["idemkv.endpoint"].AsString())
	assert.Equal(t, id.Hash(), a["idemkv.key_hash"].AsString())
	assert.Equal(t, "req-t", a["idemkv.request_id"].AsString())
	assert.Equal(t, "stored", a["idemkv.disposition"].AsString())
	assert.EqualValues(t, 1, a["idemkv.attempt"].AsInt64())
	assert.EqualValues(t, 201, a["http.response.status_code"].AsInt64())
	assert.Equal(t, codes.Unset, s.Status().Code)

	// A replay: its own span, the attempt of the record replayed.
	_, rep = f.doWith(secretBody, secretKey, rid)
	require.Equal(t, httpidem.Replayed, rep.Disposition)
	spans = rec.Ended()
	require.Len(t, spans, 2)
	a = spanAttrs(spans[1])
	assert.Equal(t, "replayed", a["idemkv.disposition"].AsString())
	assert.EqualValues(t, 1, a["idemkv.attempt"].AsInt64())

	// A 5xx from the handler sets the span's status to Error.
	_, rep = f.doWith(`{"fail":1}`, secretKey+"-2", rid)
	require.Equal(t, httpidem.Released, rep.Disposition)
	<-handlerSpans
	spans = rec.Ended()
	require.Len(t, spans, 3)
	assert.Equal(t, codes.Error, spans[2].Status().Code)
	assert.Equal(t, "released", spanAttrs(spans[2])["idemkv.disposition"].AsString())

	// A store error is recorded on the span, without the key the store's
	// error names.
	require.NoError(t, f.eng.Close())
	_, rep = f.doWith(secretBody, secretKey+"-3", rid)
	require.Equal(t, httpidem.StoreError, rep.Disposition)
	spans = rec.Ended()
	require.Len(t, spans, 4)
	s = spans[3]
	assert.Equal(t, codes.Error, s.Status().Code)
	require.Len(t, s.Events(), 1)
	assert.Equal(t, "exception", s.Events()[0].Name)
	var msg string
	for _, kv := range s.Events()[0].Attributes {
		if kv.Key == "exception.message" {
			msg = kv.Value.AsString()
		}
	}
	assert.Contains(t, msg, "closed")

	// The raw key and the body are on no span.
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			assert.NotContains(t, kv.Value.String(), "jane.doe", "%s", kv.Key)
			assert.NotContains(t, kv.Value.String(), "SECRET-BODY-MARKER", "%s", kv.Key)
		}
		for _, e := range s.Events() {
			for _, kv := range e.Attributes {
				assert.NotContains(t, kv.Value.String(), "jane.doe", "%s", kv.Key)
			}
		}
	}
}

func TestTraceSpanIsChildOfTheRequestSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var parent trace.SpanContext
	f := buildFixture(t, httpidem.Route{}, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }, nil,
		func(o *httpidem.Options) { o.TracerProvider = tp })
	// What an HTTP server instrumentation (otelhttp) does: a server span
	// in the request's context, around the middleware.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tp.Tracer("server").Start(r.Context(), "POST /v1/things")
		defer span.End()
		parent = span.SpanContext()
		f.srv.Config.Handler.ServeHTTP(w, r.WithContext(ctx))
	}))
	defer srv.Close()
	req, err := http.NewRequest("POST", srv.URL+route, strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer acct_1")
	req.Header.Set(httpidem.HeaderKey, "k")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, httpidem.Stored, f.report().Disposition)
	var ours sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == httpidem.SpanName {
			ours = s
		}
	}
	require.NotNil(t, ours)
	assert.Equal(t, parent.SpanID(), ours.Parent().SpanID())
	assert.Equal(t, parent.TraceID(), ours.SpanContext().TraceID())
}

func TestTraceNilProviderReadsNoGlobal(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	inHandler := make(chan trace.SpanContext, 1)
	f := buildFixture(t, httpidem.Route{}, func(w http.ResponseWriter, r *http.Request) {
		inHandler <- trace.SpanContextFromContext(r.Context())
		w.WriteHeader(http.StatusCreated)
	}, nil, nil)
	_, rep := f.doWith(`{}`, "k", nil)
	require.Equal(t, httpidem.Stored, rep.Disposition)
	assert.False(t, (<-inHandler).IsValid(), "no span in the handler's context")
	assert.Empty(t, rec.Started(), "the global provider made no span")
}

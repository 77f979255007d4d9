package httpidem_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/logtest"
)

// newLoggedFixture is a fixture whose middleware logs, at Debug and up,
// as JSON into the returned sink, for the test to take record by record
// (keeping all of it in all, for searches over everything a test logged).
func newLoggedFixture(t *testing.T, rt httpidem.Route, h http.HandlerFunc, rawKeys bool) (*fixture, *logtest.Log, *logtest.Log) {
	t.Helper()
	sink, all := &logtest.Log{}, &logtest.Log{}
	f := buildFixture(t, rt, h, nil, func(o *httpidem.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(io.MultiWriter(sink, all), &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.LogRawKeys = rawKeys
	})
	return f, sink, all
}

// doWith sends a request as tenant "acct_1" with key and the given extra
// headers, and waits for the middleware's report of it: by then
// everything the request logs has been logged.
func (f *fixture) doWith(body, key string, hdr map[string]string) (response, httpidem.Report) {
	f.t.Helper()
	r := f.send(body, key, hdr)
	return r, f.report()
}

// send is doWith without waiting for the report, for requests sent
// concurrently.
func (f *fixture) send(body, key string, hdr map[string]string) response {
	f.t.Helper()
	req, err := http.NewRequest("POST", f.srv.URL+route, strings.NewReader(body))
	require.NoError(f.t, err)
	req.Header.Set("Authorization", "Bearer acct_1")
	req.Header.Set(httpidem.HeaderKey, key)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := f.srv.Client().Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return response{resp.StatusCode, resp.Header, b}
}

// A key and a body no log line may contain: customer data.
const (
	secretKey  = "cust-jane.doe@example.com-order-4242"
	secretBody = `{"card":"4111111111111111","note":"SECRET-BODY-MARKER"}`
)

// want is a record's message, level and the attributes it must carry
// beside the ones every record carries.
type want struct {
	msg   string
	level string
	attrs map[string]any
}

// checkRecords checks that recs are exactly ws, in order, each naming the
// request by tenant, endpoint, key hash and request id.
func checkRecords(t *testing.T, recs []map[string]any, id idemkv.ID, requestID string, ws ...want) {
	t.Helper()
	require.Len(t, recs, len(ws), "records: %v", recs)
	for i, w := range ws {
		r := recs[i]
		assert.Equal(t, w.msg, r["msg"], "record %d", i)
		assert.Equal(t, w.level, r["level"], "record %d: %s", i, w.msg)
		assert.Equal(t, id.Tenant, r["tenant"], w.msg)
		assert.Equal(t, id.Endpoint, r["endpoint"], w.msg)
		assert.Equal(t, id.Hash(), r["key_hash"], w.msg)
		assert.Equal(t, requestID, r["request_id"], w.msg)
		for k, v := range w.attrs {
			assert.EqualValues(t, v, r[k], "%s: %s", w.msg, k)
		}
	}
}

func TestLogOneRecordPerStateChange(t *testing.T) {
	h := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte("fail")) {
			w.WriteHeader(http.StatusServiceUnavailable) // transient: the key is released
			return
		}
		w.Header().Set("Location", "/v1/things/t_1")
		w.WriteHeader(http.StatusCreated)
		w.Write(body) // the body goes back to the client, never to the log
	}
	f, sink, all := newLoggedFixture(t, httpidem.Route{}, h, false)
	id := idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: secretKey}
	rid := map[string]string{httpidem.HeaderRequestID: "req-0001"}

	r, rep := f.doWith(secretBody, secretKey, rid)
	require.Equal(t, http.StatusCreated, r.status)
	require.Equal(t, httpidem.Stored, rep.Disposition)
	recs := sink.Take(t)
	checkRecords(t, recs, id, "req-0001",
		want{"httpidem: key claimed", "INFO", map[string]any{"attempt": 1, "mode": "local"}},
		want{"httpidem: outcome stored", "INFO", map[string]any{"disposition": "stored", "status": 201}},
	)
	assert.NotZero(t, recs[0]["token"], "the claim's fencing token")
	assert.NotContains(t, recs[0], "operation_id", "local claims have none")

	// A replay changes nothing: one Debug record.
	_, rep = f.doWith(secretBody, secretKey, rid)
	require.Equal(t, httpidem.Replayed, rep.Disposition)
	checkRecords(t, sink.Take(t), id, "req-0001",
		want{"httpidem: outcome replayed", "DEBUG", map[string]any{"disposition": "replayed", "status": 201}})

	// The key reused with another body: refused, one Info record.
	_, rep = f.doWith(`{"other":1}`, secretKey, rid)
	require.Equal(t, httpidem.Mismatch, rep.Disposition)
	checkRecords(t, sink.Take(t), id, "req-0001",
		want{"httpidem: key reused with a different request", "INFO", map[string]any{"disposition": "mismatch"}})

	// A transient answer: claimed, then released.
	id2 := idemkv.ID{Tenant: id.Tenant, Endpoint: id.Endpoint, Key: secretKey + "-2"}
	_, rep = f.doWith(`{"fail":true}`, id2.Key, rid)
	require.Equal(t, httpidem.Released, rep.Disposition)
	checkRecords(t, sink.Take(t), id2, "req-0001",
		want{"httpidem: key claimed", "INFO", map[string]any{"attempt": 1}},
		want{"httpidem: key released", "INFO", map[string]any{"disposition": "released", "status": 503}},
	)

	out := all.String()
	assert.NotContains(t, out, secretKey, "the raw key is never logged by default")
	assert.NotContains(t, out, "jane.doe", "nor any part of it")
	assert.NotContains(t, out, "SECRET-BODY-MARKER", "bodies are never logged")
	assert.NotContains(t, out, "4111111111111111")
}

func TestLogUncertainAndReconciling(t *testing.T) {
	h := func(w http.ResponseWriter, r *http.Request) {
		httpidem.FromContext(r.Context()).Uncertain("provider timed out")
		w.WriteHeader(http.StatusGatewayTimeout)
	}
	f, sink, all := newLoggedFixture(t, httpidem.Route{Mode: idemkv.ModeRemote}, h, false)
	id := idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: secretKey}
	rid := map[string]string{httpidem.HeaderRequestID: "req-u"}

	_, rep := f.doWith(secretBody, secretKey, rid)
	require.Equal(t, httpidem.Uncertain, rep.Disposition)
	recs := sink.Take(t)
	checkRecords(t, recs, id, "req-u",
		want{"httpidem: key claimed", "INFO", map[string]any{"attempt": 1, "mode": "remote"}},
		want{"httpidem: key marked uncertain", "INFO", map[string]any{"disposition": "uncertain", "status": 504, "note": "provider timed out"}},
	)
	rec, err := f.eng.Get(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, rec.OperationID.String(), recs[0]["operation_id"], "the id the downstream saw, to find the call in its logs")

	_, rep = f.doWith(secretBody, secretKey, rid)
	require.Equal(t, httpidem.Reconciling, rep.Disposition)
	checkRecords(t, sink.Take(t), id, "req-u",
		want{"httpidem: key awaiting reconciliation", "DEBUG", map[string]any{"disposition": "reconciling"}})
	assert.NotContains(t, all.String(), secretKey)
}

func TestLogTakeoverAndLeaseLost(t *testing.T) {
	g := newGate(http.StatusCreated)
	f, sink, all := newLoggedFixture(t, httpidem.Route{Lease: time.Second, Heartbeat: -1}, g.ServeHTTP, false)
	id := idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: secretKey}

	first := make(chan response)
	go func() { first <- f.send(`{}`, secretKey, map[string]string{httpidem.HeaderRequestID: "req-first"}) }()
	<-g.entered
	f.clock.Advance(2 * time.Second) // the first holder's lease runs out
	second := make(chan response)
	go func() { second <- f.send(`{}`, secretKey, map[string]string{httpidem.HeaderRequestID: "req-second"}) }()
	<-g.entered
	g.release <- struct{}{}
	g.release <- struct{}{}
	problem(t, <-first, http.StatusConflict, httpidem.ProblemLeaseLost)
	require.Equal(t, http.StatusCreated, (<-second).status)
	f.report() // both reports are out: so is every record
	f.report()

	byRequest := map[string][]map[string]any{}
	for _, r := range sink.Take(t) {
		byRequest[r["request_id"].(string)] = append(byRequest[r["request_id"].(string)], r)
	}
	checkRecords(t, byRequest["req-first"], id, "req-first",
		want{"httpidem: key claimed", "INFO", map[string]any{"attempt": 1}},
		want{"httpidem: lease lost", "WARN", map[string]any{"disposition": "lease_lost"}},
	)
	checkRecords(t, byRequest["req-second"], id, "req-second",
		want{"httpidem: key taken over", "INFO", map[string]any{"attempt": 2}},
		want{"httpidem: outcome stored", "INFO", map[string]any{"disposition": "stored", "status": 201}},
	)
	assert.Contains(t, byRequest["req-first"][1]["err"], "fenced")
	assert.NotContains(t, all.String(), secretKey)
}

func TestLogStoreFailure(t *testing.T) {
	h, _ := counting()
	f, sink, all := newLoggedFixture(t, httpidem.Route{}, h, false)
	require.NoError(t, f.eng.Close())
	_, rep := f.doWith(secretBody, secretKey, nil)
	require.Equal(t, httpidem.StoreError, rep.Disposition)
	recs := sink.Take(t)
	require.Len(t, recs, 1)
	assert.Equal(t, "httpidem: claim failed", recs[0]["msg"])
	assert.Equal(t, "ERROR", recs[0]["level"])
	assert.Equal(t, idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: secretKey}.Hash(), recs[0]["key_hash"])
	assert.Contains(t, recs[0]["err"], "closed")
	assert.NotContains(t, all.String(), secretKey)
}

func TestLogRawKeysOptIn(t *testing.T) {
	h, _ := counting()
	f, sink, all := newLoggedFixture(t, httpidem.Route{}, h, true)
	_, rep := f.doWith(secretBody, secretKey, nil)
	require.Equal(t, httpidem.Stored, rep.Disposition)
	recs := sink.Take(t)
	require.Len(t, recs, 2)
	for _, r := range recs {
		assert.Equal(t, secretKey, r["key"], "%s carries the key when asked to", r["msg"])
		assert.NotEmpty(t, r["key_hash"], "and the hash still, to match records logged without the key")
	}
	assert.NotContains(t, all.String(), "SECRET-BODY-MARKER", "the opt-in is for keys, not bodies")
}

func TestLogRequestID(t *testing.T) {
	h, _ := counting()
	f, sink, _ := newLoggedFixture(t, httpidem.Route{}, h, false)
	generated := regexp.MustCompile(`^[0-9a-f]{16}$`)
	for i, tc := range []struct {
		name, header string
		kept         bool
	}{
		{"sane", "0b5e3c1a-9f2d-4c41-8d7e-2f6a1b9c0d3e", true},
		{"longest kept", strings.Repeat("r", httpidem.MaxRequestIDLen), true},
		{"absent", "", false},
		{"too long", strings.Repeat("r", httpidem.MaxRequestIDLen+1), false},
		{"tab and spaces to forge a text log line", "x\tlevel=ERROR msg=forged", false},
		{"bytes beyond ASCII", "req-\xff\xfe", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr map[string]string
			if tc.header != "" {
				hdr = map[string]string{httpidem.HeaderRequestID: tc.header}
			}
			_, rep := f.doWith(`{}`, "k-"+string(rune('a'+i)), hdr)
			require.Equal(t, httpidem.Stored, rep.Disposition)
			recs := sink.Take(t)
			require.Len(t, recs, 2)
			got := recs[0]["request_id"].(string)
			assert.Equal(t, got, recs[1]["request_id"], "one id for all of a request's records")
			if tc.kept {
				assert.Equal(t, tc.header, got)
			} else {
				assert.Regexp(t, generated, got, "replaced by a generated id")
			}
		})
	}
}

func TestLogLevelLeavesRecordsOut(t *testing.T) {
	h, _ := counting()
	sink, logger := logtest.New(slog.LevelWarn)
	f := buildFixture(t, httpidem.Route{}, h, nil, func(o *httpidem.Options) {
		o.Logger = logger
	})
	_, rep := f.doWith(`{}`, "k", nil)
	require.Equal(t, httpidem.Stored, rep.Disposition)
	_, rep = f.doWith(`{}`, "k", nil)
	require.Equal(t, httpidem.Replayed, rep.Disposition)
	assert.Empty(t, sink.String(), "state changes are Info, replays Debug")
}

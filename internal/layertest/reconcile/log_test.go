package reconcile_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/reconcile"
)

// The keys carry what a customer's key can: an email.
const secret = "jane.doe@example.com"

// TestLogsNameRecordsByHash: resolving, an unknown answer, escalating
// and a settling lost to another each log one record naming the record
// by tenant, endpoint, key hash and token, and no line holds the key,
// not even the store's errors, which quote it.
func TestLogsNameRecordsByHash(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	applied, gone, unknown, raced := "applied-"+secret, "gone-"+secret, "unknown-"+secret, "raced-"+secret
	v.uncertain(applied)
	d.set(applied, reconcile.Applied)
	v.uncertain(gone)
	d.set(gone, reconcile.NotApplied)
	v.uncertain(unknown)
	v.uncertain(raced)
	r := reconcile.ReconcilerFunc(func(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		if rec.ID.Key == raced {
			// An operator settles it while the worker asks.
			require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token, NoEffect: true}))
			return reconcile.Answer{Verdict: reconcile.NotApplied}, nil
		}
		return d.Reconcile(ctx, rec)
	})
	logs, logger := logtest.New(slog.LevelDebug)
	w := v.worker(r, reconcile.Options{
		MaxAttempts: 2, MinBackoff: time.Second, MaxBackoff: time.Second, Concurrency: 1,
		Logger: logger,
	})
	require.NoError(t, w.Pass(ctx))
	v.clock.Advance(time.Second)
	require.NoError(t, w.Pass(ctx)) // the second unknown answer escalates

	byKey := map[string][]logLine{}
	hashes := map[string]string{}
	for _, k := range []string{applied, gone, unknown, raced} {
		hashes[id(k).Hash()] = k
	}
	for _, raw := range logs.Records(t) {
		var ln logLine
		for k, val := range raw {
			s := fmt.Sprint(val)
			switch k {
			case "level":
				ln.Level = s
			case "msg":
				ln.Msg = s
			case "tenant":
				ln.Tenant = s
			case "endpoint":
				ln.Endpoint = s
			case "key_hash":
				ln.KeyHash = s
			case "err":
				ln.Err = s
			case "note":
				ln.Note = s
			case "reason":
				ln.Reason = s
			case "verdict":
				ln.Verdict = s
			case "token":
				ln.Token = uint64(val.(float64))
			case "status":
				ln.Status = int(val.(float64))
			case "attempts":
				ln.Attempts = int(val.(float64))
			}
		}
		key, ok := hashes[ln.KeyHash]
		require.True(t, ok, "a record names its key by hash: %v", raw)
		assert.Equal(t, "acct_1", ln.Tenant)
		assert.Equal(t, "POST /v1/payments", ln.Endpoint)
		assert.NotZero(t, ln.Token)
		byKey[key] = append(byKey[key], ln)
	}

	require.Len(t, byKey[applied], 1)
	assert.Equal(t, logLine{Level: "INFO", Msg: "reconcile: resolved", Verdict: "applied", Status: 201}, strip(byKey[applied][0]))
	require.Len(t, byKey[gone], 1)
	assert.Equal(t, logLine{Level: "INFO", Msg: "reconcile: resolved", Verdict: "not applied"}, strip(byKey[gone][0]))
	require.Len(t, byKey[unknown], 2)
	assert.Equal(t, logLine{Level: "WARN", Msg: "reconcile: outcome unknown; asking again later", Attempts: 1, Reason: "processor has no answer"},
		strip(byKey[unknown][0]))
	assert.Equal(t, "ERROR", byKey[unknown][1].Level)
	assert.Equal(t, "reconcile: escalated; it waits for an operator", byKey[unknown][1].Msg)
	assert.Contains(t, byKey[unknown][1].Note, "gave up after 2 attempts")
	require.Len(t, byKey[raced], 1)
	assert.Equal(t, "DEBUG", byKey[raced][0].Level)
	assert.Equal(t, "reconcile: settled by another", byKey[raced][0].Msg)
	assert.Contains(t, byKey[raced][0].Err, id(raced).Hash(), "the record is named by its hash")

	assert.NotContains(t, logs.String(), secret, "no raw key in any line")
}

// logLine is one decoded record of the worker's log.
type logLine struct {
	Level, Msg, Tenant, Endpoint, KeyHash, Err, Note, Reason, Verdict string
	Token                                                             uint64
	Status, Attempts                                                  int
}

// strip keeps what a line's test compares beyond the record's names.
func strip(l logLine) logLine {
	l.Tenant, l.Endpoint, l.KeyHash, l.Token = "", "", "", 0
	return l
}

// TestLogfLinesNameRecordsByHash: without a Logger, Logf gets the same
// records as text, also without the key.
func TestLogfLinesNameRecordsByHash(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	k := "escalated-" + secret
	v.uncertain(k)
	var lines []string
	w := v.worker(d, reconcile.Options{MaxAttempts: 1, Logf: func(format string, args ...any) {
		lines = append(lines, fmt.Sprintf(format, args...))
	}})
	require.NoError(t, w.Pass(ctx))
	require.Len(t, lines, 1)
	assert.Contains(t, lines[0], "reconcile: escalated")
	assert.Contains(t, lines[0], "key_hash="+id(k).Hash())
	assert.NotContains(t, lines[0], secret)
}

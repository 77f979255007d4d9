package once_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/once"
)

// The keys carry what a customer's key can: an email. The payload is
// what a body can: a card number.
const (
	secret  = "jane.doe@example.com"
	payload = "4111-1111-1111-1111"
)

// logged is a JSON log kept for a test, with what the tests ask of it.
type logged struct{ *logtest.Log }

func newLogged(level slog.Level) (*logged, *slog.Logger) {
	g, logger := logtest.New(level)
	return &logged{g}, logger
}

// byKey returns the "LEVEL msg" of each record about key, in order.
func (g *logged) byKey(t *testing.T, key string) []string {
	var out []string
	for _, m := range g.Records(t) {
		if m["key_hash"] == id(key).Hash() {
			out = append(out, fmt.Sprint(m["level"], " ", m["msg"]))
		}
	}
	return out
}

// find returns the record about key with message msg.
func (g *logged) find(t *testing.T, key, msg string) map[string]any {
	for _, m := range g.Records(t) {
		if m["key_hash"] == id(key).Hash() && m["msg"] == msg {
			return m
		}
	}
	t.Fatalf("no %q record about %q in\n%s", msg, key, g.String())
	return nil
}

// TestLogsEveryTransition: each state change of a key is one record, at
// the level the middleware uses for it, naming the key by tenant,
// endpoint and key_hash; no line holds the raw key or the payload, not
// even the errors that quote the key.
func TestLogsEveryTransition(t *testing.T) {
	v := newEnv(t, nil)
	g, logger := newLogged(slog.LevelDebug)
	with := func(c once.Call) once.Call { c.Logger = logger; return c }
	write := func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{Status: 201, Body: []byte(payload)}, x.Effects.Set([]byte("card"), []byte(payload))
	}

	stored, failed, mismatch := "stored-"+secret, "failed-"+secret, "mismatch-"+secret
	_, err := once.Do(ctx, v.e, with(call(stored)), write)
	require.NoError(t, err)
	_, err = once.Do(ctx, v.e, with(call(stored)), write) // a replay
	require.NoError(t, err)
	_, err = once.Do(ctx, v.e, with(call(failed)), func(context.Context, *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{}, fmt.Errorf("no account for %q with card %s", failed, payload[:4])
	})
	require.Error(t, err)
	_, err = once.Do(ctx, v.e, with(call(mismatch)), write)
	require.NoError(t, err)
	other := with(call(mismatch))
	other.Fingerprint = []byte("other")
	_, err = once.Do(ctx, v.e, other, write)
	require.ErrorIs(t, err, once.ErrMismatch)

	remoteOK, noEffect, unknown, lost, resumed, busy := "remote-"+secret, "noeffect-"+secret,
		"unknown-"+secret, "lost-"+secret, "resumed-"+secret, "busy-"+secret
	out, err := once.Do(ctx, v.e, with(remote(remoteOK)), write)
	require.NoError(t, err)
	_, err = once.Do(ctx, v.e, with(remote(noEffect)), func(context.Context, *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{}, once.NoEffect(errors.New("psp: refused " + noEffect))
	})
	require.ErrorIs(t, err, once.ErrNoEffect)
	_, err = once.Do(ctx, v.e, with(remote(unknown)), func(context.Context, *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{}, errors.New("psp: timed out charging " + unknown)
	})
	require.ErrorIs(t, err, once.ErrUncertain)
	_, err = once.Do(ctx, v.e, with(remote(unknown)), write) // awaits reconciliation
	require.ErrorIs(t, err, once.ErrReconciling)
	_, err = once.Do(ctx, v.e, with(remote(lost)), func(context.Context, *once.Exec) (idemkv.Result, error) {
		v.clock.Advance(lease + time.Second) // too slow: another attempt finds the lease expired
		_, err := once.Do(ctx, v.e, remote(lost), write)
		require.ErrorIs(t, err, once.ErrReconciling)
		return idemkv.Result{Status: 201}, nil
	})
	require.ErrorIs(t, err, idemkv.ErrFenced)
	v.holder(resumed, idemkv.ModeRemote, true) // then crashes
	v.clock.Advance(lease + time.Second)
	c := with(remote(resumed))
	c.Resumable = true
	_, err = once.Do(ctx, v.e, c, write)
	require.NoError(t, err)
	v.holder(busy, idemkv.ModeLocal, false)
	c = with(call(busy))
	c.NoWait = true
	_, err = once.Do(ctx, v.e, c, write)
	require.ErrorIs(t, err, once.ErrInProgress)
	bad := with(call("bad-" + secret))
	bad.Fingerprint = nil
	_, err = once.Do(ctx, v.e, bad, write)
	require.Error(t, err)

	assert.Equal(t, []string{"INFO once: key claimed", "INFO once: outcome stored", "DEBUG once: outcome replayed"}, g.byKey(t, stored))
	assert.Equal(t, []string{"INFO once: key claimed", "INFO once: key released"}, g.byKey(t, failed))
	assert.Equal(t, []string{"INFO once: key claimed", "INFO once: outcome stored", "INFO once: key reused with a different fingerprint"},
		g.byKey(t, mismatch))
	assert.Equal(t, []string{"INFO once: key claimed", "INFO once: outcome stored"}, g.byKey(t, remoteOK))
	assert.Equal(t, []string{"INFO once: key claimed", "INFO once: key released"}, g.byKey(t, noEffect))
	assert.Equal(t, []string{"INFO once: key claimed", "INFO once: key marked uncertain", "DEBUG once: key awaiting reconciliation"},
		g.byKey(t, unknown))
	assert.Equal(t, []string{"INFO once: key claimed", "WARN once: lease lost"}, g.byKey(t, lost))
	assert.Equal(t, []string{"INFO once: key taken over", "INFO once: outcome stored"}, g.byKey(t, resumed))
	assert.Equal(t, []string{"DEBUG once: key in progress"}, g.byKey(t, busy))
	assert.Equal(t, []string{"ERROR once: claim failed"}, g.byKey(t, "bad-"+secret))

	for _, m := range g.Records(t) {
		assert.Equal(t, "acct_1", m["tenant"])
		assert.Equal(t, "jobs.send", m["endpoint"])
		assert.NotContains(t, m, "key", "no raw key without LogRawKeys")
	}
	claimed := g.find(t, remoteOK, "once: key claimed")
	assert.Equal(t, "remote", claimed["mode"])
	assert.EqualValues(t, 1, claimed["attempt"])
	assert.NotZero(t, claimed["token"])
	assert.Equal(t, out.OperationID.String(), claimed["operation_id"])
	assert.Equal(t, out.OperationID.String(), g.find(t, remoteOK, "once: outcome stored")["operation_id"])
	assert.EqualValues(t, 201, g.find(t, stored, "once: outcome stored")["status"])
	assert.EqualValues(t, 1, g.find(t, stored, "once: outcome stored")["runs"])
	assert.EqualValues(t, 201, g.find(t, stored, "once: outcome replayed")["status"])
	assert.EqualValues(t, 2, g.find(t, resumed, "once: key taken over")["attempt"])
	assert.Contains(t, g.find(t, failed, "once: key released")["err"], "no account for [key "+id(failed).Hash()+"]",
		"the function's error, its key taken out")
	assert.Contains(t, g.find(t, unknown, "once: key marked uncertain")["note"], "once: the function failed: psp: timed out")
	assert.Contains(t, g.find(t, lost, "once: lease lost")["err"], "fenced")

	assert.NotContains(t, g.String(), secret, "no raw key in any line")
	assert.NotContains(t, g.String(), payload, "no payload in any line")
}

// TestLogLevels: a logger at Info takes the state changes and not the
// Debug answers; one at Warn takes neither; without a Logger nothing is
// logged at all (Do runs as before).
func TestLogLevels(t *testing.T) {
	v := newEnv(t, nil)
	fn := func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil }
	for _, tc := range []struct {
		level slog.Level
		want  []string
	}{
		{slog.LevelDebug, []string{"INFO once: key claimed", "INFO once: outcome stored", "DEBUG once: outcome replayed"}},
		{slog.LevelInfo, []string{"INFO once: key claimed", "INFO once: outcome stored"}},
		{slog.LevelWarn, nil},
	} {
		key := "level-" + tc.level.String()
		g, logger := newLogged(tc.level)
		c := call(key)
		c.Logger = logger
		for range 2 {
			_, err := once.Do(ctx, v.e, c, fn)
			require.NoError(t, err)
		}
		assert.Equal(t, tc.want, g.byKey(t, key), "at %v", tc.level)
	}
}

// TestLogRawKeys: the opt-in adds the key to every record, and leaves it
// in the errors.
func TestLogRawKeys(t *testing.T) {
	v := newEnv(t, nil)
	g, logger := newLogged(slog.LevelInfo)
	c := call(secret)
	c.Logger, c.LogRawKeys = logger, true
	_, err := once.Do(ctx, v.e, c, func(context.Context, *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{}, errors.New("refused " + secret)
	})
	require.Error(t, err)
	lines := g.Records(t)
	require.Len(t, lines, 2)
	for _, m := range lines {
		assert.Equal(t, secret, m["key"])
	}
	assert.Equal(t, "refused "+secret, lines[1]["err"])
}

package outbox_test

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
	"github.com/idemkv/idemkv/internal/layertest/teststore"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/outbox"
)

// failingRead is a store whose first outbox read fails.
type failingRead struct {
	teststore.Store
	failed bool
}

func (f *failingRead) ReadOutbox(ctx context.Context, after uint64, limit int) ([]idemkv.StoredEvent, error) {
	if !f.failed {
		f.failed = true
		return nil, errors.New("disk on fire")
	}
	return f.Store.ReadOutbox(ctx, after, limit)
}

// TestRunLogsFailuresAndRecovery: a store's failed read (Error), each
// failed publish (Warn, naming the event by seq and id) and the recovery
// (Info) are one record each; no line holds an event's payload.
func TestRunLogsFailuresAndRecovery(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	const secret = "card-4111-1111-1111-1111"
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "pay", Key: "p"}, Fingerprint: []byte{1}})
	require.NoError(t, err)
	require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		return fx.Emit(idemkv.Event{Topic: "payments.created", Key: "acct", Payload: []byte(secret)})
	}))
	failures := 2
	b := &broker{sent: make(chan idemkv.StoredEvent, 10), fail: func(idemkv.StoredEvent) error {
		if failures > 0 {
			failures--
			return errors.New("no responders")
		}
		return nil
	}}
	logs, logger := logtest.New(slog.LevelDebug)
	waits := make(chan time.Duration, 10)
	fire := make(chan time.Time)
	r, err := outbox.New(&failingRead{Store: e}, b, &outbox.Options{
		AckInterval: time.Hour,
		After:       func(d time.Duration) <-chan time.Time { waits <- d; return fire },
		Logger:      logger,
	})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	for range 3 { // the read, then two publishes, fail
		<-waits
		fire <- time.Time{}
	}
	ev := <-b.sent
	require.Equal(t, time.Hour, <-waits, "the recovery is logged before Run waits to acknowledge")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	var got []string
	recs := logs.Records(t)
	for _, m := range recs {
		got = append(got, fmt.Sprint(m["level"], " ", m["msg"], " ", m["failures"]))
	}
	assert.Equal(t, []string{
		"ERROR outbox: store error; retrying 1",
		"WARN outbox: publish failed; retrying 2",
		"WARN outbox: publish failed; retrying 3",
		"INFO outbox: publishing again 3",
	}, got)
	assert.Contains(t, recs[0]["err"], "disk on fire")
	assert.EqualValues(t, ev.Seq, recs[1]["seq"])
	assert.Equal(t, ev.ID, recs[1]["event_id"])
	assert.Contains(t, recs[1]["err"], "no responders")
	assert.NotContains(t, logs.String(), secret, "no payload in any line")
}

// TestLogfStillWorks: without a Logger, the deprecated Logf gets the
// failures as text.
func TestLogfStillWorks(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	emit(t, e, 0, 1)
	var lines []string
	b := &broker{fail: func(idemkv.StoredEvent) error { return errors.New("no responders") }}
	//lint:ignore SA1019 the test is of the deprecated Logf
	r, err := outbox.New(e, b, &outbox.Options{Logf: func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }})
	require.NoError(t, err)
	_, err = r.Drain(ctx)
	require.Error(t, err)
	rctx, cancel := context.WithCancel(ctx)
	fire := make(chan time.Time)
	r, err = outbox.New(e, b, &outbox.Options{
		After: func(time.Duration) <-chan time.Time { cancel(); return fire },
		//lint:ignore SA1019 the test is of the deprecated Logf
		Logf: func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) },
	})
	require.NoError(t, err)
	require.ErrorIs(t, r.Run(rctx), context.Canceled)
	require.Len(t, lines, 1)
	assert.Contains(t, lines[0], "outbox relay: publish event 1")
	assert.Contains(t, lines[0], "no responders")
}

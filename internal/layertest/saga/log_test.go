package saga_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/saga"
)

// A saga's id carries what a customer's key can (an email); its input
// what a body can (a card number).
const (
	secret  = "jane.doe@example.com"
	payload = "4111-1111-1111-1111"
)

// loggedRunner returns a runner of the shop's saga logging as JSON at
// level, and its log.
func (s *shop) loggedRunner(level slog.Level) (*saga.Runner, *logtest.Log) {
	g, logger := logtest.New(level)
	r, err := saga.New(s.e, s.definition(), &saga.Options{Lease: lease, MaxAttempts: 3,
		After:  func(time.Duration) <-chan time.Time { return closedTime },
		Logger: logger})
	require.NoError(s.t, err)
	return r, g
}

// records returns g's records about the saga id: each as its
// attributes, and as "LEVEL msg [step action]".
func records(t *testing.T, g *logtest.Log, id string) ([]map[string]any, []string) {
	hash := idemkv.ID{Tenant: "acct_1", Endpoint: "saga/order", Key: id}.Hash()
	var recs []map[string]any
	var lines []string
	for _, m := range g.Records(t) {
		if m["key_hash"] != hash {
			continue
		}
		assert.Equal(t, "acct_1", m["tenant"], m)
		assert.Equal(t, "saga/order", m["endpoint"], m)
		assert.NotZero(t, m["token"], m)
		recs = append(recs, m)
		line := fmt.Sprint(m["level"], " ", m["msg"])
		switch {
		case m["action"] != nil:
			line += fmt.Sprint(" [", m["step"], " ", m["action"], "]")
		case m["step"] != nil:
			line += fmt.Sprint(" [", m["step"], "]")
		}
		lines = append(lines, line)
	}
	return recs, lines
}

// TestLogsEveryStateChange: a saga that completes, one that is
// compensated after a transient failure, one whose undo is escalated and
// one that waits on an unknown outcome and is taken over each log one
// record per state change, naming the saga by its hash and the step by
// name; no line holds the saga's id or its input, not even the failures
// that quote them.
func TestLogsEveryStateChange(t *testing.T) {
	s := newShop(t)
	r, buf := s.loggedRunner(slog.LevelDebug)
	input := []byte(`{"card":"` + payload + `"}`)

	done, declined, escalated, waiting := "done-"+secret, "declined-"+secret, "escalated-"+secret, "waiting-"+secret
	_, err := r.Start(ctx, "acct_1", done, input)
	require.NoError(t, err)

	s.faults["reserve"] = []error{errors.New("stock service busy for " + declined)}
	s.faults["authorize"] = []error{fmt.Errorf("%w: card %s declined for %s", saga.ErrPermanent, payload[:4], declined)}
	st, err := r.Start(ctx, "acct_1", declined, input)
	require.NoError(t, err)
	require.Equal(t, saga.Compensated, st.Phase)

	down := errors.New("processor down")
	s.faults["capture"] = []error{saga.ErrPermanent}
	s.faults["void"] = []error{down, down, down}
	st, err = r.Start(ctx, "acct_1", escalated, input)
	require.NoError(t, err)
	require.Equal(t, saga.Escalated, st.Phase)

	s.faults["authorize"] = []error{saga.ErrUnknown}
	st, err = r.Start(ctx, "acct_1", waiting, input)
	require.NoError(t, err)
	require.Equal(t, saga.Waiting, st.Phase)
	// A reconciler settles the step as done; after the lease, Resume
	// takes the saga over.
	page, err := s.e.List(ctx, idemkv.ListRequest{})
	require.NoError(t, err)
	for _, rec := range page.Records {
		if rec.ID.Key == waiting && rec.State == idemkv.StateUncertain {
			require.NoError(t, s.e.Resolve(ctx, idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token, Result: saga.Done(nil)}))
		}
	}
	s.clock.Advance(lease)
	_, err = r.Resume(ctx)
	require.NoError(t, err)

	recs, lines := records(t, buf, done)
	assert.Equal(t, []string{
		"INFO saga: started",
		"INFO saga: step done [reserve do]",
		"INFO saga: step done [authorize do]",
		"INFO saga: step done [confirm do]",
		"INFO saga: step done [capture do]",
		"INFO saga: completed",
	}, lines)
	assert.EqualValues(t, 1, recs[0]["attempt"])
	assert.NotEmpty(t, recs[0]["operation_id"])

	recs, lines = records(t, buf, declined)
	assert.Equal(t, []string{
		"INFO saga: started",
		"WARN saga: step failed; retrying [reserve do]",
		"INFO saga: step done [reserve do]",
		"INFO saga: compensating [authorize]",
		"INFO saga: step undone [reserve undo]",
		"INFO saga: compensated",
	}, lines)
	assert.EqualValues(t, 1, recs[1]["attempt"])
	assert.Contains(t, recs[1]["err"], "stock service busy for [key ", "the error, the id taken out")
	assert.Equal(t, "authorize", recs[3]["step"])
	assert.Contains(t, recs[3]["failure"], "declined for [key ")

	_, lines = records(t, buf, escalated)
	assert.Equal(t, []string{
		"INFO saga: started",
		"INFO saga: step done [reserve do]",
		"INFO saga: step done [authorize do]",
		"INFO saga: step done [confirm do]",
		"INFO saga: compensating [capture]",
		"WARN saga: step failed; retrying [authorize undo]",
		"WARN saga: step failed; retrying [authorize undo]",
		"ERROR saga: escalated; it waits for an operator [authorize undo]",
		"INFO saga: taken over", // by the Resume below, where it stops again until an operator settles the undo
	}, lines)

	recs, lines = records(t, buf, waiting)
	assert.Equal(t, []string{
		"INFO saga: started",
		"INFO saga: step done [reserve do]",
		"INFO saga: step outcome unknown; waiting for reconciliation [authorize do]",
		"INFO saga: taken over",
		"INFO saga: step done [confirm do]",
		"INFO saga: step done [capture do]",
		"INFO saga: completed",
	}, lines)
	assert.EqualValues(t, 2, recs[3]["attempt"])
	assert.Equal(t, recs[0]["operation_id"], recs[3]["operation_id"], "the same saga, taken over")

	assert.NotContains(t, buf.String(), secret, "no saga id in any line")
	assert.NotContains(t, buf.String(), payload, "no input in any line")
	assert.NotContains(t, buf.String(), "auth_", "no output in any line")
}

// TestLogLevels: at Warn only the failures are logged; at Info the state
// changes too.
func TestLogLevels(t *testing.T) {
	s := newShop(t)
	s.faults["reserve"] = []error{errors.New("busy")}
	r, buf := s.loggedRunner(slog.LevelWarn)
	_, err := r.Start(ctx, "acct_1", "o1", nil)
	require.NoError(t, err)
	_, lines := records(t, buf, "o1")
	assert.Equal(t, []string{"WARN saga: step failed; retrying [reserve do]"}, lines)

	r, buf = s.loggedRunner(slog.LevelInfo)
	_, err = r.Start(ctx, "acct_1", "o2", nil)
	require.NoError(t, err)
	_, lines = records(t, buf, "o2")
	assert.Len(t, lines, 6, "started, four steps, completed")
}

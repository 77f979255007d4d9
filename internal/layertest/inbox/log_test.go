package inbox_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/internal/logtest"
)

// An event id carries what a key can (an email); a payload what a body
// can (an account holder's card).
const (
	secretID   = "evt-jane.doe@example.com"
	secretData = "card-4111-1111-1111-1111"
)

// TestLogsEveryOutcome: applied, duplicate, rejected, an id reused with
// other content, a handler's failure and a store's each log one record,
// naming the event by its mark's key_hash and position, and no line holds
// the event's id or its payload, not even the errors that quote them.
func TestLogsEveryOutcome(t *testing.T) {
	v := newEnv(t)
	g, logger := logtest.New(slog.LevelDebug)
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox", Logger: logger})
	require.NoError(t, err)
	b := &book{}
	process := func(m inbox.Message) error {
		_, err := c.Process(ctx, m, b.handle)
		return err
	}

	applied := msg(secretID+"-1", 1, payload(secretData, 5))
	require.NoError(t, process(applied))
	require.NoError(t, process(applied)) // a redelivery
	poison := msg(secretID+"-2", 2, []byte(`{"account":"`+secretData+`","amount":"lots"}`))
	require.NoError(t, process(poison))
	reused := msg(secretID+"-1", 3, payload(secretData, 6)) // the id of the first, other content
	require.NoError(t, process(reused))
	failing := msg(secretID+"-4", 4, payload(secretData, 7))
	b.fail = errors.New("ledger: account service down for " + failing.ID)
	require.Error(t, process(failing))
	broken, err := inbox.New("broken", v.e, &inbox.Options{Retention: "no-such-class", Logger: logger})
	require.NoError(t, err)
	_, err = broken.Process(ctx, msg(secretID+"-5", 5, payload(secretData, 8)), b.handle)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)

	var got []string
	for _, m := range g.Records(t) {
		assert.Equal(t, "inbox", m["tenant"])
		assert.NotEmpty(t, m["key_hash"])
		assert.Equal(t, "payments.created", m["subject"])
		got = append(got, fmt.Sprint(m["level"], " ", m["msg"], " @", m["position"]))
	}
	assert.Equal(t, []string{
		"INFO inbox: event applied @1",
		"DEBUG inbox: duplicate skipped @1",
		"WARN inbox: event rejected @2",
		"WARN inbox: event id reused with other content @3",
		"WARN inbox: handler failed; the message is to be redelivered @4",
		"ERROR inbox: store error; the message is to be redelivered @5",
	}, got)
	recs := g.Records(t)
	first, err := v.mark("id/" + applied.ID)
	require.NoError(t, err)
	assert.Equal(t, first.ID.Hash(), recs[0]["key_hash"], "the hash idemkv inspect shows for the mark")
	assert.Equal(t, recs[0]["key_hash"], recs[1]["key_hash"])
	assert.Equal(t, recs[0]["key_hash"], recs[3]["key_hash"], "the reused id is the same mark")
	assert.Equal(t, "ledger", recs[0]["endpoint"])
	assert.Equal(t, "broken", recs[5]["endpoint"])
	assert.Contains(t, recs[2]["reason"], "not a credit")
	assert.Contains(t, recs[4]["err"], "account service down for [key "+fmt.Sprint(recs[4]["key_hash"])+"]")

	assert.NotContains(t, g.String(), "jane.doe", "no event id in any line")
	assert.NotContains(t, g.String(), secretData, "no payload in any line")
}

// TestLogLevel: at Warn a consumer logs its failures, not each event.
func TestLogLevel(t *testing.T) {
	v := newEnv(t)
	g, logger := logtest.New(slog.LevelWarn)
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox", Logger: logger})
	require.NoError(t, err)
	b := &book{}
	for i := uint64(1); i <= 3; i++ {
		_, err := c.Process(ctx, msg(fmt.Sprint("ev-", i), i, payload("acct_1", 1)), b.handle)
		require.NoError(t, err)
	}
	_, err = c.Process(ctx, msg("ev-4", 4, []byte("not json")), b.handle)
	require.NoError(t, err)
	recs := g.Records(t)
	require.Len(t, recs, 1)
	assert.Equal(t, "inbox: event rejected", recs[0]["msg"])
}

// TestMessageError: the error a reader returns and logs for a message
// that failed names it by position and key hash, without the event's id
// (unless LogRawKeys), and wraps the failure.
func TestMessageError(t *testing.T) {
	v := newEnv(t)
	_, logger := logtest.New(slog.LevelInfo)
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox", Logger: logger})
	require.NoError(t, err)
	assert.Same(t, logger, c.Logger())
	assert.Nil(t, v.consumer().Logger())

	m := msg(secretID, 7, payload(secretData, 5))
	cause := errors.New("ledger: account service down for " + secretID)
	err = c.MessageError("PAYMENTS", m, cause)
	require.ErrorIs(t, err, cause)
	hash := idemkv.ID{Tenant: inbox.Tenant, Endpoint: "ledger", Key: "id/" + secretID}.Hash()
	assert.Equal(t, `message 7 of stream "PAYMENTS" (event key_hash `+hash+`): ledger: account service down for [key `+hash+`]`, err.Error())
	assert.NoError(t, c.MessageError("PAYMENTS", m, nil))

	raw, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox", LogRawKeys: true})
	require.NoError(t, err)
	assert.Equal(t, `message 7 of stream "PAYMENTS" (event "`+secretID+`"): `+cause.Error(), raw.MessageError("PAYMENTS", m, cause).Error())
}

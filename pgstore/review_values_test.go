package pgstore_test

import (
	"errors"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReviewSetNilValueIsADelete: Effects.Set(k, nil) writes key=value
// (an empty value; the engine stores one and reads it back), but pgstore's effects keep a
// nil value as "deleted": the key reads as absent inside the apply, the
// commit deletes it, and Record.Effects does not count it.
func TestReviewSetNilValueIsADelete(t *testing.T) {
	s, _ := reviewStore(t, nil)
	k := []byte("acct/1/flag")
	require.NoError(t, s.Update(ctx, func(fx idemkv.Effects) error { return fx.Set(k, []byte("old")) }))

	id := reviewID("set-nil")
	l := reviewClaim(t, s, id, idemkv.ModeLocal)
	var inApply error
	require.NoError(t, s.Complete(ctx, l, idemkv.Result{Status: 200}, func(fx idemkv.Effects) error {
		if err := fx.Set(k, nil); err != nil {
			return err
		}
		_, inApply = fx.Get(k)
		return nil
	}))
	assert.NoError(t, inApply, "Get after Set(k, nil) in the same apply")
	v, err := s.GetData(ctx, k)
	require.NoError(t, err, "Set(k, nil) must leave k set (to an empty value)")
	require.Empty(t, v)
	rec, err := s.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 1, rec.Effects, "Record.Effects counts the key set")
}

// TestReviewEventWithoutPayload: an event with no payload (nil) is valid
// (Event.Validate accepts it; the engine keeps it), but the outbox's
// payload column is NOT NULL and pgx sends a nil []byte as NULL: the
// whole Complete fails with a database error.
func TestReviewEventWithoutPayload(t *testing.T) {
	s, _ := reviewStore(t, nil)
	l := reviewClaim(t, s, reviewID("no-payload"), idemkv.ModeLocal)
	err := s.Complete(ctx, l, idemkv.Result{Status: 200}, func(fx idemkv.Effects) error {
		return fx.Emit(idemkv.Event{Topic: "orders.cancelled", Key: "o1"})
	})
	require.NoError(t, err)
	evs, err := s.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
}

// TestReviewEventHeadersRoundTrip: headers go through json.Marshal into a
// jsonb column. Event.Validate allows any value without CR or LF; a value
// that is not valid UTF-8 is silently rewritten (U+FFFD) and the relay
// publishes a header the caller never set, and a value with a NUL byte
// makes PostgreSQL refuse the whole commit (jsonb has no \u0000).
func TestReviewEventHeadersRoundTrip(t *testing.T) {
	s, _ := reviewStore(t, nil)
	headers := map[string]string{"X-Plain": "v1", "X-Bin": "caf\xe9", "X-Nul": "a\x00b"}
	for name, v := range headers {
		ev := idemkv.Event{Topic: "h.t", Key: name, Payload: []byte("p"), Headers: map[string]string{name: v}}
		require.NoError(t, ev.Validate())
	}
	var got []idemkv.StoredEvent
	for i, name := range []string{"X-Plain", "X-Bin", "X-Nul"} {
		l := reviewClaim(t, s, reviewID("hdr-"+name), idemkv.ModeLocal)
		err := s.Complete(ctx, l, idemkv.Result{Status: 200}, func(fx idemkv.Effects) error {
			return fx.Emit(idemkv.Event{Topic: "h.t", Key: name, Payload: []byte("p"),
				Headers: map[string]string{name: headers[name]}})
		})
		if !t.Run(name+"/complete", func(t *testing.T) { require.NoError(t, err) }) {
			continue
		}
		evs, err := s.ReadOutbox(ctx, 0, 10)
		require.NoError(t, err)
		require.Greater(t, len(evs), len(got), "event %d", i)
		got = evs
		last := evs[len(evs)-1]
		t.Run(name+"/roundtrip", func(t *testing.T) {
			require.Equal(t, headers[name], last.Headers[name], "header published differs from the one emitted")
		})
	}
}

// TestReviewTextColumnsRefuseValidArguments: the contract lets a
// Result.Pointer, a note and an Event.Key be any bytes (no CR/LF for the
// key), and a tenant any valid UTF-8 (NUL included); pgstore keeps them in
// TEXT columns, which refuse NUL and invalid UTF-8, so the calls fail with
// a bare database error (SQLSTATE 22021), unclassified, after the work
// was done (Complete keeps failing; the lease can only be released). The
// engine accepts them. Either accepting them or refusing them up front
// with the contract's error passes.
func TestReviewTextColumnsRefuseValidArguments(t *testing.T) {
	s, _ := reviewStore(t, nil)
	acceptOr := func(t *testing.T, err, contract error) {
		t.Helper()
		if err != nil && !errors.Is(err, contract) {
			t.Fatalf("neither accepted nor refused with %v: %v", contract, err)
		}
	}
	t.Run("pointer", func(t *testing.T) {
		r := idemkv.Result{Status: 201, Pointer: "/v1/p/\xff"}
		l := reviewClaim(t, s, reviewID("ptr"), idemkv.ModeLocal)
		acceptOr(t, s.Complete(ctx, l, r, nil), idemkv.ErrInvalidResult)
	})
	t.Run("note", func(t *testing.T) {
		l := reviewClaim(t, s, reviewID("note"), idemkv.ModeRemote)
		acceptOr(t, s.MarkUncertain(ctx, l, "gateway said \xff"), idemkv.ErrInvalidArgument)
	})
	t.Run("event key", func(t *testing.T) {
		ev := idemkv.Event{Topic: "a.b", Key: "k\x00", Payload: []byte("p")}
		require.NoError(t, ev.Validate())
		l := reviewClaim(t, s, reviewID("evkey"), idemkv.ModeLocal)
		acceptOr(t, s.Complete(ctx, l, idemkv.Result{Status: 200}, func(fx idemkv.Effects) error { return fx.Emit(ev) }), idemkv.ErrInvalidArgument)
	})
	t.Run("tenant", func(t *testing.T) {
		id := idemkv.ID{Tenant: "acme\x00eu", Endpoint: "POST /x", Key: "k"}
		require.NoError(t, id.Validate())
		_, err := s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}})
		acceptOr(t, err, idemkv.ErrInvalidScope)
	})
}

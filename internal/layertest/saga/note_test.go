package saga_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/saga"
)

// TestALongNoteIsKept: a remote step whose error is long and not ASCII
// (its note is cut at the store's limit, in the middle of a character)
// is still marked uncertain, on every store, and the saga waits for it.
func TestALongNoteIsKept(t *testing.T) {
	s := newShop(t)
	r, err := saga.New(s.e, saga.Definition{Name: "n", Steps: []saga.Step{{
		Name: "charge", Remote: true,
		Do: func(ctx context.Context, x *saga.Exec) ([]byte, error) {
			prefix := "saga n: do charge: " + saga.ErrUnknown.Error() + ": psp: "
			msg := strings.Repeat("a", idemkv.MaxNoteLen-1-len(prefix)) + strings.Repeat("é", 50) + "\x00"
			return nil, fmt.Errorf("%w: psp: %s", saga.ErrUnknown, msg)
		},
	}}}, nil)
	require.NoError(t, err)
	st, err := r.Start(ctx, "acct", "o1", []byte("in"))
	require.NoError(t, err)
	require.Equal(t, saga.Waiting, st.Phase)
	rec, err := s.e.Get(ctx, idemkv.ID{Tenant: "acct", Endpoint: "saga/n/do/charge", Key: "o1"})
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)
}

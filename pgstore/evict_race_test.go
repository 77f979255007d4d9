package pgstore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// TestEvictRacingItsHolder: an eviction of a record in progress, racing
// its holder's completion, answers as the Evicter contract says: the
// record evicted, or ErrWrongState, never ErrConflict. A record its
// statement could not evict and its read then could (completed in
// between) is evicted on a second run.
func TestEvictRacingItsHolder(t *testing.T) {
	s, _ := reviewStore(t, nil)
	for i := range 150 {
		id := reviewID(fmt.Sprint("evict-race-", i))
		l := reviewClaim(t, s, id, idemkv.ModeRemote)
		var wg sync.WaitGroup
		var err error
		wg.Go(func() { _, err = s.Evict(ctx, idemkv.EvictRequest{ID: id, Token: l.Token}) })
		wg.Go(func() { require.NoError(t, s.Complete(ctx, l, idemkv.Result{Status: 200}, nil)) })
		wg.Wait()
		if err != nil && !errors.Is(err, idemkv.ErrWrongState) {
			t.Fatalf("run %d: %v, want the record evicted or ErrWrongState", i, err)
		}
	}
}

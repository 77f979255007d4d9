package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/stretchr/testify/require"
)

// TestReviewResolveWithReadsExhaustsPool: a Resolve whose Apply reads
// holds a pool connection for its SERIALIZABLE transaction; when the
// settling statement changes no row, whyNotSettleable asks the pool for a
// second connection while the first is still held (settle.go). As many
// concurrent such Resolves as the pool has connections each hold one and
// wait for another: all of them hang until their contexts end, instead
// of answering ErrWrongState. (MaxConns 2, NoListen so that the LISTEN
// connection does not take one; with the listener, MaxConns-1 Resolves
// are enough.)
func TestReviewResolveWithReadsExhaustsPool(t *testing.T) {
	const conns = 2
	s, _ := reviewStore(t, func(o *pgstore.Options) { o.MaxConns = conns; o.NoListen = true })
	require.NoError(t, s.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("ledger"), []byte("0")) }))
	var ids []idemkv.ID
	var tokens []uint64
	for i := range conns {
		id := reviewID(fmt.Sprint("done-", i))
		l := reviewClaim(t, s, id, idemkv.ModeLocal)
		require.NoError(t, s.Complete(ctx, l, idemkv.Result{Status: 200}, nil)) // completed: not settleable
		ids, tokens = append(ids, id), append(tokens, l.Token)
	}

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a deadlock detector, not synchronization
	defer cancel()
	var read sync.WaitGroup // every Resolve holds its transaction's connection
	read.Add(conns)
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			first := true
			errs[i] = s.Resolve(rctx, idemkv.ResolveRequest{ID: ids[i], Token: tokens[i], Result: idemkv.Result{Status: 200},
				Apply: func(fx idemkv.Effects) error {
					_, err := fx.Get([]byte("ledger"))
					if first {
						first = false
						read.Done()
						read.Wait()
					}
					return err
				}})
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.ErrorIs(t, err, idemkv.ErrWrongState, "resolve %d", i)
	}
}

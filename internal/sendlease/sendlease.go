// Package sendlease is the rule every layer's Sending follows (httpidem,
// once, saga): right before a remote call, a holder with less than half
// of its lease left renews it, durably, so that the record moves past
// any moment a reconciler judged it from (idemkv.ResolveRequest.Since),
// and a holder whose lease is gone learns it (idemkv.ErrFenced) and
// sends nothing. With most of the lease left nothing is written: a
// reconciler waits the lease out anyway.
package sendlease

import (
	"context"
	"time"

	"github.com/idemkv/idemkv"
)

// Renew returns l as it may be sent under at now: l itself while more
// than half of length is left, else l renewed through store for d
// (zero: the store's default). A length of zero or less (unknown) always
// renews.
func Renew(ctx context.Context, store idemkv.Store, l idemkv.Lease, length, d time.Duration, now time.Time) (idemkv.Lease, error) {
	if length > 0 && now.Before(l.Expires.Add(-length/2)) {
		return l, nil
	}
	return store.Renew(ctx, l, d)
}

package pgstore_test

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/idemkv/idemkv/ttl"
	"github.com/stretchr/testify/require"
)

// skewed is a process's own wall clock, off by its value.
type skewed time.Duration

func (s skewed) Now() time.Time { return time.Now().Add(time.Duration(s)) }

// Two processes of a fleet whose clocks disagree by ten minutes decide by
// the database's clock: the one ahead neither takes over the other's live
// lease nor treats its completed record as expired. Each reading its own
// wall clock (idemkv.SystemClock's behaviour, skewed), the one ahead does
// both: what the default clock prevents.
func TestFleetDecidesByTheDatabasesClock(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	open := func(skew time.Duration, own bool) *pgstore.Store {
		o := &pgstore.Options{NoBackgroundSweep: true, Lease: 30 * time.Second,
			RetentionClasses: ttl.Classes{"short": time.Minute}}
		if own {
			o.Clock = skewed(skew)
		} else {
			o = pgstore.WithLocalSkew(o, skew)
		}
		s, err := pgstore.Open(ctx, dsn, o)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	for _, own := range []bool{false, true} {
		behind, ahead := open(-5*time.Minute, own), open(5*time.Minute, own)
		if !own {
			d := ahead.Now().Sub(behind.Now())
			require.Less(t, d.Abs(), time.Second, "one clock, whatever the processes' own say")
		}
		prefix := map[bool]string{false: "db-", true: "own-"}[own]

		// A live lease of the process behind.
		lease := reviewID(prefix + "lease")
		reviewClaim(t, behind, lease, idemkv.ModeLocal)
		c, err := ahead.Claim(ctx, idemkv.ClaimRequest{ID: lease, Fingerprint: []byte{1}})
		require.NoError(t, err)

		// A record completed a moment ago, kept a minute.
		done := reviewID(prefix + "done")
		c0, err := behind.Claim(ctx, idemkv.ClaimRequest{ID: done, Fingerprint: []byte{1}, Retention: "short"})
		require.NoError(t, err)
		require.NoError(t, behind.Complete(ctx, c0.Lease, idemkv.Result{Status: 201}, nil))
		again, err := ahead.Claim(ctx, idemkv.ClaimRequest{ID: done, Fingerprint: []byte{1}, Retention: "short"})
		require.NoError(t, err)

		if own {
			require.Equal(t, idemkv.Acquired, c.Outcome, "its own clock ran ten minutes ahead: the lease looked expired")
			require.True(t, c.Lease.Takeover())
			require.Equal(t, idemkv.Acquired, again.Outcome, "the record looked expired: the request ran again")
			continue
		}
		require.Equal(t, idemkv.InProgress, c.Outcome, "no early takeover")
		require.Equal(t, idemkv.Replay, again.Outcome, "no early expiry")
	}
}

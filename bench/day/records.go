package day

import (
	"fmt"
	"iter"
	"math/rand/v2"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
)

// shape is the traffic a day of records is left by.
type shape struct {
	// Records is how many records the day leaves.
	Records int64
	// Now is the end of the day: records were created in the Retention
	// before it, uniformly, and expire Retention after their creation.
	Now       time.Time
	Retention time.Duration
	// Tenants is how many tenants share the records (at least 1).
	Tenants int
	// Unsettled is the share of records still uncertain or in progress
	// (remote claims whose lease has run out).
	Unsettled float64
	// Seed draws the keys and times.
	Seed uint64
}

// endpoint is the endpoint of every record of a day.
const endpoint = "POST /v1/payments"

// buckets must match engine.BucketsPerWindow: the records come bucket by
// bucket, and each bucket's records in key order.
const buckets = engine.BucketsPerWindow

// tenant is the name of tenant i of a day: fixed width, so that tenants
// sort by number.
func tenant(i int) string { return fmt.Sprintf("tenant-%04d", i) }

// Records returns the records a day of the guide's traffic leaves, in the
// order the engine stores them (engine.SortKey): the unsettled records
// first, by key, then the completed ones bucket by bucket of their expiry,
// each bucket by tenant and key. Keys are UUIDs (version 4 layout) drawn
// in increasing order, so no sorting is needed and nothing is held in
// memory: a day of any size streams.
func Records(s shape) iter.Seq[idemkv.Record] {
	tenants := max(1, s.Tenants)
	unsettled := int64(float64(s.Records) * s.Unsettled)
	completed := s.Records - unsettled
	start := s.Now.Add(-s.Retention)
	width := s.Retention / buckets
	return func(yield func(idemkv.Record) bool) {
		r := rand.New(rand.NewPCG(s.Seed, 0x1dec))
		// The unsettled records: half uncertain, half in progress with
		// a lease that has run out, created in the last hour.
		for t := range tenants {
			n := share(unsettled, tenants, t)
			for i, key := range sortedKeys(r, n, 1) {
				rec := idemkv.Record{ID: idemkv.ID{Tenant: tenant(t), Endpoint: endpoint, Key: key},
					Mode: idemkv.ModeRemote, Fingerprint: fingerprint(r), Note: "provider timed out",
					Created: s.Now.Add(-time.Duration(r.Int64N(int64(time.Hour)))).Truncate(time.Second)}
				rec.State = idemkv.StateUncertain
				if i%2 == 1 {
					rec.State, rec.LeaseExpires = idemkv.StateInProgress, rec.Created.Add(time.Second)
				}
				if !yield(rec) {
					return
				}
			}
		}
		// The completed records, bucket by bucket: bucket b holds those
		// created in [from, from+width) of its hour (cut to the day), so
		// those that expire in the bucket's span; each gets its share of
		// the day by the time it spans.
		first := start.Truncate(width)
		done := int64(0)
		for b := range int64(buckets + 1) {
			from := first.Add(time.Duration(b) * width)
			lo, hi := maxTime(from, start), minTime(from.Add(width), s.Now)
			if !lo.Before(hi) {
				continue
			}
			upto := int64(float64(completed) * float64(hi.Sub(start)) / float64(s.Now.Sub(start)))
			n := upto - done
			done = upto
			for t := range tenants {
				for _, key := range sortedKeys(r, share(n, tenants, t), 2) {
					// Whole seconds after lo (so after the day's start and
					// in this bucket), before hi.
					created := lo.Add(time.Second + time.Duration(r.Int64N(int64(hi.Sub(lo))))).Truncate(time.Second)
					if !created.Before(hi) {
						created = hi.Add(-time.Second).Truncate(time.Second)
					}
					rec := idemkv.Record{ID: idemkv.ID{Tenant: tenant(t), Endpoint: endpoint, Key: key},
						State: idemkv.StateCompleted, Mode: idemkv.ModeRemote, Fingerprint: fingerprint(r),
						Result:  idemkv.Result{Status: 201, Pointer: pointer(r)},
						Created: created, Expires: created.Add(s.Retention)}
					if !yield(rec) {
						return
					}
				}
			}
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// share is part i of n split into parts as even as can be.
func share(n int64, parts, i int) int64 {
	q, rem := n/int64(parts), n%int64(parts)
	if int64(i) < rem {
		return q + 1
	}
	return q
}

// sortedKeys draws n UUID strings in increasing order: the 122 random
// bits of a version-4 UUID are drawn as an increasing sequence (one
// value in each of n equal slots of the top 60 bits, the rest uniform)
// and the fixed bits put around them, which keeps the order. Keys of
// different kinds (kind 1, 2) never collide: the kind picks the top bit.
func sortedKeys(r *rand.Rand, n int64, kind uint64) iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		if n <= 0 {
			return
		}
		const topBits = 59 // below the kind's bit
		slot := uint64(1<<topBits) / uint64(n)
		for i := range uint64(n) {
			hi60 := (kind-1)<<topBits | i*slot + r.Uint64N(max(1, slot))
			lo62 := r.Uint64() >> 2
			var u [16]byte
			hi := (hi60>>12)<<16 | 0x4<<12 | hi60&0xfff
			lo := 0b10<<62 | lo62
			for j := range 8 {
				u[j] = byte(hi >> (56 - 8*j))
				u[8+j] = byte(lo >> (56 - 8*j))
			}
			if !yield(int(i), bench.UUID(u)) {
				return
			}
		}
	}
}

// fingerprint is a request fingerprint as the middleware makes them: a
// version byte and eight bytes of hash.
func fingerprint(r *rand.Rand) []byte {
	fp := make([]byte, 9)
	fp[0] = 1
	v := r.Uint64()
	for j := range 8 {
		fp[1+j] = byte(v >> (8 * j))
	}
	return fp
}

// pointer is a compact result pointer: the payment's resource path.
func pointer(r *rand.Rand) string {
	return fmt.Sprintf("/v1/payments/pay_%015x", r.Uint64()>>4)
}

package workloads

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"

	"github.com/idemkv/idemkv/bench"
)

// The guide's sizing estimate the report is set against: 5,000 unsafe
// requests/s, 200 B per key (2,000 B with full responses), two extra
// durable writes per request (10,000/s).
const (
	guideRate                = 5000.0
	guideBytesPerKey         = 200.0
	guideBytesPerKeyWithBody = 2000.0
	guideWritesPerRequest    = 2.0
)

// Sizing is the guide's sizing table redone with measured numbers.
type Sizing struct {
	GuideRequestsPerSec float64 `json:"guide_requests_per_sec"` // the guide's rate, 5,000 unsafe requests/s
	// RetentionSeconds is the engine's key retention, in seconds (86,400
	// by default).
	RetentionSeconds float64 `json:"retention_seconds"`
	KeysPerDay       int64   `json:"keys_per_day"` // GuideRequestsPerSec × RetentionSeconds: 432 M
	// GuideBytesPerKey is the guide's estimate of a key's bytes on disk
	// without a stored response, 200 B.
	GuideBytesPerKey float64 `json:"guide_bytes_per_key"`
	// GuideBytesPerKeyWithBody is the guide's estimate with a stored
	// response, 2,000 B.
	GuideBytesPerKeyWithBody float64        `json:"guide_bytes_per_key_with_body"`
	Targets                  []SizingTarget `json:"targets"` // one column per target
}

// SizingTarget is one target's column of the sizing table.
type SizingTarget struct {
	Target string `json:"target"` // the target's name: engine or baseline
	// Keys is the number of records loaded into a fresh store for the
	// measurement (status, 32-byte pointer, 9-byte fingerprint, UUID key,
	// tenant scope, no effect); 0 if not measured.
	Keys int `json:"keys"`
	// BytesPerKey is the live sstable bytes after flush and compaction
	// divided by Keys, in bytes.
	BytesPerKey      float64 `json:"bytes_per_key"`
	StoreBytesPerDay float64 `json:"store_bytes_per_day"` // BytesPerKey × KeysPerDay, in bytes
	// BodyKeys is the number of records of the same measurement made with
	// a stored BodyBytes-byte JSON response body; 0 if not measured.
	BodyKeys  int `json:"body_keys"`
	BodyBytes int `json:"body_bytes"` // the size of each of those bodies, in bytes
	// BytesPerKeyWithBody is the measured (not computed) bytes per record
	// with a body.
	BytesPerKeyWithBody float64 `json:"bytes_per_key_with_body"`
	// StoreBytesPerDayWithBodies is BytesPerKeyWithBody × KeysPerDay, in
	// bytes.
	StoreBytesPerDayWithBodies float64 `json:"store_bytes_per_day_with_bodies"`
	// PeakUniqueRequestsPerSec is the best unique throughput of the sweep,
	// in requests/s.
	PeakUniqueRequestsPerSec float64 `json:"peak_unique_requests_per_sec"`
	PeakUniqueConcurrency    int     `json:"peak_unique_concurrency"` // the concurrency it was measured at
	Headroom                 float64 `json:"headroom"`                // PeakUniqueRequestsPerSec / GuideRequestsPerSec
	FsyncsPerRequest         float64 `json:"fsyncs_per_request"`      // the fsyncs per request at that peak
	// SyncedBatchesPerRequest is the synced batches per request at that
	// peak (the guide assumes 2 extra durable writes per request).
	SyncedBatchesPerRequest float64 `json:"synced_batches_per_request"`
}

// sizing measures bytes per key on fresh stores of each target, and fills
// in the guide's table from the sweep's points.
func (r *runner) sizing(ctx context.Context, pts []Point) (Sizing, error) {
	sz := Sizing{GuideRequestsPerSec: guideRate, RetentionSeconds: r.o.Engine.Retention.Seconds(),
		GuideBytesPerKey: guideBytesPerKey, GuideBytesPerKeyWithBody: guideBytesPerKeyWithBody}
	sz.KeysPerDay = int64(guideRate * sz.RetentionSeconds)
	for _, t := range r.o.Targets {
		st := SizingTarget{Target: t.Name}
		if r.o.SizingKeys > 0 {
			b, err := r.bytesPerKey(ctx, t, r.o.SizingKeys, nil)
			if err != nil {
				return Sizing{}, err
			}
			st.Keys, st.BytesPerKey = r.o.SizingKeys, b
			st.StoreBytesPerDay = b * float64(sz.KeysPerDay)
			r.run.Step("sizing " + t.Name)
		}
		if r.o.BodyKeys > 0 {
			b, err := r.bytesPerKey(ctx, t, r.o.BodyKeys, sizingBody(r.o.BodyBytes))
			if err != nil {
				return Sizing{}, err
			}
			st.BodyKeys, st.BodyBytes, st.BytesPerKeyWithBody = r.o.BodyKeys, r.o.BodyBytes, b
			st.StoreBytesPerDayWithBodies = b * float64(sz.KeysPerDay)
			r.run.Step("sizing with bodies " + t.Name)
		}
		// Headroom and durable writes from the unique sweep.
		for _, p := range pts {
			if p.Target == t.Name && p.Workload == unique && p.RequestsPerSec > st.PeakUniqueRequestsPerSec {
				st.PeakUniqueRequestsPerSec = p.RequestsPerSec
				st.PeakUniqueConcurrency = p.Concurrency
				st.FsyncsPerRequest = p.FsyncsPerRequest
				st.SyncedBatchesPerRequest = p.SyncedBatchesPerRequest
			}
		}
		st.Headroom = st.PeakUniqueRequestsPerSec / guideRate
		sz.Targets = append(sz.Targets, st)
	}
	return sz, nil
}

// bytesPerKey seeds a fresh store of t with n records with body, settles
// it and returns its sstable bytes per record.
func (r *runner) bytesPerKey(ctx context.Context, t Target, n int, body []byte) (float64, error) {
	o, err := r.seeded(ctx, t, r.newStream(), n, body)
	if err == nil {
		err = o.close()
	}
	if err != nil {
		return 0, fmt.Errorf("bench: sizing %s: %w", t.Name, err)
	}
	return float64(o.disk.TableBytes) / float64(n), nil
}

// sizingBody returns an n-byte JSON response body: line items whose ids,
// amounts and descriptions are random digits (about 40% of the bytes) among
// repeated field names, so that it compresses about as well as a real API
// response.
func sizingBody(n int) []byte {
	rng := rand.New(rand.NewPCG(42, 42))
	const head, tail = `{"object":"payment","status":"succeeded","currency":"usd","items":[`, `],"pad":"`
	if n < len(head)+len(tail)+2 {
		return bytes.Repeat([]byte{'x'}, n)
	}
	b := make([]byte, 0, n)
	b = append(b, head...)
	for {
		item := fmt.Sprintf(`{"id":"it_%016x","amount":%d,"description":"item %08x"}`, rng.Uint64(), rng.IntN(100000), rng.Uint32())
		if len(b)+1+len(item)+len(tail)+2 > n {
			break
		}
		if len(b) > len(head) {
			b = append(b, ',')
		}
		b = append(b, item...)
	}
	b = append(b, tail...)
	for len(b) < n-2 {
		b = append(b, 'x')
	}
	return append(b, `"}`...)
}

// write writes the sizing table.
func (sz *Sizing) write(w io.Writer) {
	if len(sz.Targets) == 0 {
		return
	}
	fmt.Fprintf(w, "\nSizing against the guide (%s unsafe requests/s, %s retention):\n",
		bench.Count(sz.GuideRequestsPerSec), bench.Seconds(sz.RetentionSeconds))
	row := func(label, guide string, cell func(t SizingTarget) string) {
		fmt.Fprintf(w, "  %-40s %14s", label, guide)
		for _, t := range sz.Targets {
			fmt.Fprintf(w, " %16s", cell(t))
		}
		fmt.Fprintln(w)
	}
	// measured formats v with f, or "-" if n says it was not measured.
	measured := func(n int, v float64, f func(float64) string) string {
		if n <= 0 {
			return "-"
		}
		return f(v)
	}
	bpk := func(v float64) string { return fmt.Sprintf("%.1f B", v) }
	twoDecimals := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	perDay := func(v float64) string { return bench.ByteSize(v * float64(sz.KeysPerDay)) }
	row("", "guide", func(t SizingTarget) string { return t.Target })
	row("keys/day", bench.Count(float64(sz.KeysPerDay)), func(SizingTarget) string { return bench.Count(float64(sz.KeysPerDay)) })
	row("bytes/key on disk (measured)", bpk(sz.GuideBytesPerKey), func(t SizingTarget) string {
		return measured(t.Keys, t.BytesPerKey, bpk)
	})
	row("store size/day, no bodies", perDay(sz.GuideBytesPerKey), func(t SizingTarget) string {
		return measured(t.Keys, t.StoreBytesPerDay, bench.ByteSize)
	})
	bodyLabel := "store size/day, with bodies"
	for _, t := range sz.Targets {
		if t.BodyKeys > 0 {
			bodyLabel = fmt.Sprintf("store size/day, %s-byte bodies", bench.Count(float64(t.BodyBytes)))
		}
	}
	row(bodyLabel, perDay(sz.GuideBytesPerKeyWithBody), func(t SizingTarget) string {
		return measured(t.BodyKeys, t.StoreBytesPerDayWithBodies, bench.ByteSize)
	})
	row("headroom (peak unique req/s / guide rate)", "-", func(t SizingTarget) string {
		if t.PeakUniqueRequestsPerSec == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1fx (c=%d)", t.Headroom, t.PeakUniqueConcurrency)
	})
	row("fsyncs/request (at that peak)", "-", func(t SizingTarget) string {
		return measured(t.PeakUniqueConcurrency, t.FsyncsPerRequest, twoDecimals)
	})
	row("synced batches/request (at that peak)", fmt.Sprintf("%.0f", guideWritesPerRequest), func(t SizingTarget) string {
		return measured(t.PeakUniqueConcurrency, t.SyncedBatchesPerRequest, twoDecimals)
	})
	for _, t := range sz.Targets {
		if t.Keys > 0 {
			fmt.Fprintf(w, "  bytes/key: sstable bytes after flush and compaction over %s records (status, 32-byte pointer,\n"+
				"  9-byte fingerprint, UUID key, tenant scope)", bench.Count(float64(t.Keys)))
			if t.BodyKeys > 0 {
				fmt.Fprintf(w, "; with bodies: measured the same way on %s records\n  with a %s-byte JSON-like body",
					bench.Count(float64(t.BodyKeys)), bench.Count(float64(t.BodyBytes)))
			}
			fmt.Fprintln(w, ".")
			break
		}
	}
}

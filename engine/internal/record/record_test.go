package record

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func sample() []idemkv.Record {
	t0 := time.UnixMilli(1_790_000_000_000)
	return []idemkv.Record{
		{State: idemkv.StateInProgress, Mode: idemkv.ModeRemote, Fingerprint: []byte{1, 2, 3},
			Token: 1 << 40, Attempt: 1, OperationID: idemkv.OperationID{9, 9},
			Created: t0, LeaseExpires: t0.Add(30 * time.Second), Expires: t0.Add(24 * time.Hour)},
		{State: idemkv.StateCompleted, Fingerprint: []byte{7}, Token: 5, Attempt: 2,
			Created: t0, Expires: t0.Add(time.Hour),
			Result: idemkv.Result{Status: 201, Pointer: "/v1/payments/p42", Body: []byte(`{"id":"p42"}`)}},
		{State: idemkv.StateCompleted, Fingerprint: []byte{7}, Token: 5, Attempt: 1,
			Created: t0, Expires: t0.Add(time.Hour), Result: idemkv.Result{Status: 204}},
		{State: idemkv.StateCompleted, Fingerprint: []byte{7}, Token: 6, Attempt: 1,
			Created: t0, Expires: t0.Add(time.Hour), Result: idemkv.Result{Status: 201}, Effects: 3},
		{State: idemkv.StateUncertain, Mode: idemkv.ModeRemote, Fingerprint: []byte("fp"), Token: 77,
			Attempt: 3, OperationID: idemkv.OperationID{1}, Created: t0, Expires: t0.Add(time.Hour),
			Note: "provider timed out", Class: "money", Marked: t0.Add(1234 * time.Millisecond)},
		{State: idemkv.StateUncertain, Mode: idemkv.ModeRemote, Fingerprint: []byte("fp"), Token: 78,
			Attempt: 1, OperationID: idemkv.OperationID{2}, Created: t0, Expires: t0.Add(time.Hour),
			Note: "12 reconciliation attempts", Escalated: true, Marked: t0.Add(time.Minute)},
		// Marked by a store that did not keep the mark.
		{State: idemkv.StateUncertain, Mode: idemkv.ModeRemote, Fingerprint: []byte("fp"), Token: 80,
			Attempt: 1, OperationID: idemkv.OperationID{4}, Created: t0, Expires: t0.Add(time.Hour),
			Note: "timeout", Escalated: true},
		{State: idemkv.StateCompleted, Mode: idemkv.ModeRemote, Fingerprint: []byte("fp"), Token: 79,
			Attempt: 1, OperationID: idemkv.OperationID{3}, Created: t0, Expires: t0.Add(time.Hour),
			Result: idemkv.Result{Status: 201, Pointer: "/v1/payments/pay_1"}, Note: "ops: charge seen in the processor's dashboard"},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, r := range sample() {
		b := Encode(nil, &r)
		got, err := Decode(b)
		require.NoError(t, err)
		require.Equal(t, r, got)
	}
}

// TestCompact pins the size of a typical completed record (status +
// pointer, no body) so that a change that bloats the encoding is noticed.
func TestCompact(t *testing.T) {
	r := sample()[2]
	r.Fingerprint = make([]byte, 9)
	r.Result.Pointer = "/v1/payments/pay_0123456789"
	require.LessOrEqual(t, len(Encode(nil, &r)), 64)
}

func TestRejectsCorrupt(t *testing.T) {
	good := Encode(nil, &sample()[1])
	cases := map[string][]byte{
		"empty":                nil,
		"version":              append([]byte{3}, good[1:]...),
		"empty extension":      append([]byte{2, 0}, good[1:]...),
		"unknown extension":    append([]byte{2, 4}, good[1:]...),
		"escalated completed":  append([]byte{2, extEscalated}, good[1:]...),
		"note on pending":      append([]byte{2, extNote, 1}, good[2:]...),
		"state zero":           append([]byte{1, good[1] &^ stateMask}, good[2:]...),
		"effects on pending":   append([]byte{1, 1 | headEffects}, good[2:]...),
		"zero effects":         {1, 3 | headEffects, 5, 10, 0, 1, 7, 0, 0, 0},
		"truncated":            good[:len(good)-1],
		"trailing bytes":       append(append([]byte(nil), good...), 0),
		"bad varint":           {1, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"non-minimal":          {1, 3, 0x80, 0x00},
		"attempt one":          {1, 3 | headAttempt, 5, 1},
		"body on pending":      append([]byte{1, 1 | headBody}, good[2:]...),
		"created after expiry": {1, 3, 5, 10, 11, 1, 7, 0, 0},
		"marked completed":     append([]byte{2, extMarked}, good[1:]...),
		"marked in progress":   append([]byte{2, extMarked, 1}, good[2:]...),
		"zero mark":            {2, extMarked, 2, 5, 10, 0, 1, 7, 0, 0},
		"non-minimal mark":     {2, extMarked, 2, 5, 10, 0, 1, 7, 0, 0x81, 0x00},
		"mark out of range":    append([]byte{2, extMarked, 2, 5, 10, 0, 1, 7, 0}, binary.AppendUvarint(nil, 1<<53+1)...),
		"mark missing":         {2, extMarked, 2, 5, 10, 0, 1, 7, 0},
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(b)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrCorrupt), "%v", err)
		})
	}
}

// TestMarkedRoundsUp: the uncertain mark is kept to the millisecond,
// rounded up (a grace measured from it is never shortened), exactly as
// Milliseconds rounds it; it is kept on uncertain records only, and a
// record without one is written as before (version 1).
func TestMarkedRoundsUp(t *testing.T) {
	r := sample()[4]
	r.Marked = time.Unix(1_790_000_000, 1_000_001)
	got, err := Decode(Encode(nil, &r))
	require.NoError(t, err)
	require.Equal(t, time.UnixMilli(1_790_000_000_002), got.Marked)
	require.Equal(t, Milliseconds(r.Marked), got.Marked)
	require.Equal(t, got.Marked, Milliseconds(got.Marked), "whole milliseconds stay as they are")

	r.Marked, r.Class = time.Time{}, ""
	require.Equal(t, byte(Version), Encode(nil, &r)[0], "no mark, no extension")

	for _, st := range []idemkv.State{idemkv.StateInProgress, idemkv.StateCompleted} {
		r := sample()[4]
		r.State = st
		got, err := Decode(Encode(nil, &r))
		require.NoError(t, err)
		require.True(t, got.Marked.IsZero(), "a %s record keeps no mark", st)
	}
}

func TestRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := genRecord(t)
		b := Encode(nil, &r)
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		require.Equal(t, r, got)
		st, exp, err := Peek(b)
		require.NoError(t, err)
		require.Equal(t, r.State, st)
		require.True(t, exp.Equal(r.Expires), "peek %v, record %v", exp, r.Expires)
	})
}

func genRecord(t *rapid.T) idemkv.Record {
	// Expiry and creation are stored in whole seconds, the lease in
	// milliseconds: generate what the codec keeps exactly.
	exp := rapid.Int64Range(1, 1<<40).Draw(t, "expires")
	r := idemkv.Record{
		State:       idemkv.State(rapid.IntRange(1, 3).Draw(t, "state")),
		Mode:        idemkv.Mode(rapid.IntRange(0, 1).Draw(t, "mode")),
		Fingerprint: rapid.SliceOfN(rapid.Byte(), 1, idemkv.MaxFingerprintLen).Draw(t, "fp"),
		Token:       rapid.Uint64().Draw(t, "token"),
		Attempt:     rapid.Uint32().Draw(t, "attempt"),
		Created:     time.Unix(rapid.Int64Range(0, exp).Draw(t, "created"), 0),
		Expires:     time.Unix(exp, 0),
	}
	ms := func(label string) time.Time {
		return time.UnixMilli(rapid.Int64Range(1, 1<<45).Draw(t, label))
	}
	if rapid.Bool().Draw(t, "opid") {
		r.OperationID[rapid.IntRange(0, 15).Draw(t, "opidx")] = rapid.ByteRange(1, 255).Draw(t, "opb")
	}
	r.Class = rapid.SampledFrom([]string{"", "money", "a-32-byte-class-name-0123456789_"}).Draw(t, "class")
	switch r.State {
	case idemkv.StateInProgress:
		r.LeaseExpires = ms("lease")
	case idemkv.StateCompleted:
		r.Result.Status = rapid.IntRange(0, 65535).Draw(t, "status")
		r.Result.Pointer = rapid.StringN(0, 40, idemkv.MaxPointerLen).Draw(t, "ptr")
		r.Result.Body = rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(t, "body")
		if len(r.Result.Body) == 0 {
			r.Result.Body = nil
		}
		r.Effects = rapid.IntRange(0, MaxEffects).Draw(t, "effects")
		if rapid.Bool().Draw(t, "audited") {
			r.Note = rapid.StringN(1, 40, idemkv.MaxNoteLen).Draw(t, "audit")
		}
	case idemkv.StateUncertain:
		r.Note = rapid.StringN(0, 40, idemkv.MaxNoteLen).Draw(t, "note")
		r.Escalated = rapid.Bool().Draw(t, "escalated")
		if rapid.Bool().Draw(t, "marked") {
			r.Marked = ms("marked")
		}
	}
	return r
}

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to
// the same bytes (the encoding is canonical).
func FuzzDecode(f *testing.F) {
	for _, r := range sample() {
		f.Add(Encode(nil, &r))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 3, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, exp, perr := Peek(b)
		if perr != nil && !errors.Is(perr, ErrCorrupt) {
			t.Fatalf("Peek error does not wrap ErrCorrupt: %v", perr)
		}
		r, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		// Whatever Decode accepts, Peek reads alike.
		if perr != nil || st != r.State || !exp.Equal(r.Expires) {
			t.Fatalf("Peek %v %v %v, Decode %v %v", st, exp, perr, r.State, r.Expires)
		}
		again := Encode(nil, &r)
		if string(again) != string(b) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", b, again)
		}
	})
}

func TestStamp(t *testing.T) {
	exp := time.Unix(1_790_000_000, 1) // rounded up, as Encode rounds expiries
	v := append(AppendStamp(nil, 42, exp), "row"...)
	require.Len(t, v, StampLen+3)
	tok, got, val, err := SplitStamp(v)
	require.NoError(t, err)
	require.Equal(t, uint64(42), tok)
	require.True(t, got.Equal(Seconds(exp)), "%v", got)
	require.Equal(t, "row", string(val))

	for name, b := range map[string][]byte{
		"short":      v[:StampLen-1],
		"zero token": AppendStamp(nil, 0, exp),
		"far expiry": append(binary.BigEndian.AppendUint64(nil, 1), 0xff, 0, 0, 0, 0, 0, 0, 0),
	} {
		_, _, _, err := SplitStamp(b)
		require.ErrorIs(t, err, ErrCorrupt, name)
	}
}

// FuzzSplitStamp: SplitStamp never panics, and whatever it accepts
// re-stamps to the same bytes.
func FuzzSplitStamp(f *testing.F) {
	f.Add(append(AppendStamp(nil, 7, time.Unix(1_790_000_000, 0)), "row"...))
	f.Add([]byte{})
	f.Add(make([]byte, StampLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, exp, val, err := SplitStamp(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		again := append(AppendStamp(nil, tok, exp), val...)
		if string(again) != string(b) {
			t.Fatalf("re-stamping differs:\n in  %x\n out %x", b, again)
		}
	})
}

// AppendKey grows its buffer once: every claim and completion builds a
// record key.
func TestAppendKeyAllocatesOnce(t *testing.T) {
	id := idemkv.ID{Tenant: "tenant-0042", Endpoint: "POST /v1/payments", Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"}
	var k []byte
	allocs := testing.AllocsPerRun(100, func() { k = AppendKey(nil, id) })
	if !raceEnabled {
		require.Equal(t, 1.0, allocs)
	}
	got, err := DecodeKey(k)
	require.NoError(t, err)
	require.Equal(t, id, got)
}

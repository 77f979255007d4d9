package httpidem

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEnvelopeV2IsCompact: a JSON 201's headers (Content-Type and a
// Location naming the pointer) take 6 bytes, where version 1 spelled them
// out in 60.
func TestEnvelopeV2IsCompact(t *testing.T) {
	const pointer = "/v1/payments/pay_6"
	body := []byte(`{"id":"pay_6"}`)
	e := envelope{header: [][2]string{{"Content-Type", "application/json"}, {"Location", pointer}}, haveBody: true, body: body}
	b := e.encode(pointer)
	require.Equal(t, append([]byte{envelopeV2, flagBody, 2, 1, 3, 3, 1}, body...), b)

	got, err := decodeEnvelope(b, pointer)
	require.NoError(t, err)
	require.Equal(t, e.header, got.header)
	require.Equal(t, body, got.body)

	// Without the pointer the reference cannot be resolved.
	_, err = decodeEnvelope(b, "")
	require.ErrorIs(t, err, errEnvelope)
}

// TestEnvelopeV2SpellsOutWhatIsNotInTheTables: names and values missing
// from the static tables, an empty value, and a Location that is not the
// pointer are stored as they are.
func TestEnvelopeV2SpellsOutWhatIsNotInTheTables(t *testing.T) {
	e := envelope{header: [][2]string{{"X-Request-Cost", "3"}, {"Location", "/elsewhere"}, {"Content-Type", ""}, {"Content-Type", "application/json"}}}
	for _, pointer := range []string{"", "/v1/x/1"} {
		got, err := decodeEnvelope(e.encode(pointer), pointer)
		require.NoError(t, err)
		require.Equal(t, e.header, got.header)
		require.False(t, got.haveBody)
	}
}

// TestEnvelopeV1StillDecodes: records written before version 2 replay
// until they expire. The bytes are version 1's encoding of a 201 with two
// headers, diagnostics and a body.
func TestEnvelopeV1StillDecodes(t *testing.T) {
	b := []byte("\x01\x03\x02" +
		"\x0cContent-Type\x10application/json" +
		"\x08Location\x04/p/1" +
		"\x02\xaa\xbb" +
		`{"id":1}`)
	got, err := decodeEnvelope(b, "/p/1")
	require.NoError(t, err)
	require.Equal(t, [][2]string{{"Content-Type", "application/json"}, {"Location", "/p/1"}}, got.header)
	require.Equal(t, []byte{0xaa, 0xbb}, got.diag)
	require.True(t, got.haveBody)
	require.Equal(t, `{"id":1}`, string(got.body))
}

// TestEnvelopeV2RejectsBadRefs: a table entry past the end and a literal
// longer than the bytes left are errors, not panics.
func TestEnvelopeV2RejectsBadRefs(t *testing.T) {
	for _, b := range [][]byte{
		{envelopeV2, 0, 1, 0xff, 0x01, 1}, // name entry 127
		{envelopeV2, 0, 1, 1, 0x41},       // value entry 32
		{envelopeV2, 0, 1, 1, 0x08, 'a'},  // a 4-byte literal with 1 byte left
		{envelopeV2, 0, 1, 1},             // no value
		{3, 0, 0},                         // unknown version
	} {
		_, err := decodeEnvelope(b, "/p")
		require.ErrorIs(t, err, errEnvelope, "%q", b)
	}
}

// TestOutcomeIsWhatARouteStores: a Result built by Outcome decodes to its
// headers and body, or to no body for a Rebuild to answer.
func TestOutcomeIsWhatARouteStores(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_1"}}
	res := Outcome(201, "/v1/payments/pay_1", h, []byte(`{"id":"pay_1"}`))
	require.Equal(t, 201, res.Status)
	env, err := decodeEnvelope(res.Body, res.Pointer)
	require.NoError(t, err)
	require.Equal(t, [][2]string{{"Content-Type", "application/json"}, {"Location", "/v1/payments/pay_1"}}, env.header)
	require.True(t, env.haveBody)
	require.Equal(t, `{"id":"pay_1"}`, string(env.body))

	env, err = decodeEnvelope(Outcome(201, "/v1/payments/pay_1", nil, nil).Body, "/v1/payments/pay_1")
	require.NoError(t, err)
	require.False(t, env.haveBody)
	require.Empty(t, env.header)
}

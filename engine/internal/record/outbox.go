package record

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
)

// Outbox keys (namespace NSOutbox).
var (
	// OutboxCursorKey holds the sequence of the last acknowledged event (a
	// big-endian uint64); absent means none.
	OutboxCursorKey = []byte{NSOutbox, 'c'}
	// OutboxEventPrefix starts the key of every event not yet
	// acknowledged.
	OutboxEventPrefix = []byte{NSOutbox, 'e'}
)

// OutboxEventKey returns the key of the event with sequence seq.
func OutboxEventKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{NSOutbox, 'e'}, seq)
}

// OutboxEventSeq returns the sequence of an event key.
func OutboxEventSeq(k []byte) (uint64, error) {
	if len(k) != 10 || k[0] != NSOutbox || k[1] != 'e' {
		return 0, fmt.Errorf("%w: outbox event key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[2:]), nil
}

// OutboxEntityKey returns the key of the last sequence of the events of
// (topic, key).
func OutboxEntityKey(topic, key string) []byte {
	k := make([]byte, 0, 2+binary.MaxVarintLen64+len(topic)+len(key))
	k = append(k, NSOutbox, 'n')
	k = binary.AppendUvarint(k, uint64(len(topic)))
	return append(append(k, topic...), key...)
}

// eventVersion is the first byte of an encoded event.
const eventVersion = 1

// EventEntitySeqOffset is where an encoded event keeps its entity
// sequence (8 bytes, big-endian), which the committer fills in.
const EventEntitySeqOffset = 1 + 8 + 8

// AppendEvent appends the encoding of an event emitted by the operation
// holding token, created at created, with id (16 bytes) and an entity
// sequence of 0, to be filled in at EventEntitySeqOffset:
//
//	version(1) token(8) created-unix-nanos(8) entity-seq(8) id(16)
//	uvarint topic, uvarint key, uvarint #headers, (uvarint name,
//	uvarint value)*, payload (the rest)
//
// The event's own sequence is its key.
func AppendEvent(dst []byte, ev *idemkv.Event, token uint64, created time.Time, id [16]byte) []byte {
	dst = append(dst, eventVersion)
	dst = binary.BigEndian.AppendUint64(dst, token)
	dst = binary.BigEndian.AppendUint64(dst, uint64(created.UnixNano()))
	dst = binary.BigEndian.AppendUint64(dst, 0)
	dst = append(dst, id[:]...)
	dst = appendString(dst, ev.Topic)
	dst = appendString(dst, ev.Key)
	dst = binary.AppendUvarint(dst, uint64(len(ev.Headers)))
	for name, v := range ev.Headers {
		dst = appendString(dst, name)
		dst = appendString(dst, v)
	}
	return append(dst, ev.Payload...)
}

// EventSize is the length of AppendEvent's encoding of ev.
func EventSize(ev *idemkv.Event) int {
	n := EventEntitySeqOffset + 8 + 16 + uvarintLen(len(ev.Topic)) + len(ev.Topic) + uvarintLen(len(ev.Key)) + len(ev.Key) +
		uvarintLen(len(ev.Headers)) + len(ev.Payload)
	for name, v := range ev.Headers {
		n += uvarintLen(len(name)) + len(name) + uvarintLen(len(v)) + len(v)
	}
	return n
}

func uvarintLen(n int) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], uint64(n))
}

func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

// DecodeEvent decodes an event stored under the key with sequence seq.
// The event shares no memory with v. It also returns the token of the
// operation that emitted it.
func DecodeEvent(seq uint64, v []byte) (idemkv.StoredEvent, uint64, error) {
	var ev idemkv.StoredEvent
	if len(v) < EventEntitySeqOffset+8+16 || v[0] != eventVersion {
		return ev, 0, fmt.Errorf("%w: outbox event %d: bad header", ErrCorrupt, seq)
	}
	token := binary.BigEndian.Uint64(v[1:])
	ev.Created = time.Unix(0, int64(binary.BigEndian.Uint64(v[9:])))
	ev.EntitySeq = binary.BigEndian.Uint64(v[EventEntitySeqOffset:])
	ev.ID = fmt.Sprintf("%x", v[EventEntitySeqOffset+8:EventEntitySeqOffset+24])
	ev.Seq = seq
	r := v[EventEntitySeqOffset+24:]
	var err error
	next := func() string {
		n, k := binary.Uvarint(r)
		if k <= 0 || n > uint64(len(r)-k) {
			err = fmt.Errorf("%w: outbox event %d: truncated", ErrCorrupt, seq)
			r = nil
			return ""
		}
		s := string(r[k : k+int(n)])
		r = r[k+int(n):]
		return s
	}
	ev.Topic = next()
	ev.Key = next()
	nh, k := binary.Uvarint(r)
	if err == nil && (k <= 0 || nh > uint64(len(r))) {
		err = fmt.Errorf("%w: outbox event %d: bad header count", ErrCorrupt, seq)
	}
	if err != nil {
		return ev, 0, err
	}
	r = r[k:]
	if nh > 0 {
		ev.Headers = make(map[string]string, nh)
		for range nh {
			name := next()
			ev.Headers[name] = next()
		}
	}
	if err != nil {
		return ev, 0, err
	}
	ev.Payload = append([]byte(nil), r...)
	if ev.EntitySeq == 0 || token == 0 {
		return ev, 0, fmt.Errorf("%w: outbox event %d: zero token or entity sequence", ErrCorrupt, seq)
	}
	return ev, token, nil
}

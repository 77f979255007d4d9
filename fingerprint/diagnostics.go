package fingerprint

import (
	"encoding/binary"
	"fmt"
)

// Diagnostics.
//
// A fingerprint says only whether two requests differ. To say where, Compute
// can also return a digest of each covered part (Options.Diagnostics): the
// caller stores them beside the record and, when a retry mismatches, Explain
// recomputes the retry's digests and names the parts whose digests differ.
// They are digests, not values: nothing of a value is stored but 32 bits of
// its hash. Layout:
//
//	version:byte  entry...
//	entry = part:byte [str(name)] digest:[4]byte (big-endian)
//
// where name is present for the named parts (param, query, header, body
// field) only. A JSON body that is a non-empty object gets one entry per
// top-level member, named by its JSON Pointer ("/amount"); any other body
// gets one "body" entry; ModeFields gets one entry per pointer.

// Parts, as diagnostics entries name them. Frozen with version 1.
const (
	partTenant    = 1
	partMethod    = 2
	partRoute     = 3
	partParam     = 4
	partQuery     = 5
	partHeader    = 6
	partBody      = 7 // the whole body
	partBodyField = 8 // a top-level member (ModeJSON) or a selected field (ModeFields)
)

var partNames = [...]string{
	partTenant: "tenant", partMethod: "method", partRoute: "route", partParam: "param",
	partQuery: "query", partHeader: "header", partBody: "body", partBodyField: "body",
}

func partNamed(p byte) bool {
	return p == partParam || p == partQuery || p == partHeader || p == partBodyField
}

// entry is one diagnostics entry.
type entry struct {
	part   byte
	name   string
	digest uint32
}

func (e entry) String() string {
	if partNamed(e.part) {
		return partNames[e.part] + " " + e.name
	}
	return partNames[e.part]
}

func encodeDiagnostics(version byte, es []entry) []byte {
	n := 1
	for _, e := range es {
		n += 1 + binary.MaxVarintLen64 + len(e.name) + 4
	}
	dst := append(make([]byte, 0, n), version)
	for _, e := range es {
		dst = append(dst, e.part)
		if partNamed(e.part) {
			dst = appendStr(dst, e.name)
		}
		dst = binary.BigEndian.AppendUint32(dst, e.digest)
	}
	return dst
}

// decodeDiagnostics parses a diagnostics value of a known version.
func decodeDiagnostics(b []byte) (*algorithm, []entry, error) {
	if len(b) == 0 {
		return nil, nil, fmt.Errorf("%w: empty diagnostics", ErrInvalidStored)
	}
	a := algorithms[b[0]]
	if a == nil {
		return nil, nil, fmt.Errorf("%w: version %d", ErrUnknownVersion, b[0])
	}
	var es []entry
	for i := 1; i < len(b); {
		e := entry{part: b[i]}
		if e.part < partTenant || e.part > partBodyField {
			return nil, nil, fmt.Errorf("%w: diagnostics: unknown part %d at offset %d", ErrInvalidStored, e.part, i)
		}
		i++
		if partNamed(e.part) {
			n, k := binary.Uvarint(b[i:])
			if k <= 0 || n > uint64(len(b)-i-k) {
				return nil, nil, fmt.Errorf("%w: diagnostics: bad name length at offset %d", ErrInvalidStored, i)
			}
			i += k
			e.name = string(b[i : i+int(n)])
			i += int(n)
		}
		if len(b)-i < 4 {
			return nil, nil, fmt.Errorf("%w: diagnostics: truncated at offset %d", ErrInvalidStored, i)
		}
		e.digest = binary.BigEndian.Uint32(b[i:])
		i += 4
		es = append(es, e)
	}
	return a, es, nil
}

// Change says how a part differs.
type Change uint8

const (
	// Changed: the part is in both requests, with different values.
	Changed Change = iota + 1
	// Added: the part is only in the new request (a new member, a
	// parameter the stored request did not have).
	Added
	// Removed: the part was only in the stored request.
	Removed
)

func (c Change) String() string {
	switch c {
	case Changed:
		return "changed"
	case Added:
		return "added"
	case Removed:
		return "removed"
	}
	return fmt.Sprintf("Change(%d)", uint8(c))
}

// A Difference is one part of a request that differs from the stored one.
type Difference struct {
	// Part names it: "tenant", "method", "route", "param NAME",
	// "query NAME", "header NAME" (lower-case), "body" (the whole body) or
	// "body POINTER" (a top-level member, or a field in ModeFields).
	Part   string
	Change Change
}

// String returns, for example, "body /amount: changed".
func (d Difference) String() string { return d.Part + ": " + d.Change.String() }

// Explain compares req with the request that diagnostics was computed from
// (FP.Diagnostics, stored by the caller) and returns the parts that
// differ, stored order first, then parts only req has. It recomputes with
// the algorithm version diagnostics names. opts must be the options it was
// computed with; Options.Diagnostics need not be set.
//
// A digest is 32 bits, so a changed part goes unreported with probability
// 2^-32; an empty result for a request that Matches rejects means exactly
// that, or options that differ. It fails like Matches.
func Explain(diagnostics []byte, req Request, opts *Options) ([]Difference, error) {
	a, stored, err := decodeDiagnostics(diagnostics)
	if err != nil {
		return nil, err
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	c.diagnostics = true
	st := statePool.Get()
	defer st.release()
	if err := a.compute(st, &req, &c); err != nil {
		return nil, err
	}
	type key struct {
		part byte
		name string
	}
	now := make(map[key]uint32, len(st.entries))
	for _, e := range st.entries {
		now[key{e.part, e.name}] = e.digest
	}
	var diffs []Difference
	was := make(map[key]bool, len(stored))
	for _, e := range stored {
		k := key{e.part, e.name}
		was[k] = true
		if d, ok := now[k]; !ok {
			diffs = append(diffs, Difference{Part: e.String(), Change: Removed})
		} else if d != e.digest {
			diffs = append(diffs, Difference{Part: e.String(), Change: Changed})
		}
	}
	for _, e := range st.entries {
		if !was[key{e.part, e.name}] {
			diffs = append(diffs, Difference{Part: e.String(), Change: Added})
		}
	}
	return diffs, nil
}

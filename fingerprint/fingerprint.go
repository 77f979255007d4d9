package fingerprint

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"sync"
)

// A Request is the part of a request that defines the operation: who asks,
// what route with which path parameters, and the payload. Compute does not
// retain it or anything it refers to.
type Request struct {
	// Tenant is the authenticated principal or account the request acts
	// for: the same scope as idemkv.ID.Tenant, never a string the client
	// chose.
	Tenant string
	// Method is the HTTP method, compared exactly ("POST"; HTTP methods
	// are case-sensitive).
	Method string
	// Route is the route pattern that matched, "/v1/payments/{id}", not
	// the raw path: the path's variable parts belong in Params.
	Route string
	// Params are the path parameters by name. All are covered; a map has
	// no order, so neither does the fingerprint.
	Params map[string]string
	// Query holds the query parameters (a url.Values converts). Only the
	// names in Options.Query are covered.
	Query map[string][]string
	// Header holds the request's headers (an http.Header converts). Only
	// the names in Options.Headers are covered, matched case-insensitively.
	Header map[string][]string
	// Body is the request body.
	Body []byte
}

// FP is a computed fingerprint.
type FP struct {
	// Bytes is the fingerprint to store with the record
	// (idemkv.ClaimRequest.Fingerprint): the algorithm version (one byte,
	// CurrentVersion), then the version's digest. Version 1 is 9 bytes: the
	// big-endian xxhash64 of the request's canonical encoding.
	Bytes []byte
	// Diagnostics holds a digest of each covered part of the request when
	// Options.Diagnostics is set, else nil. Store it beside the record if
	// you want Explain to name what a mismatching retry changed. It does
	// not fit idemkv's fingerprint limit in general, and it is not compared
	// by the store.
	Diagnostics []byte
}

// String returns fp.Bytes in hex.
func (fp FP) String() string { return hex.EncodeToString(fp.Bytes) }

// Compute fingerprints req with the current algorithm version. A nil opts
// means the defaults (see Options).
//
// It fails with a *BodyError (matching ErrInvalidBody: answer 400) when the
// body cannot be fingerprinted in the chosen mode, and with
// ErrInvalidOptions when opts cannot be used. It is safe for concurrent
// use.
func Compute(req Request, opts *Options) (FP, error) {
	c, err := newConfig(opts)
	if err != nil {
		return FP{}, err
	}
	st := statePool.Get()
	defer st.release()
	a := algorithms[current]
	if err := a.compute(st, &req, &c); err != nil {
		return FP{}, err
	}
	fp := FP{Bytes: bytes.Clone(st.fp)}
	if c.diagnostics {
		fp.Diagnostics = encodeDiagnostics(current, st.entries)
	}
	return fp, nil
}

// Matches reports whether req has the fingerprint stored, computed with
// the algorithm version stored names, not necessarily the current one. Use
// it when the store answers Mismatch: a record fingerprinted before an
// upgrade does not equal the current version's bytes, yet its retries are
// legitimate. If Matches says so, claim again with the stored bytes:
//
//	c, err := st.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: fp.Bytes})
//	...
//	if c.Outcome == idemkv.Mismatch {
//		if ok, err := fingerprint.Matches(c.Record.Fingerprint, req, opts); err == nil && ok {
//			c, err = st.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: c.Record.Fingerprint})
//		}
//	}
//
// opts must be the options the stored fingerprint was computed with. It
// fails with ErrInvalidStored if stored is not a fingerprint of this
// package, ErrUnknownVersion if its version is newer than this build, and
// like Compute for a bad request or options.
func Matches(stored []byte, req Request, opts *Options) (bool, error) {
	a, err := algorithmOf(stored)
	if err != nil {
		return false, err
	}
	c, err := newConfig(opts)
	if err != nil {
		return false, err
	}
	c.diagnostics = false
	st := statePool.Get()
	defer st.release()
	if err := a.compute(st, &req, &c); err != nil {
		return false, err
	}
	return bytes.Equal(st.fp, stored), nil
}

// Version returns the algorithm version of a stored fingerprint. It fails
// with ErrInvalidStored or ErrUnknownVersion as Matches does.
func Version(stored []byte) (int, error) {
	a, err := algorithmOf(stored)
	if err != nil {
		return 0, err
	}
	return int(a.version), nil
}

func algorithmOf(stored []byte) (*algorithm, error) {
	if len(stored) == 0 {
		return nil, fmt.Errorf("%w: empty fingerprint", ErrInvalidStored)
	}
	a := algorithms[stored[0]]
	if a == nil {
		return nil, fmt.Errorf("%w: version %d", ErrUnknownVersion, stored[0])
	}
	if len(stored) != a.size {
		return nil, fmt.Errorf("%w: %d bytes, a version %d fingerprint has %d", ErrInvalidStored, len(stored), a.version, a.size)
	}
	return a, nil
}

// A Field is one member selected in ModeFields.
type Field struct {
	// Pointer is the JSON Pointer from Options.Fields.
	Pointer string
	// Value is the selected value in JCS form, or nil if the pointer
	// selects nothing in the body.
	Value []byte
}

// Select returns what ModeFields covers in body: one Field per pointer of
// opts.Fields, sorted, without repetitions. opts.Mode must be ModeFields.
// It fails like Canonical, except that an empty body selects nothing.
func Select(body []byte, opts *Options) ([]Field, error) {
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if c.mode != ModeFields {
		return nil, fmt.Errorf("%w: Select needs Mode fields, not %s", ErrInvalidOptions, c.mode)
	}
	if len(body) > c.maxBody {
		return nil, tooLarge(len(body), c.maxBody)
	}
	fields := make([]Field, len(c.fields))
	for i, p := range c.fields {
		fields[i].Pointer = p
	}
	if len(body) == 0 {
		return fields, nil
	}
	cn := canonPool.Get()
	defer cn.release()
	if err := cn.run(body, c.maxDepth, c.inexact); err != nil {
		return nil, err
	}
	for i := range fields {
		if v, ok := lookup(cn.out, fields[i].Pointer); ok {
			fields[i].Value = bytes.Clone(v)
		}
	}
	return fields, nil
}

// pool is a typed sync.Pool.
type pool[T any] struct{ p sync.Pool }

func poolOf[T any](newT func() *T) *pool[T] {
	return &pool[T]{p: sync.Pool{New: func() any { return newT() }}}
}

func (p *pool[T]) Get() *T  { return p.p.Get().(*T) }
func (p *pool[T]) Put(x *T) { p.p.Put(x) }

package idemkv

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Settling the records a store could not settle itself: an uncertain
// record, or an abandoned one, is listed (ListRequest), resolved once the
// downstream has said what happened (ResolveRequest), or escalated to an
// operator (EscalateRequest); each write is judged from the moment the
// record's attempt last may have called downstream (Record.LastCall).

// ResolveRequest settles a record once a reconciler (or an operator) has
// learned what happened downstream: an uncertain record, escalated or not,
// or an abandoned one (a remote record in progress whose lease has run
// out).
type ResolveRequest struct {
	ID ID
	// Token is the record's current token, as read by Get or List: the
	// resolution is a compare-and-set on it.
	Token uint64
	// NoEffect says the operation provably did not happen: the record is
	// removed and a retry runs anew. Otherwise Result is stored as final.
	NoEffect bool
	Result   Result
	// Apply, if non-nil, adds business writes that commit atomically with
	// the resolution: for example the local ledger entry for a charge the
	// provider confirmed. If it returns an error nothing is written.
	Apply func(Effects) error
	// Note, if set, is kept on the completed record as an audit note (who
	// settled it and why); at most MaxNoteLen bytes. A resolution with
	// NoEffect removes the record, and its note with it.
	Note string
	// Since, if set, is the moment the resolution was decided from, as
	// read with the record: an abandoned record's LeaseExpires, or an
	// uncertain one's Marked. Resolve then refuses (ErrFenced) a record
	// whose holder has since renewed its lease or marked it uncertain
	// (later than Since by more than a millisecond): its call may have
	// been sent after the downstream answered the question the
	// resolution rests on. Reconcilers set it; an operator's resolution,
	// made on the operator's word, need not.
	Since time.Time
}

// Note returns s as a note every store keeps (MarkUncertain,
// EscalateRequest, ResolveRequest): valid UTF-8 without NUL bytes (what a
// database's text takes), clipped to MaxNoteLen bytes on a character
// boundary. A note built from an error may hold anything: a downstream's
// answer echoed, cut mid-character.
func Note(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) <= MaxNoteLen {
		return s
	}
	s = s[:MaxNoteLen]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// LastCall is the last moment r's attempt may have sent its downstream
// call, as the record tells: an abandoned record's LeaseExpires, an
// uncertain one's Marked; zero for a completed record, or an uncertain
// one whose store keeps no Marked. It is what a settling write judged
// from the record passes as its Since.
func (r *Record) LastCall() time.Time {
	switch r.State {
	case StateInProgress:
		return r.LeaseExpires
	case StateUncertain:
		return r.Marked
	}
	return time.Time{}
}

// MovedSince reports whether r's attempt may have sent its call after
// since (ResolveRequest.Since): it is in progress under a lease that
// runs out later, or uncertain and marked later. A millisecond is
// allowed for the stores' precision.
func (r *Record) MovedSince(since time.Time) bool {
	since = since.Add(time.Millisecond)
	switch r.State {
	case StateInProgress:
		return r.LeaseExpires.After(since)
	case StateUncertain:
		return r.Marked.After(since)
	}
	return false
}

// EscalateRequest gives up on reconciling a record: it becomes (or stays)
// uncertain, escalated, and is left for an operator. Like a resolution it
// is a compare-and-set on the record's token, and takes an uncertain
// record or an abandoned one.
type EscalateRequest struct {
	ID    ID
	Token uint64
	// Note says why (at most MaxNoteLen bytes); it replaces the record's.
	Note string
	// Since, if set, is the moment the decision to give up was made
	// from, as ResolveRequest.Since: Escalate refuses (ErrFenced) a
	// record whose holder has renewed or marked it since, rather than
	// fence off an attempt that is running again.
	Since time.Time
}

// ListRequest asks for a page of the records that need settling.
type ListRequest struct {
	// Escalated lists the escalated records instead of those awaiting
	// reconciliation (uncertain records that are not escalated, and
	// abandoned ones: remote records in progress past their lease).
	Escalated bool
	// Tenant, if set, lists only that tenant's records.
	Tenant string
	// After is the Next of the previous page; "" starts at the oldest.
	After string
	// Limit caps the page: zero means 100, and a store may cap it lower.
	Limit int
}

// Validate reports whether req is well formed: a valid tenant, if any,
// and a limit not below zero. Its errors wrap ErrInvalidScope or
// ErrInvalidArgument.
func (req *ListRequest) Validate() error {
	if req.Tenant != "" {
		if err := validateScope("tenant", req.Tenant); err != nil {
			return err
		}
	}
	if req.Limit < 0 {
		return fmt.Errorf("%w: negative limit %d", ErrInvalidArgument, req.Limit)
	}
	return nil
}

// ListPage is a page of records that need settling, oldest first (by
// Created, then by ID).
type ListPage struct {
	Records []Record
	// Next continues the listing after this page; "" after the last page.
	Next string
}

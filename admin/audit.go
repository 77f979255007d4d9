package admin

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
)

// AuditLog is an append-only file of JSON lines, one per operator's
// write (resolve, evict), each synced before the call answers. A record
// an eviction or a no-effect resolution removed keeps no note of its
// own: the audit log is what is left of it.
//
// An entry holds the record's key: it names what was changed, for the
// operator who asks later. The file is created readable by its owner
// only.
type AuditLog struct {
	// changes is held shared by each audited change, from its begun
	// entry to its end, and exclusively by Backup: a backup's store and
	// audit log then hold the same changes.
	changes sync.RWMutex

	mu   sync.Mutex
	f    *os.File
	path string
	size int64 // the file's size after the last whole entry
}

// OpenAuditLog opens the audit log at path, creating it if need be. A
// part of an entry that a crash left at its end is cut off, as a failed
// write's is, so that the next entry starts a line of its own (it was
// not written whole: if it was a change's begun entry, the change was
// not made; if its done entry, the begun one says it may have been).
func OpenAuditLog(path string) (*AuditLog, error) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("admin: audit log: %w", err)
	}
	size, err := wholeEntries(path)
	if err == nil {
		if st, serr := f.Stat(); serr != nil {
			err = serr
		} else if size < st.Size() {
			if err = f.Truncate(size); err == nil {
				err = f.Sync()
			}
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("admin: audit log: %w", err)
	}
	return &AuditLog{f: f, path: path, size: size}, nil
}

// wholeEntries returns the length of the audit log at path up to the end
// of its last whole line.
func wholeEntries(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return int64(bytes.LastIndexByte(b, '\n') + 1), nil
}

// Close closes the file.
func (a *AuditLog) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.f.Close()
}

// AuditEntry is one line of the audit log.
type AuditEntry struct {
	Time   time.Time `json:"time"`
	Action string    `json:"action"` // "resolve" or "evict"
	// Phase is PhaseBegun, written before the change, then PhaseDone or
	// PhaseFailed after it.
	Phase    string `json:"phase"`
	Tenant   string `json:"tenant"`
	Endpoint string `json:"endpoint"`
	Key      string `json:"key"`
	// Was is the record's state before: in-progress (abandoned),
	// uncertain, escalated or completed.
	Was         string `json:"was"`
	Token       uint64 `json:"token"`
	OperationID string `json:"operation_id,omitempty"`
	// Outcome says what the write did to the record.
	Outcome string `json:"outcome"`
	// Verified says the resolution asked the reconciler first
	// (ResolveRequest.Verify); Downstream is what it answered: applied,
	// not applied, or unknown (it could not say, failed or timed out).
	// An agreeing answer is what was stored; any other refused the
	// resolution.
	Verified   bool   `json:"verified,omitempty"`
	Downstream string `json:"downstream,omitempty"`
	// Note is the operator's: who, and why.
	Note string `json:"note"`
}

// newAuditEntry is the entry of action on rec, timed by store's clock when
// it has one (both stores do: the database's, for pgstore), so that the
// audit log and the records it names read one clock.
func newAuditEntry(store idemkv.Store, action string, rec *idemkv.Record, outcome, note string) AuditEntry {
	was := rec.State.String()
	if rec.Escalated {
		was = "escalated"
	}
	now := time.Now()
	if c, ok := store.(idemkv.Clock); ok {
		now = c.Now()
	}
	e := AuditEntry{Time: now.UTC().Truncate(time.Second), Action: action, Tenant: rec.ID.Tenant,
		Endpoint: rec.ID.Endpoint, Key: rec.ID.Key, Was: was, Token: rec.Token, Outcome: outcome, Note: note}
	if rec.Mode == idemkv.ModeRemote {
		e.OperationID = rec.OperationID.String()
	}
	return e
}

// The phases of a change in the audit log.
const (
	PhaseBegun  = "begun"
	PhaseDone   = "done"
	PhaseFailed = "failed"
)

// ErrAuditUnavailable wraps the failure to write the begun entry of a
// change, which was then not made.
var ErrAuditUnavailable = errors.New("admin: the audit log cannot be written, so nothing was changed")

// ErrAudit wraps the failure to write the done entry of a change that
// was made (its begun entry was written).
var ErrAudit = errors.New("admin: the change was made, but the audit log was not written")

// maxAuditText bounds each free text of an entry (an error a downstream
// answered may be a whole page), so that every line stays well within
// what a reader takes (maxAuditLine).
const maxAuditText = 8 << 10

// maxAuditLine is the longest line ReadHistory reads; a longer one, which
// no entry written now makes, is skipped.
const maxAuditLine = 1 << 20

// clipText shortens s to at most maxAuditText bytes without splitting a
// UTF-8 sequence, and says so.
func clipText(s string) string {
	if len(s) <= maxAuditText {
		return s
	}
	return strings.ToValidUTF8(s[:maxAuditText], "") + " [clipped]"
}

// record appends e, synced.
func (a *AuditLog) record(e AuditEntry) error {
	e.Outcome, e.Downstream, e.Note = clipText(e.Outcome), clipText(e.Downstream), clipText(e.Note)
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.f.Write(append(line, '\n')); err != nil {
		// A part of a line would glue the next entry to it: cut it off.
		_ = a.f.Truncate(a.size)
		return err
	}
	a.size += int64(len(line)) + 1
	return a.f.Sync()
}

// BackupFile is the name of the audit log's copy in a backup's
// directory (AuditLog.Backup, POST /admin/v1/backup).
const BackupFile = "audit.log"

// Backup runs backup, which copies the store into dir, with no change
// audited meanwhile, and then copies the log's whole entries into
// dir/BackupFile, synced: the copy records exactly the changes the
// store's copy holds, each begun and ended. A change in progress (a
// verified resolve asking its downstream) is waited for, and new ones
// wait for the backup. dir must not exist (an error wrapping
// os.ErrExist): if the log cannot be copied, dir is removed, since a
// store's copy without its history would be restored as one that no
// operator ever changed.
func (a *AuditLog) Backup(dir string, backup func() error) error {
	a.changes.Lock()
	defer a.changes.Unlock()
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		if err == nil {
			err = &os.PathError{Op: "backup", Path: dir, Err: os.ErrExist}
		}
		return err
	}
	if err := backup(); err != nil {
		return err
	}
	if err := a.copyTo(filepath.Join(dir, BackupFile)); err != nil {
		return errors.Join(fmt.Errorf("admin: copying the audit log: %w", err), os.RemoveAll(dir))
	}
	return nil
}

// copyTo writes the log's whole entries into a new file at path, synced,
// with its directory.
func (a *AuditLog) copyTo(path string) error {
	a.mu.Lock()
	size := a.size
	a.mu.Unlock()
	src, err := os.Open(a.path)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, io.LimitReader(src, size))
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// maxHistory bounds the entries History returns: the latest ones.
const maxHistory = 50

// History returns the audit log's entries for id, oldest first (at most
// the last 50): what operators did to the key, including writes that
// removed its record. It reads the whole file, which grows only with
// operators' writes.
func (a *AuditLog) History(id idemkv.ID) ([]AuditEntry, error) {
	return ReadHistory(a.path, id)
}

// ReadHistory is History of the audit log at path, which need not exist
// (no history).
func ReadHistory(path string, id idemkv.ID) ([]AuditEntry, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("admin: audit log: %w", err)
	}
	defer f.Close()
	var out []AuditEntry
	err = readLines(bufio.NewReaderSize(f, 64<<10), maxAuditLine, func(line []byte) {
		var e AuditEntry
		if json.Unmarshal(line, &e) != nil {
			return // a line cut by a crash mid-write
		}
		if e.Tenant == id.Tenant && e.Endpoint == id.Endpoint && e.Key == id.Key {
			out = append(out, e)
		}
	})
	if len(out) > maxHistory {
		out = out[len(out)-maxHistory:]
	}
	return out, err
}

// readLines calls fn with each line of r (without its newline) no longer
// than limit, skipping longer ones whole, until r ends. The line passed
// to fn is valid only during the call: it may be r's buffer.
func readLines(r *bufio.Reader, limit int, fn func([]byte)) error {
	var long []byte
	skip := false
	for {
		part, err := r.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			if !skip && len(long)+len(part) <= limit {
				long = append(long, part...)
			} else {
				skip, long = true, long[:0]
			}
			continue
		case err != nil && !errors.Is(err, io.EOF):
			return fmt.Errorf("admin: audit log: %w", err)
		}
		line := bytes.TrimSuffix(part, []byte{'\n'})
		if len(long) > 0 {
			line = append(long, line...)
		}
		if !skip && len(line) > 0 && len(line) <= limit {
			fn(line)
		}
		long, skip = long[:0], false
		if err != nil {
			return nil
		}
	}
}

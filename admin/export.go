package admin

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/inbox"
)

// An export is JSON lines: every record the store holds, whole (its
// fingerprint in hex, its stored body in base64), then, if asked, the
// outbox's cursor and the events it still holds. Each line has a "kind":
// "record", "outbox" or "event". The records of package inbox's
// consumers are left out unless asked for.

// InboxTenant is the tenant package inbox keeps its consumers' records
// under (inbox.Tenant).
const InboxTenant = inbox.Tenant

// inboxRecord reports whether id is an inbox consumer's record: under
// InboxTenant, with a consumer's name for its endpoint. A service may
// have a tenant of that name too; its routes' endpoints are not names.
func inboxRecord(id idemkv.ID) bool {
	return id.Tenant == InboxTenant && inbox.ValidateName(id.Endpoint) == nil
}

// ExportOptions say what an export holds besides records.
type ExportOptions struct {
	// Outbox adds the outbox's cursor and unacknowledged events.
	Outbox bool
	// Inbox adds the records of the inbox's consumers.
	Inbox bool
}

// ExportCounts is what an export wrote.
type ExportCounts struct {
	Records int `json:"records"`
	Events  int `json:"events"`
}

// ExportRecord is a record's line.
type ExportRecord struct {
	Kind string `json:"kind"` // "record"
	RecordView
	Fingerprint string `json:"fingerprint"` // hex
	Body        []byte `json:"body,omitempty"`
}

// ExportOutbox is the outbox cursor's line.
type ExportOutbox struct {
	Kind  string `json:"kind"` // "outbox"
	Acked uint64 `json:"acked"`
	Last  uint64 `json:"last"`
}

// ExportEvent is an unacknowledged event's line.
type ExportEvent struct {
	Kind      string            `json:"kind"` // "event"
	Seq       uint64            `json:"seq"`
	ID        string            `json:"id"`
	Topic     string            `json:"topic"`
	Key       string            `json:"key,omitempty"`
	EntitySeq uint64            `json:"entity_seq"`
	Created   time.Time         `json:"created"`
	Headers   map[string]string `json:"headers,omitempty"`
	Payload   []byte            `json:"payload"`
}

// Export writes store's records (store must be an idemkv.Scanner) and,
// as o asks, its outbox to w. Pages are read one at a time: a record
// written meanwhile may or may not be in it, each record at most once.
func Export(ctx context.Context, store idemkv.Store, w io.Writer, o ExportOptions) (ExportCounts, error) {
	var n ExportCounts
	sc, ok := store.(idemkv.Scanner)
	if !ok {
		return n, fmt.Errorf("%w: this store cannot list its records", idemkv.ErrInvalidArgument)
	}
	enc := json.NewEncoder(w)
	req := idemkv.ScanRequest{Limit: 1000}
	for {
		page, err := sc.Scan(ctx, req)
		if err != nil {
			return n, err
		}
		for i := range page.Records {
			r := &page.Records[i]
			if !o.Inbox && inboxRecord(r.ID) {
				continue
			}
			line := ExportRecord{Kind: "record", RecordView: ViewOf(r), Fingerprint: hex.EncodeToString(r.Fingerprint), Body: r.Result.Body}
			if err := enc.Encode(line); err != nil {
				return n, err
			}
			n.Records++
		}
		if page.Next == "" {
			break
		}
		req.After = page.Next
	}
	if !o.Outbox {
		return n, nil
	}
	ob, ok := store.(idemkv.Outbox)
	if !ok {
		return n, fmt.Errorf("%w: this store keeps no outbox", idemkv.ErrInvalidArgument)
	}
	err := exportOutbox(ctx, ob, enc, &n)
	return n, err
}

func exportOutbox(ctx context.Context, ob idemkv.Outbox, enc *json.Encoder, n *ExportCounts) error {
	acked, last, err := ob.OutboxCursor(ctx)
	if err != nil {
		return err
	}
	if err := enc.Encode(ExportOutbox{Kind: "outbox", Acked: acked, Last: last}); err != nil {
		return err
	}
	for after := acked; after < last; {
		evs, err := peekOutbox(ctx, ob, after, 1000) // not ReadOutbox: no hold on the relays
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			return nil
		}
		for _, ev := range evs {
			line := ExportEvent{Kind: "event", Seq: ev.Seq, ID: ev.ID, Topic: ev.Topic, Key: ev.Key,
				EntitySeq: ev.EntitySeq, Created: ev.Created, Headers: ev.Headers, Payload: ev.Payload}
			if err := enc.Encode(line); err != nil {
				return err
			}
			n.Events++
			after = ev.Seq
		}
	}
	return nil
}

// export answers GET /admin/v1/export?outbox=B&inbox=B with the export's
// JSON lines, and a last line that says how it ended: {"kind":"end",
// "records":N,"events":M}, or {"kind":"error"} if the store failed on
// the way (the status is sent by then). A stream without either was cut.
func (a *api) export(w http.ResponseWriter, r *http.Request) {
	if _, ok := a.store.(idemkv.Scanner); !ok {
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "this store cannot list its records")
		return
	}
	if !knownParams(w, r.URL.Query(), "outbox", "inbox") {
		return
	}
	var o ExportOptions
	for name, dst := range map[string]*bool{"outbox": &o.Outbox, "inbox": &o.Inbox} {
		if v := r.URL.Query().Get(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				writeProblem(w, http.StatusBadRequest, ProblemInvalidRequest, name+": want true or false")
				return
			}
			*dst = b
		}
	}
	if _, ok := a.store.(idemkv.Outbox); o.Outbox && !ok {
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "this store keeps no outbox")
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	bw := bufio.NewWriterSize(progressWriter{w, http.NewResponseController(w)}, 64<<10)
	n, err := Export(r.Context(), a.store, bw, o)
	end := map[string]any{"kind": "end", "records": n.Records, "events": n.Events}
	if err != nil {
		a.o.Logger.Error("admin: export failed", "err", err)
		end = map[string]any{"kind": "error", "detail": "the store failed the export", "records": n.Records, "events": n.Events}
	}
	_ = json.NewEncoder(bw).Encode(end)
	_ = bw.Flush()
}

// exportStall is how long an export may go without writing before the
// server gives up on it: each write moves the connection's deadline, so
// an export longer than the server's write timeout finishes while it
// makes progress.
const exportStall = 2 * time.Minute

// progressWriter moves the response's write deadline on each write.
type progressWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (p progressWriter) Write(b []byte) (int, error) {
	_ = p.rc.SetWriteDeadline(time.Now().Add(exportStall))
	return p.w.Write(b)
}

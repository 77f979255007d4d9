package httpidem

import (
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
)

// replay answers with a stored outcome.
func (p *protected) replay(w http.ResponseWriter, r *http.Request, q *request, res idemkv.Result) {
	q.report.Disposition = Replayed
	env, err := decodeEnvelope(res.Body, res.Pointer)
	if err == nil && (res.Status < 100 || res.Status > 999) {
		err = fmt.Errorf("%w: status %d", errEnvelope, res.Status)
	}
	if err != nil {
		q.report.Err = err
		p.logEvent(r.Context(), q, slog.LevelError, "httpidem: stored outcome unreadable", slog.Any("err", err))
		p.problem(w, q, ProblemStoredResponse, http.StatusInternalServerError, "", 0)
		return
	}
	h := w.Header()
	for _, kv := range env.header {
		h.Del(kv[0]) // a value set before the middleware ran, as the first answer replaced it
	}
	for _, kv := range env.header {
		h.Add(kv[0], kv[1])
	}
	h.Set(HeaderReplayed, "true")
	q.report.Status = res.Status
	p.logEvent(r.Context(), q, slog.LevelDebug, msgReplayed, disposition(q), slog.Int("status", res.Status))
	switch {
	case env.haveBody:
		h.Set("Content-Length", strconv.Itoa(len(env.body)))
		w.WriteHeader(res.Status)
		w.Write(env.body)
	case p.route.Rebuild != nil:
		p.route.Rebuild(w, r, res)
	default:
		if res.Pointer != "" && h.Get("Location") == "" {
			h.Set("Location", res.Pointer)
		}
		h.Set("Content-Length", "0")
		w.WriteHeader(res.Status)
	}
}

// mismatch answers 422, naming the parts that differ when the stored
// outcome carries fingerprint diagnostics.
func (p *protected) mismatch(w http.ResponseWriter, r *http.Request, q *request) {
	q.report.Disposition = Mismatch
	pr := Problem{
		Type: ProblemBase + ProblemKeyMismatch, Title: titleOf(ProblemKeyMismatch), Status: http.StatusUnprocessableEntity,
		Detail: "this idempotency key was first used with a different request; use a new key for a new request",
	}
	if q.diag != nil {
		if rec, err := p.m.store.Get(r.Context(), q.id); err == nil && rec.State == idemkv.StateCompleted {
			if env, err := decodeEnvelope(rec.Result.Body, rec.Result.Pointer); err == nil && env.diag != nil {
				if diffs, err := fingerprint.Explain(env.diag, q.fpReq, p.route.Fingerprint); err == nil {
					for _, d := range diffs {
						pr.Fields = append(pr.Fields, d.Part)
					}
				}
			}
		}
	}
	q.report.Status = pr.Status
	p.logEvent(r.Context(), q, slog.LevelInfo, msgMismatch, disposition(q))
	writeProblem(w, pr, 0)
}

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/httpidem"
)

// The scenarios of the demo, in the order it plays them. Each one talks
// to the service over HTTP as a client would, reaches behind it only to
// script the processor, move the clock or restart the process, and ends
// by checking the charges, the payments and the records it left.

// 1. The first request runs, its response is lost, and the retry replays it.
func (d *demo) lostResponse(ctx context.Context) error {
	key, p0 := newKey(), d.proc.Stats()
	d.say("client", "POST key %s, body %s", key, demoBody)
	lost, err := d.payLost(ctx, key)
	if err != nil {
		return err
	}
	first, err := created(lost, false, "first request")
	if err != nil {
		return err
	}
	d.say("service", "had charged %s and stored payment %s with its 201 in one batch", usd(demoAmount), first.ID)
	// The retry's client library serializes the same JSON differently:
	// canonical JSON (RFC 8785) makes that the same request.
	retryBody := `{ "card": "tok_123", "currency": "USD", "amount": 5000 }`
	d.say("client", "retries with the same key; its JSON is spelled differently: %s", retryBody)
	r := d.pay(ctx, d.retryKey(key), retryBody)
	d.say("service", "%d, %s: %q, %s", r.status, httpidem.HeaderReplayed, r.header.Get(httpidem.HeaderReplayed), bytes.TrimSpace(r.body))
	if err := d.checkCharged(ctx, key, p0, first); err != nil {
		return err
	}
	if _, err := created(r, true, "retry"); err != nil {
		return err
	}
	if !bytes.Equal(r.body, lost.body) {
		return fmt.Errorf("replayed %s, the lost response was %s", r.body, lost.body)
	}
	d.say("why", "that is the lost response byte for byte: the charge does not run again, and the")
	d.say("", "fingerprint compares canonical JSON, so member order and spacing do not matter")
	return nil
}

// 2. Concurrent duplicates: exactly one runs; the rest get 409, then replay.
func (d *demo) concurrentDuplicates(ctx context.Context) error {
	const n = 8
	key, p0 := newKey(), d.proc.Stats()
	_, release := d.script.stall()
	defer release()
	d.say("processor", "will hold the first charge until the other copies have their answers")
	d.say("client", "%d copies of one request (key %s) arrive at once", n, key)
	replies := make(chan reply, n)
	for range n {
		go func() { replies <- d.pay(ctx, key, demoBody) }()
	}
	early := make([]reply, n-1) // every copy but the one held at the processor
	for i := range early {
		early[i] = <-replies
	}
	release()
	last := <-replies // every copy has its answer: none is left running
	for i, r := range early {
		if _, err := problem(r, http.StatusConflict, httpidem.ProblemInProgress, fmt.Sprintf("answer %d", i+1)); err != nil {
			return err
		}
	}
	d.say("service", "%d copies answered 409 %s at once, Retry-After: %s; one runs", n-1, httpidem.ProblemInProgress, early[0].header.Get("Retry-After"))
	d.say("why", "the claim is atomic, so only one copy can run; the others must neither run nor guess")
	winner, err := created(last, false, "the copy that ran")
	if err != nil {
		return err
	}
	d.say("processor", "released: charges %s; the copy that ran answers 201 %s", usd(demoAmount), winner.ID)
	retries := make([]reply, n-1)
	for i := range retries {
		retries[i] = d.pay(ctx, d.retryKey(key), demoBody)
	}
	for i, r := range retries {
		p, err := created(r, true, fmt.Sprintf("retry %d", i+1))
		if err != nil {
			return err
		}
		if p.ID != winner.ID {
			return fmt.Errorf("retry %d replayed %s, want %s", i+1, p.ID, winner.ID)
		}
	}
	d.say("client", "the %d retry with the same key; each gets 201 replayed, %s", n-1, winner.ID)
	return d.checkCharged(ctx, key, p0, winner)
}

// 3. The same key with another body is refused, and changes nothing.
func (d *demo) sameKeyDifferentBody(ctx context.Context) error {
	key, p0 := newKey(), d.proc.Stats()
	first, err := created(d.pay(ctx, key, demoBody), false, "first request")
	if err != nil {
		return err
	}
	d.say("client", "POST key %s for %s: 201 %s", key, usd(demoAmount), first.ID)
	other := `{"amount":50000,"currency":"USD","card":"tok_123"}`
	d.say("client", "POST with the same key, but body %s", other)
	m := d.pay(ctx, key, other)
	pr, err := problem(m, http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch, "different body")
	if err != nil {
		return err
	}
	if !slices.Equal(pr.Fields, []string{"body /amount"}) || bytes.Contains(m.body, []byte(first.ID)) {
		return fmt.Errorf("the 422 names fields %q and must show nothing of %s: %s", pr.Fields, first.ID, m.body)
	}
	d.say("service", "422 %s, naming the field that differs, %q; nothing runs,", httpidem.ProblemKeyMismatch, pr.Fields[0])
	d.say("", "and the answer shows nothing of the stored payment")
	d.say("why", "a key names one request; replaying %s for %s would hide the client's bug", first.ID, usd(50000))
	if _, err := created(d.pay(ctx, d.retryKey(key), demoBody), true, "the first request's retry"); err != nil {
		return err
	}
	d.say("client", "the first request's retry still replays 201 %s: the stored outcome is unchanged", first.ID)
	return d.checkCharged(ctx, key, p0, first)
}

// 4. The payment and the outcome commit together, so a crash between them
// and the response leaves both, and the retry replays.
func (d *demo) crashAfterEffect(ctx context.Context) error {
	key, p0 := newKey(), d.proc.Stats()
	d.say("client", "POST key %s", key)
	lost, err := d.payLost(ctx, key)
	if err != nil {
		return err
	}
	first, err := created(lost, false, "first request")
	if err != nil {
		return err
	}
	d.say("service", "had charged %s: payment %s and the 201 committed in one synced batch", usd(demoAmount), first.ID)
	d.say("crash", "the process dies before the 201 leaves")
	d.say("", "(simulated by closing the engine and starting a new service on the same directory;")
	d.say("", "the engine's crash tests kill a real process with SIGKILL)")
	if err := d.restart(); err != nil {
		return err
	}
	rec, err := d.e.Get(ctx, d.id(key))
	if err != nil {
		return fmt.Errorf("after the restart, the record: %w", err)
	}
	list, err := d.listPayments(ctx)
	if err != nil {
		return err
	}
	if rec.State != idemkv.StateCompleted || len(list) != 1 || list[0].ID != first.ID {
		return fmt.Errorf("after the restart: record %s, %d payments; want completed, and %s", rec.State, len(list), first.ID)
	}
	d.say("restart", "reopened: the record is completed, and the account lists %s", first.ID)
	r := d.pay(ctx, d.retryKey(key), demoBody)
	if _, err := created(r, true, "retry after the crash"); err != nil {
		return err
	}
	if !bytes.Equal(r.body, lost.body) {
		return fmt.Errorf("replayed %s, the unsent response was %s", r.body, lost.body)
	}
	d.say("client", "retries: 201 replayed, byte for byte the answer the crash swallowed")
	d.say("why", "the charge and its answer are never apart, so there is no charge the retry could repeat")
	return d.checkCharged(ctx, key, p0, first)
}

// 5. After a lease expires, the retry takes the key over and fences the
// stalled request off: its late payment and outcome are refused together,
// and the processor deduplicates its late call.
func (d *demo) staleHolderFenced(ctx context.Context) error {
	key, p0 := newKey(), d.proc.Stats()
	st0, err := d.e.Stats()
	if err != nil {
		return err
	}
	reached, release := d.script.stall()
	defer release()
	stalled := make(chan reply, 1)
	go func() { stalled <- d.pay(ctx, key, demoBody) }()
	select {
	case <-reached:
	case r := <-stalled:
		return fmt.Errorf("request A was answered (%d %s) before it reached the processor", r.status, r.body)
	}
	d.say("request A", "POST key %s: holds the key (lease %v), then stalls on its way to the processor", key, demoLease)
	d.clock.Advance(demoLease + time.Second)
	d.say("clock", "advanced %v: A's lease has run out, though A is still alive", demoLease+time.Second)
	bReply := d.pay(ctx, d.retryKey(key), demoBody)
	release()
	aReply := <-stalled // A has its answer: nothing is left running
	b, err := created(bReply, false, "request B")
	if err != nil {
		return err
	}
	rec, err := d.e.Get(ctx, d.id(key))
	if err != nil {
		return err
	}
	if rec.Attempt != 2 {
		return fmt.Errorf("request B ran, but A's key is at attempt %d: B did not take it over", rec.Attempt)
	}
	d.say("request B", "the client's retry takes the key over (attempt %d) and resumes the same operation:", rec.Attempt)
	d.say("", "the processor gets the same key, %s, and charges %s; B answers 201 %s", rec.OperationID, usd(demoAmount), b.ID)
	if _, err := problem(aReply, http.StatusConflict, httpidem.ProblemLeaseLost, "request A"); err != nil {
		return err
	}
	d.say("request A", "wakes up; the processor answers its call with B's charge, and A's payment and")
	d.say("", "outcome, one batch, are refused whole: 409 %s", httpidem.ProblemLeaseLost)
	r := d.pay(ctx, d.retryKey(key), demoBody)
	if p, err := created(r, true, "retry"); err != nil || p.ID != b.ID {
		return fmt.Errorf("the retry did not replay B's %s: %v", b.ID, err)
	}
	d.say("client", "retries: 201 replayed, B's %s", b.ID)
	st, err := d.e.Stats()
	if err != nil {
		return err
	}
	p := d.proc.Stats()
	if st.Takeovers-st0.Takeovers != 1 || st.Fenced-st0.Fenced != 1 || p.Dedups-p0.Dedups != 1 {
		return fmt.Errorf("%d takeovers, %d fenced, %d deduplicated calls; want 1, 1 and 1",
			st.Takeovers-st0.Takeovers, st.Fenced-st0.Fenced, p.Dedups-p0.Dedups)
	}
	return d.checkCharged(ctx, key, p0, b)
}

// 6. A processor call that times out leaves the payment uncertain: it is
// never run again, across the lease and a restart, so never charged twice.
func (d *demo) providerTimeout(ctx context.Context) error {
	key, p0 := newKey(), d.proc.Stats()
	d.script.timeout()
	d.say("processor", "will charge the next call, and then time out")
	d.say("client", "POST key %s", key)
	if _, err := problem(d.pay(ctx, key, demoBody), http.StatusGatewayTimeout, "payment-outcome-unknown", "first request"); err != nil {
		return err
	}
	rec, err := d.e.Get(ctx, d.id(key))
	if err != nil {
		return err
	}
	op := rec.OperationID.StepKey("charge")
	ch, charged, _ := d.proc.Lookup(context.Background(), op)
	d.say("service", "claimed the key durably, then called the processor with Idempotency-Key %s", op)
	d.say("processor", "charges %s (%s), but the answer times out", usd(ch.Amount), ch.ID)
	d.say("service", "504 payment-outcome-unknown, and the record becomes uncertain: freeing the key")
	d.say("", "could charge twice, and storing an error would be wrong")

	retry := func(what string) error {
		_, err := problem(d.pay(ctx, d.retryKey(key), demoBody), http.StatusConflict, httpidem.ProblemReconciling, what)
		return err
	}
	if err := retry("retry"); err != nil {
		return err
	}
	d.say("client", "retries: 409 %s; the processor is not called", httpidem.ProblemReconciling)
	d.clock.Advance(demoLease + time.Second)
	if err := retry("retry after the lease"); err != nil {
		return err
	}
	d.say("clock", "advanced %v, past the lease; the retry: still 409", demoLease+time.Second)
	if err := d.restart(); err != nil {
		return err
	}
	if err := retry("retry after the restart"); err != nil {
		return err
	}
	d.say("restart", "engine reopened, a new service on it; the retry: still 409")
	d.say("why", "a timeout proves nothing either way; only the processor knows, so nothing re-runs blind")

	if rec, err = d.e.Get(ctx, d.id(key)); err != nil {
		return err
	}
	list, err := d.listPayments(ctx)
	if err != nil {
		return err
	}
	p := d.proc.Stats()
	if rec.State != idemkv.StateUncertain || !charged || p.Calls-p0.Calls != 1 || p.Charges-p0.Charges != 1 || len(list) != 0 {
		return fmt.Errorf("record %s, %d processor calls, %d charges, %d payments; want uncertain, 1, 1 and none",
			rec.State, p.Calls-p0.Calls, p.Charges-p0.Charges, len(list))
	}
	d.say("check", "the record is uncertain (%q);", rec.Note)
	d.say("", "one call, one charge under the operation id, no payment yet: ok")

	r, err := d.orderRunner()
	if err != nil {
		return err
	}
	w, err := d.reconciler(r)
	if err != nil {
		return err
	}
	if err := w.Pass(ctx); err != nil {
		return err
	}
	d.say("reconciler", "asks the processor for the charge under %s: found; writes the payment", op)
	final := d.pay(ctx, d.retryKey(key), demoBody)
	pay, err := created(final, true, "retry after reconciliation")
	if err != nil {
		return err
	}
	d.say("client", "retries: %d, the payment %s, replayed", final.status, pay.ID)
	return d.checkCharged(ctx, key, p0, pay)
}

// 7. The client's half: a client library (package client) keys the
// request itself and retries it, with the same key, through a refusal and
// a lost response; one charge, and the caller is told it got a replay.
func (d *demo) clientLibrary(ctx context.Context) error {
	key, p0 := newKey(), d.proc.Stats()
	d.script.arm(func(context.Context) error {
		d.lose.Store(true) // the next attempt's answer is lost
		return payments.ErrProviderUnavailable
	})
	d.say("processor", "will refuse the next call (nothing charged), and the network will lose the answer after it")
	hc := client.New(&http.Transport{DisableKeepAlives: true}, &client.Options{
		MaxAttempts: 4, MaxInterval: 50 * time.Millisecond, NewKey: func() string { return key }})
	req, err := http.NewRequestWithContext(ctx, "POST", d.url+"/v1/payments", strings.NewReader(demoBody))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+d.account)
	d.say("client", "POST through package client, with no Idempotency-Key of its own")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	select {
	case <-d.lost: // the answer the network lost
	default:
		return errors.New("no answer was lost: the scenario did not play as scripted")
	}
	r := reply{status: resp.StatusCode, header: resp.Header, body: body}
	pay, err := created(r, true, "the library's answer")
	if err != nil {
		return err
	}
	d.say("library", "gave it key %s; attempt 1: 503 (its Retry-After capped at 50 ms for the demo); attempt 2: charged, answer lost;", key)
	d.say("", "attempt 3, same key: 201 %s, and client.Replayed says it is a replay: %v", pay.ID, client.Replayed(resp))
	d.say("why", "the key is the client's identity for one intent: minted once, kept across every retry")
	return d.checkCharged(ctx, key, p0, pay)
}

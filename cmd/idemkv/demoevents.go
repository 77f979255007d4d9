package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/examples/ledger"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natsembed"
	"github.com/idemkv/idemkv/outbox"
)

// The demo's events: every payment emits payments.created in the commit
// that stores it; a relay publishes the outbox to a JetStream server
// started in the process; the ledger of examples/ledger consumes the
// stream through package inbox (a non-HTTP caller, on package once).

// errCrashBeforeAck stands for a relay whose process dies after the
// broker acknowledged its events and before the store did.
var errCrashBeforeAck = errors.New("the relay's process died before the store's acknowledgement")

// crashBeforeAck is an outbox whose acknowledgements never arrive.
type crashBeforeAck struct{ idemkv.Outbox }

func (crashBeforeAck) AckOutbox(context.Context, uint64, string) error { return errCrashBeforeAck }

// 10. A relay that dies between JetStream's acknowledgement and the
// store's publishes again, and the stream keeps one copy; a consumer that
// is handed the event twice applies it once.
func (d *demo) eventsAbsorbed(ctx context.Context) error {
	js, err := natsembed.Start(filepath.Join(d.dir, "jetstream"), 0)
	if err != nil {
		return err
	}
	defer js.Shutdown()
	pub, err := natsjs.Connect(js.URL(), nil)
	if err != nil {
		return err
	}
	defer pub.Close()
	stream, err := natsjs.EnsureStream(ctx, pub.JetStream(), eventsStream, []string{"payments.>"}, natsjs.DefaultDuplicateWindow)
	if err != nil {
		return err
	}
	d.say("broker", "JetStream in this process (%s), stream %s, duplicate window %v", js.URL(), eventsStream, natsjs.DefaultDuplicateWindow)

	key := newKey()
	d.say("client", "POST key %s", key)
	p, err := created(d.pay(ctx, key, demoBody), false, "the payment")
	if err != nil {
		return err
	}
	d.say("service", "payment %s and its payments.created event committed in one batch", p.ID)

	before, err := stream.Info(ctx) // a kept --data may hold an earlier run's
	if err != nil {
		return err
	}
	first, err := outbox.New(crashBeforeAck{d.e}, pub, nil)
	if err != nil {
		return err
	}
	n, err := first.Drain(ctx)
	if !errors.Is(err, errCrashBeforeAck) {
		return fmt.Errorf("the first relay: %d published, %v", n, err)
	}
	d.say("relay", "published the %d events in the outbox; JetStream acknowledged them", n)
	d.say("crash", "the relay dies before the store records the acknowledgement")
	again, err := outbox.New(d.e, pub, nil)
	if err != nil {
		return err
	}
	m, err := again.Drain(ctx)
	if err != nil {
		return fmt.Errorf("the relay after the crash: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return err
	}
	if added := info.State.Msgs - before.State.Msgs; m != n || added != uint64(n) {
		return fmt.Errorf("published %d then %d events; the stream gained %d messages, want %d", n, m, added, n)
	}
	d.say("relay", "restarted: published the same %d events again, with the same ids (Nats-Msg-Id)", m)
	d.say("broker", "the stream gained %d messages, not %d: its duplicate window absorbed the republish", n, 2*n)

	msgs, err := natsjs.ReadAll(ctx, pub.JetStream(), eventsStream, before.State.LastSeq+1)
	if err != nil {
		return err
	}
	c, err := ledger.New(d.e, nil)
	if err != nil {
		return err
	}
	var ours inbox.Message
	for _, m := range msgs {
		msg := inbox.Message{ID: m.Header.Get(outbox.HeaderEventID), Position: m.Seq, Subject: m.Subject, Header: m.Header, Data: m.Data}
		if _, err := c.Process(ctx, msg, ledger.Handle); err != nil {
			return fmt.Errorf("the ledger, message %d: %w", m.Seq, err)
		}
		if m.Header.Get(outbox.HeaderEntityKey) == d.account {
			ours = msg
		}
	}
	if ours.ID == "" {
		return fmt.Errorf("no message in the stream for %s", d.account)
	}
	d.say("ledger", "consumed the stream through package inbox: mark, balance and position in one commit each")
	out, err := c.Process(ctx, ours, ledger.Handle)
	if err != nil {
		return err
	}
	if !out.Duplicate {
		return fmt.Errorf("the redelivered event was applied again: %+v", out)
	}
	d.say("broker", "redelivers the event of %s (an acknowledgement lost on the way back)", p.ID)
	b, err := ledger.Read(ctx, d.e, d.account, "USD")
	if err != nil {
		return err
	}
	if b.Total != demoAmount || b.Count != 1 {
		return fmt.Errorf("the ledger holds %s in %d events for the account, want %s in 1", usd(b.Total), b.Count, usd(demoAmount))
	}
	d.say("ledger", "found its mark: not applied again; the account's balance is %s from 1 event", usd(b.Total))
	d.say("why", "the relay publishes at least once under ids the broker deduplicates, and the consumer commits")
	d.say("", "its dedup mark with its effects, so each event counts once however often it travels")
	return ctx.Err()
}

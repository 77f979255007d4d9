// Package inbox applies each event a consumer receives exactly once: the
// inbox side of the transactional outbox. Brokers deliver at least once
// (a redelivery after a lost acknowledgement, a relay's republished
// copy, a consumer restarted before its acknowledgement); a Consumer
// turns that into one application per event.
//
// Process settles a message in one atomic, durable commit of the store
// (package once, local mode) holding three things:
//
//   - the handler's writes (idemkv.Effects: business data and outbox
//     events of its own);
//   - the event's dedup mark: an idemkv record under ID{Tenant: "inbox",
//     Endpoint: the consumer's name, Key: derived from the event's id};
//   - the consumer's position: the highest stream position settled,
//     under the business-data key "inbox/<name>/position", and the
//     stream it counts in (Message.Source), under "inbox/<name>/source".
//
// What is guaranteed, per consumer name and store:
//
//   - An event's writes commit at most once, and with its mark: a copy
//     delivered later, however, finds the mark and is answered
//     Outcome.Duplicate, its handler's writes dropped (settled in one
//     step, Options.WritesOnly, the handler runs before the claim;
//     otherwise it does not run), for as long as the mark is retained
//     (Options.Retention).
//   - The position never runs ahead of the effects: it commits with them,
//     so after a crash both are there or neither. A consumer that reads
//     its stream in order resumes at Position(ctx)+1 and re-reads nothing it
//     applied and skips nothing it did not. natsjs.Consume does so.
//   - A handler that fails leaves nothing behind: its writes, the mark and
//     the position are dropped together, and the next delivery applies
//     the event anew.
//
// # Basics
//
//	c, err := inbox.New("ledger", store, &inbox.Options{Retention: "inbox"})
//	err = natsjs.Consume(ctx, js, "PAYMENTS", c, func(ctx context.Context, fx idemkv.Effects, msg inbox.Message) error {
//		var ev created
//		if err := json.Unmarshal(msg.Data, &ev); err != nil {
//			return inbox.Reject(err) // malformed: settled as rejected, never retried
//		}
//		return credit(fx, ev.Account, ev.Amount) // reads and writes through fx
//	}, nil)
//
// The store is any idemkv.Store that reads its data (*engine.Engine,
// *pgstore.Store), opened with the class the marks use, for the engine
// engine.Options{RetentionClasses: ttl.Classes{"inbox": 7 * 24 * time.Hour}}.
//
// natsjs.Consume (package natsjs, which holds all of idemkv's NATS code:
// this package imports none) reads a JetStream stream with an ordered
// consumer from the committed position, settles each message before
// reading the next, and on any failure reads again from the committed
// position after a backoff. A caller with its own broker client calls
// Process for each message and acknowledges it when Process returns
// without an error (natsjs.InboxMessage converts a JetStream message).
//
// The handler runs inside the commit and may run again when a key it
// read was changed by another commit before its own committed: it must
// act only through its Effects. It decides what an event does to the
// data; the package decides whether it runs:
//
//   - nil: the event is applied.
//   - Reject(err), for a payload no delivery could make acceptable
//     (malformed, against the handler's rules): the handler's writes are
//     dropped, the rejection and its reason are recorded as the event's
//     outcome with the position, and Process returns Outcome.Rejected and
//     no error, so the message is acknowledged. A poison event is settled
//     once and skipped for good; its copies are Duplicate and Rejected.
//   - another error (a conflict, a failing dependency): nothing is
//     written and Process returns the error; redeliver the message.
//
// Options.Logger gets a structured record (log/slog) of each message
// Process settles: applied (Info), rejected or an id reused with other
// content (Warn), a handler's failure (Warn), a store failure (Error), a
// duplicate skipped (Debug). Applied is Info although it is one record per
// event: it is the state change of the event's mark, logged as the HTTP
// middleware logs each request's, and the record an operator looks for
// when asked whether an event was applied; a consumer at a rate where
// that is too many sets its Logger's level to Warn, which costs nothing
// per event. A record names the event by its mark (tenant "inbox",
// endpoint the consumer's name, key_hash) with its position and subject,
// never by its id, which can carry customer data, and never with its
// payload. natsjs.Consume logs its read failures to the same Logger.
//
// # Event identity
//
// An event's id is Message.ID: the outbox relay's event id
// (Idemkv-Event-Id), or the producer's Nats-Msg-Id. An id of printable
// ASCII up to 252 bytes is the mark's key as it is ("id/<id>"); any other
// is hashed (SHA-256).
//
// An event without an id is identified by its content: SHA-256 of its
// subject and its payload, the payload in RFC 8785 canonical form when it
// is JSON (so that member order, whitespace and number spelling do not
// matter), byte for byte otherwise.
//
// # Retention
//
// A mark is kept for its retention class's window (Options.Retention),
// counted from when the event was settled, and then swept by the store
// (package ttl). A copy arriving after that is applied again. Choose the
// window to cover the longest time between two copies of one event:
//
//   - JetStream deduplicates a republished event on Nats-Msg-Id only
//     within the stream's duplicate window (natsjs.EnsureStream's, 2
//     minutes by default); a relay that republishes later (an outage
//     between a publish that landed and its acknowledgement in the
//     outbox) stores a second copy further on in the stream. The window
//     must cover the longest relay outage you allow, plus the duplicate
//     window.
//   - A consumer that resumes from Position never re-reads an earlier
//     message; one whose broker redelivers instead (a durable consumer
//     with acknowledgements) needs the window to cover its redelivery
//     horizon (AckWait × MaxDeliver, and the time it may stay down).
//   - A consumer replayed from an earlier position (a reset position, a
//     stream read again from the start) applies every event whose mark
//     has expired.
//
// Days rather than minutes: a mark is one small record per event.
//
// # Caveats
//
//   - Two genuinely distinct events without ids but with the same subject
//     and the same payload (canonically, if JSON) are one event: the
//     second is a Duplicate. Give events ids, or put what tells them
//     apart (a timestamp, a sequence) in their payload.
//   - A copy of an event with an id but other content (another subject or
//     payload) is still the same event: it is a Duplicate, not applied,
//     and reported (Outcome.Mismatch). The producer reused an id or
//     changed a copy; alert on it.
//   - The position is the highest position settled, not a set. It is a
//     resume point only for a consumer that settles its stream's messages
//     in order, one at a time (as natsjs.Consume does): one that settled a
//     later message while an earlier one failed would resume past it.
//     Concurrent Process calls of one consumer are safe, but they all
//     read and write the position and so conflict, re-running handlers.
//   - Positions belong to one stream. Reading another stream (or a
//     stream deleted and created again, whose sequences restart) under
//     the same name needs a new name or a position reset to 0
//     (Consumer.PositionKey). Messages that name their stream
//     (Message.Source, as natsjs.Consume's do) are refused from any other
//     once the position is past 0 (ErrSourceChanged); messages that name
//     none are not checked.
//   - A handler error blocks an in-order consumer: natsjs.Consume
//     retries the message, backing off, until it settles. Reject what can
//     never succeed.
//   - Two deliveries of one event processed at once in one process: the
//     second fails with once.ErrInProgress and is redelivered. On the
//     engine the marks are exclusive within one process, as its claims
//     are; on pgstore, across every process sharing the database.
//   - A process that crashes inside Process leaves nothing of the
//     message (its commit did not happen, or happened whole): the
//     message is read again from the position and applied once.
package inbox

// Package ledger is an example consumer built on package inbox: it reads
// payments.created events (the ones the payments example emits through
// its outbox) and keeps, per account and currency, the total amount and
// the number of payments, applying each event exactly once however often
// the broker delivers it and however often the consumer restarts.
//
// # Basics
//
// An event's payload is JSON (Event):
//
//	{"payment":"pay_42","account":"acct_1","amount":5000,"currency":"USD", ...}
//
// amount in minor units (cents), above 0; currency an ISO 4217 code in
// upper case; other members (the payments example's charge and created)
// are ignored. Its subject is payments.created, or ends in
// .payments.created (a relay's subject prefix); messages on other
// subjects are settled without effect.
//
//	c, err := ledger.New(store, &inbox.Options{Retention: "inbox"})
//	err = natsjs.Consume(ctx, js, "PAYMENTS", c, ledger.Handle, nil)
//	b, err := ledger.Read(ctx, store, "acct_1", "USD") // b.Total, b.Count
//
// Each balance is one business value (key: the account, length-prefixed
// as idemkv.AppendTenantKey does, then "ledger/balance/" and the
// currency; value: JSON Balance), read and written in the commit of the
// event's dedup mark and the consumer's position.
//
// # Caveats
//
//   - A payload that is not such an event (malformed JSON, no account, an
//     amount of 0 or less, a currency that is not three capital letters,
//     a total that would overflow) is rejected (inbox.Reject): recorded,
//     acknowledged, and never applied; watch for rejections
//     (inbox.Outcome.Rejected).
//   - Every event of every account reads and writes the consumer's
//     position, so the ledger applies events one at a time: its
//     throughput is one synced commit per event.
package ledger

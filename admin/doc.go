// Package admin is the operator's HTTP API on a running service: look up a
// record, list what needs settling, check the store, run the sweeper, and
// take a backup, while the service keeps the store open (the CLI on a data
// directory can only open a store no process holds).
//
// # Basics
//
//	h, err := admin.New(store, &admin.Options{Token: token, Check: ..., Backup: e.Backup})
//	ln, _ := net.Listen("tcp", "127.0.0.1:7070") // loopback: see Caveats
//	go http.Serve(ln, h)
//
// Every call carries the token (Authorization: Bearer TOKEN); a call
// without it, or with another, is answered 401 and does nothing. Errors
// are application/problem+json, as the public API's.
//
//	GET  /admin/v1/record?tenant=T&endpoint=E&key=K   the record, in any state
//	GET  /admin/v1/records?state=S&tenant=T&older_than=D&after=C&limit=N
//	                                                 records in any state, by state, tenant and age (idemkv.Scanner)
//	GET  /admin/v1/pending?escalated=B&tenant=T&after=C&limit=N
//	                                                 what awaits reconciliation, or the escalated, oldest first
//	POST /admin/v1/resolve {...ResolveRequest}       settle a record by hand, audited, through the service
//	POST /admin/v1/evict   {...EvictRequest}         remove a record (idemkv.Evicter), audited
//	GET  /admin/v1/export?outbox=B&inbox=B           every record as JSON lines (Export)
//	GET  /admin/v1/stats                             the store's figures
//	POST /admin/v1/check                             the store's check: {"problems": N, "report": {...}}
//	POST /admin/v1/sweep                             one sweeper pass
//	POST /admin/v1/backup  {"dir": "/abs/path"}      a consistent copy, while the service runs
//
// The same handler serves the operator's console, the API as web pages,
// at /console/ (Options.NoConsole turns it off): sign-in with the token
// and a session cookie, an overview that refreshes itself, records found
// and listed, the unsettled queue, confirmed actions (ask the reconciler,
// resolve, evict) that call Resolve and Evict, sagas as timelines, and
// the outbox's lag. Its pages are rendered on the server (html/template)
// from assets embedded in the binary; every POST carries a CSRF token and
// every page a Content-Security-Policy that forbids framing and foreign
// scripts.
//
// A resolve goes through the application whose record it settles
// (Options.Settler, Options.Reconciler; see ResolveOptions): an applied
// one writes what the service writes with a payment it made, a no-effect
// one gives back what the operation held, and one with "verify" asks the
// reconciler first and is made only if the downstream agrees, with the
// downstream's own answer. A record the downstream says happened is never
// released by a verified resolve.
//
// "idemkv serve --admin-addr" serves it, and "idemkv
// inspect|list|pending|resolve|evict|export|check|sweep|backup --server
// URL" call it. The same functions (List, Resolve, Evict, Export) serve
// those commands on a store no process holds.
//
// # Caveats
//
//   - Serve it on a listener of its own, on loopback unless the network
//     in between is trusted: the token is a bearer secret, sent in the
//     clear over plain HTTP, and so is the console's session cookie.
//   - The console's sessions live in the process: a restart signs its
//     operators out.
//   - Wrong tokens are throttled by client address (IPv6: by /64): after
//     100 different ones, an address gets one try a second, and meanwhile
//     its tokens, right ones too, are answered 429 uncompared. A wrong
//     token sent again (one of the address's last 16) is not counted.
//     Every client on one address shares its budget: on loopback or
//     through an SSH tunnel, all local clients; behind a proxy, all of
//     its clients. Past 4,096 addresses, new ones share one budget too.
//     A client guessing holds back the operators who share its budget.
//     The throttle slows guessing; the token's length (MinTokenLen) is
//     what stands against it.
//   - A record's answer holds its key and result pointer (the operator
//     asked for them); its response body only as a size.
//   - A backup's directory is a path on the service's machine.
//   - Resolve and evict need an audit log (Options.Audit); without one
//     they answer 404. The audit log holds keys; the Logger never does.
//   - An export is read page by page, not from one snapshot.
//   - A resolve without "verify" stands on the operator's word: the
//     Settler writes what the service writes, but does not check the
//     downstream. The Settler and the Reconciler are called in the
//     request, each bounded by Options.ResolveTimeout; a panic in them,
//     or in the writes they give, refuses the resolve (500, nothing
//     written) and is logged without the key.
package admin

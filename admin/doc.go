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
//	GET  /admin/v1/records?escalated=B&tenant=T&after=C&limit=N
//	                                                 what awaits reconciliation, or the escalated, oldest first
//	GET  /admin/v1/stats                             the store's figures
//	POST /admin/v1/check                             the store's check: {"problems": N, "report": {...}}
//	POST /admin/v1/sweep                             one sweeper pass
//	POST /admin/v1/backup  {"dir": "/abs/path"}      a consistent copy, while the service runs
//
// "idemkv serve --admin-addr" serves it, and "idemkv
// inspect|backup|check --server URL" call it.
//
// # Caveats
//
//   - Serve it on a listener of its own, on loopback unless the network
//     in between is trusted: the token is a bearer secret, sent in the
//     clear over plain HTTP.
//   - A record's answer holds its key and result pointer (the operator
//     asked for them); its response body only as a size.
//   - A backup's directory is a path on the service's machine.
package admin

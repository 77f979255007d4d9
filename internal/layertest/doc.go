// Package layertest holds the suites of the packages built on the Store
// contract, each run unchanged on both stores: the Pebble engine, then
// PostgreSQL (package pgstore, on a server of package pgstore/pgtest).
// They test their packages through their exported API only, and are kept
// apart from them so that the library needs no PostgreSQL driver, not even
// for its tests: this directory is a module of its own (in go.work), for
// tests only.
//
// A directory per package tested, holding only its tests, and the store
// they run on:
//
//	once/       package once: Do, local and remote, its logs, the model test
//	inbox/      package inbox: the Consumer, its logs, MessageError and Logger
//	outbox/     package outbox: the Relay and its logs
//	reconcile/  package reconcile: the Worker, its grace, logs and panics, the model test
//	saga/       package saga: the Runner, wake-ups, its logs and panics, the model test
//	teststore/  the store a suite runs on, and the TestMain that runs the suite on both
//
// The tests that do not run on teststore's store stay in their packages:
// the examples (each opens an engine of its own) and inbox's key tests.
// The tests of natsjs.Consume, which feeds a stream to an inbox consumer,
// are in package natsjs, on the engine only.
package layertest

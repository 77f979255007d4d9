// Package logtest keeps what a logger writes in memory for a test to
// read: a JSON slog logger into a [Log], and the log's records decoded.
// It is for tests only.
package logtest

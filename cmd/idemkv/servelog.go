package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
)

// logFlags are the flags that shape serve's log: one structured record
// per state change of a payment's key, and every failure, on stderr.
type logFlags struct {
	format string
	level  slog.Level
	// out is where records go; nil is os.Stderr (tests set it).
	out io.Writer
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.format, "log-format", "json", "write the log to stderr as `json` (one object a line) or text (key=value)")
	fs.TextVar(&l.level, "log-level", slog.LevelInfo, "log records at `LEVEL` and above: debug (replays and 409s too), info (every state change of a key), warn, error")
}

func (l *logFlags) validate() error {
	if l.format != "json" && l.format != "text" && l.format != "" {
		return fmt.Errorf("--log-format %q: want json or text", l.format)
	}
	return nil
}

// logger returns the logger the flags describe.
func (l *logFlags) logger() *slog.Logger {
	out := l.out
	if out == nil {
		out = os.Stderr
	}
	opts := &slog.HandlerOptions{Level: l.level}
	if l.format == "text" {
		return slog.New(slog.NewTextHandler(out, opts))
	}
	return slog.New(slog.NewJSONHandler(out, opts))
}

// Command idemkv is the command-line tool of the idemkv idempotency store.
//
//	idemkv backup DIR              copy a store consistently into a new directory
//	idemkv bench [flags]           the engine against a raw-Pebble baseline; --profile day: a full day
//	idemkv bench events [flags]    completions with events, the relay to JetStream, an inbox consumer
//	idemkv bench http [flags]      the HTTP middleware's latency overhead
//	idemkv bench postgres [flags]  the PostgreSQL store against naive SQL
//	idemkv bench ttl [flags]       retention: disk over time, sweeper cost
//	idemkv check --data DIR        verify a store's invariants, read-only
//	idemkv demo [--data DIR]       play the guide's retry failures over HTTP against examples/payments
//	idemkv evict --data DIR        remove a record by hand, audited
//	idemkv export --data DIR       write every record as JSON lines
//	idemkv fingerprint [FILE]      print a request's canonical form and fingerprint
//	idemkv inspect                 show one record, in any state
//	idemkv ledger [flags]          run the ledger consumer of examples/ledger
//	idemkv list --data DIR         list records by state, tenant and age
//	idemkv migrate --data DIR      bring a closed store to this version's layout, after a backup
//	idemkv pending                 list the records awaiting reconciliation, or the escalated ones
//	idemkv processor [flags]       run a simulated card processor over HTTP
//	idemkv resolve                 settle an uncertain, abandoned or escalated record by hand
//	idemkv restore DIR             put a backup in place as a new store, and check it
//	idemkv serve [flags]           run the payments service on loopback HTTP
//	idemkv sweep --data DIR        delete a closed store's expired records
//	idemkv help [COMMAND]          show usage
//
// The operator's commands (inspect, list, pending, resolve, evict,
// export, check, sweep, backup) take --server URL instead of --data DIR to
// call a running service's admin API.
//
// Each subcommand lives in a file of its own and registers itself with
// register from an init function; main.go only dispatches. Exit status: 0 on
// success, 1 when a command fails, 2 on a usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/idemkv/idemkv/engine"
)

// A command is one subcommand of idemkv.
type command struct {
	// name is the word that selects the command: "demo".
	name string
	// args is the synopsis after the name: "[--data DIR]".
	args string
	// summary is one line for the command list.
	summary string
	// maxArgs is how many arguments may follow the flags (the command reads
	// them with fs.Args). Default 0.
	maxArgs int
	// flags defines the command's flags on fs and returns the function that
	// runs the command once they are parsed. Output goes to stdout; the
	// returned error, if any, is printed to stderr and exits 1 (2 for a
	// usageError).
	flags func(fs *flag.FlagSet) func(ctx context.Context, stdout io.Writer) error
}

// A usageError is a command's complaint about its flags that the flag
// package cannot catch, such as a bad combination: run prints it with the
// command's usage and exits 2, as for any other usage error.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// commands holds every registered command by name.
var commands = map[string]*command{}

// register adds c to the tool. It is called from the init function of the
// file that implements c.
func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("idemkv: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line args (without the program name) and returns
// the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		return help(rest, stdout, stderr)
	}
	// A two-word command ("bench ttl") is registered under both words.
	if len(rest) > 0 && commands[name+" "+rest[0]] != nil {
		name, rest = name+" "+rest[0], rest[1:]
	}
	c := commands[name]
	if c == nil {
		fmt.Fprintf(stderr, "idemkv: unknown command %q\n\n", name)
		usage(stderr)
		return exitUsage
	}

	fs := flag.NewFlagSet("idemkv "+c.name, flag.ContinueOnError)
	// The flag package would print its own error and usage; print ours.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	runCmd := c.flags(fs)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			commandUsage(stdout, c, fs)
			return exitOK
		}
		fmt.Fprintf(stderr, "idemkv %s: %v\n", c.name, err)
		commandUsage(stderr, c, fs)
		return exitUsage
	}
	if fs.NArg() > c.maxArgs {
		fmt.Fprintf(stderr, "idemkv %s: unexpected argument %q\n", c.name, fs.Arg(c.maxArgs))
		if strings.HasPrefix(fs.Arg(c.maxArgs), "-") {
			fmt.Fprintf(stderr, "(flags go before arguments)\n")
		}
		commandUsage(stderr, c, fs)
		return exitUsage
	}
	if err := runCmd(ctx, stdout); err != nil {
		fmt.Fprintf(stderr, "idemkv %s: %v\n", c.name, err)
		if errors.Is(err, engine.ErrLocked) {
			fmt.Fprintf(stderr, "(a running service holds it: stop it, or ask it with --server URL where the command has one)\n")
		}
		var ue usageError
		if errors.As(err, &ue) {
			commandUsage(stderr, c, fs)
			return exitUsage
		}
		return exitFail
	}
	return exitOK
}

// help implements "idemkv help [COMMAND]".
func help(args []string, stdout, stderr io.Writer) int {
	switch len(args) {
	case 0:
		usage(stdout)
		return exitOK
	case 1, 2:
		if c := commands[strings.Join(args, " ")]; c != nil {
			fs := flag.NewFlagSet("idemkv "+c.name, flag.ContinueOnError)
			c.flags(fs)
			commandUsage(stdout, c, fs)
			return exitOK
		}
		fmt.Fprintf(stderr, "idemkv help: unknown command %q\n\n", args[0])
	}
	usage(stderr)
	return exitUsage
}

// usage prints the tool's synopsis and command list.
func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	width := len("help")
	for name := range commands {
		names = append(names, name)
		width = max(width, len(name))
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("Usage: idemkv COMMAND [flags]\n\nCommands:\n")
	for _, name := range names {
		c := commands[name]
		fmt.Fprintf(&b, "  %-*s %s\n", width, c.name, c.summary)
	}
	fmt.Fprintf(&b, "  %-*s %s\n", width, "help", "show this message, or a command's flags (idemkv help COMMAND)")
	io.WriteString(w, b.String())
}

// commandUsage prints one command's synopsis and flags.
func commandUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: idemkv %s %s\n\n%s\n", c.name, c.args, c.summary)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintf(w, "\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

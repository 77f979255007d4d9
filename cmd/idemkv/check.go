package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/pgstore"
)

func init() {
	register(&command{
		name:    "check",
		args:    "--data DIR | --store URL | --server URL [--token-file FILE] [--json] [--memory-mib N]",
		summary: "verify, read-only, the invariants of a store (a Pebble store no process has open, or a PostgreSQL store); exit 1 if any is broken",
		flags:   checkFlags,
	})
}

func checkFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		dir, store, server, tokenFile string
		asJSON                        bool
		memMiB                        int64
	)
	fs.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	fs.StringVar(&store, "store", "", "check the PostgreSQL store at `URL` instead (processes may be using it; its counts are then a moment's)")
	adminFlags(fs, &server, &tokenFile, "check the store of the running service whose admin API is at `URL` (serve --admin-addr)")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fs.Int64Var(&memMiB, "memory-mib", 256, "memory for pairing effects with their outcomes, in `MiB`; a store that needs more is read in several passes")
	return func(ctx context.Context, stdout io.Writer) error {
		if server != "" {
			if dir != "" || store != "" {
				return usageError{errors.New("--server, --data and --store name three stores: give one")}
			}
			return checkServer(ctx, server, tokenFile, asJSON, stdout)
		}
		if store != "" {
			if dir != "" {
				return usageError{errors.New("--data and --store name two stores: give one")}
			}
			if err := validStoreFlag(store); err != nil {
				return usageError{err}
			}
			return checkPostgres(ctx, store, asJSON, stdout)
		}
		if dir == "" {
			return usageError{errors.New("--data or --store is required")}
		}
		if memMiB < 1 {
			return usageError{fmt.Errorf("--memory-mib %d: must be at least 1", memMiB)}
		}
		if _, err := os.Stat(dir); err != nil {
			return err // do not create a store where none is
		}
		e, err := engine.Open(dir, &engine.Options{ReadOnly: true, NoBackgroundSweep: true, CheckMemory: memMiB << 20})
		if err != nil {
			return err
		}
		rep, err := e.Check(ctx)
		if cerr := e.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return printCheck(stdout, asJSON, rep, engineCheckSummary(&rep))
	}
}

// engineCheckSummary is what printCheck writes of a Pebble store's check.
func engineCheckSummary(rep *engine.CheckReport) checkSummary {
	problems := make([]string, len(rep.Problems))
	for i, p := range rep.Problems {
		problems[i] = p.String()
	}
	var lines []string
	if rep.Passes > 1 {
		lines = append(lines, fmt.Sprintf("passes   %d (pairing needed more than --memory-mib)", rep.Passes))
	}
	if rep.SweepCursor {
		lines = append(lines, "sweeper  a pass is under way")
	}
	return checkSummary{
		records: fmt.Sprintf("%d: %d in progress, %d uncertain, %d completed (%d past expiry, not yet swept)",
			rep.Records, rep.InProgress, rep.Uncertain, rep.Completed, rep.Expired),
		effects: fmt.Sprintf("%d: %d paired with their outcome, %d of expired outcomes; %d outcomes with effects since overwritten",
			rep.Effects, rep.EffectsPaired, rep.EffectsExpired, rep.Superseded),
		more:     append([]string{fmt.Sprintf("epoch    %d", rep.Epoch)}, lines...),
		problems: problems, count: rep.ProblemCount,
	}
}

// checkSummary is what printCheck writes of a store's check report.
type checkSummary struct {
	records, effects string   // the counts after "records" and "effects"
	more             []string // the store's own lines
	problems         []string // the problems the report lists
	count            int      // the problems found, listed or not
}

// printCheck writes a check report, as JSON (rep) or as lines
// (summary), and fails if it found problems.
func printCheck(stdout io.Writer, asJSON bool, rep any, sum checkSummary) error {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		var b strings.Builder
		fmt.Fprintf(&b, "records  %s\neffects  %s\n", sum.records, sum.effects)
		for _, l := range sum.more {
			b.WriteString(l + "\n")
		}
		for _, p := range sum.problems {
			fmt.Fprintf(&b, "problem  %s\n", p)
		}
		if more := sum.count - len(sum.problems); more > 0 {
			fmt.Fprintf(&b, "problem  ... and %d more\n", more)
		}
		if sum.count == 0 {
			b.WriteString("ok: every invariant holds\n")
		}
		if _, err := io.WriteString(stdout, b.String()); err != nil {
			return err
		}
	}
	if sum.count > 0 {
		return fmt.Errorf("%d broken invariants", sum.count)
	}
	return nil
}

// checkPostgres runs pgstore's Check on the store at url and prints its
// report.
func checkPostgres(ctx context.Context, url string, asJSON bool, stdout io.Writer) error {
	s, err := pgstore.Open(ctx, url, &pgstore.Options{NoBackgroundSweep: true, NoListen: true})
	if err != nil {
		return err
	}
	rep, err := s.Check(ctx)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return printCheck(stdout, asJSON, rep, checkSummary{
		records: fmt.Sprintf("%d: %d in progress, %d uncertain, %d completed (%d past expiry, not yet swept)",
			rep.Records, rep.InProgress, rep.Uncertain, rep.Completed, rep.Expired),
		effects: fmt.Sprintf("%d: %d paired with their outcome, %d written outside any record",
			rep.Effects, rep.EffectsPaired, rep.EffectsStandalone),
		more: []string{fmt.Sprintf("outbox   %d events (%d not yet numbered), acknowledged through %d of %d",
			rep.Events, rep.Unsequenced, rep.OutboxAcked, rep.OutboxLast)},
		problems: rep.Problems, count: rep.ProblemCount,
	})
}

// checkServer runs the check of a running service's store through its
// admin API.
func checkServer(ctx context.Context, server, tokenFile string, asJSON bool, stdout io.Writer) error {
	c, err := newAdminClient(server, tokenFile)
	if err != nil {
		return err
	}
	var out struct {
		Problems int             `json:"problems"`
		Report   json.RawMessage `json:"report"`
	}
	if err := c.call(ctx, http.MethodPost, "/admin/v1/check", nil, &out); err != nil {
		return err
	}
	var rep struct {
		Records    int   `json:"records"`
		InProgress int   `json:"in_progress"`
		Uncertain  int   `json:"uncertain"`
		Completed  int   `json:"completed"`
		Problems   []any `json:"problems"`
	}
	_ = json.Unmarshal(out.Report, &rep) // the fields both stores' reports share
	problems := make([]string, len(rep.Problems))
	for i, p := range rep.Problems {
		problems[i] = fmt.Sprint(p)
	}
	return printCheck(stdout, asJSON, out.Report, checkSummary{
		records: fmt.Sprintf("%d: %d in progress, %d uncertain, %d completed", rep.Records, rep.InProgress, rep.Uncertain, rep.Completed),
		effects: "(see --json)", problems: problems, count: out.Problems,
	})
}

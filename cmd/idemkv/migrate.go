package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/idemkv/idemkv/engine"
)

func init() {
	register(&command{
		name:    "migrate",
		args:    "--data DIR (--backup-to DIR | --no-backup) [--dry-run] [--json]",
		summary: "bring a Pebble store no process has open to this version's layout, in place, after copying it to a backup; then check it and exit 1 if an invariant is broken",
		flags:   migrateFlags,
	})
}

// migrateReport is what migrate prints with --json.
type migrateReport struct {
	Data string `json:"data"`
	// FromLayout is the layout the store was in (0: a store with no
	// records yet), ToLayout the layout it is in now (engine.Layout).
	FromLayout uint64 `json:"from_layout"`
	ToLayout   uint64 `json:"to_layout"`
	// Migrated says whether the store's layout changed (with DryRun:
	// would change).
	Migrated bool `json:"migrated"`
	DryRun   bool `json:"dry_run,omitempty"`
	// Backup is the copy of the store taken before it was opened, in
	// FromLayout; "" with --no-backup or --dry-run.
	Backup      string `json:"backup,omitempty"`
	BackupBytes int64  `json:"backup_bytes,omitempty"`
	// Check is the migrated store's check; absent with --dry-run.
	Check *engine.CheckReport `json:"check,omitempty"`
}

func migrateFlags(flags *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		dir, backup              string
		noBackup, dryRun, asJSON bool
	)
	flags.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	flags.StringVar(&backup, "backup-to", "", "copy the store into `DIR`, which must not exist, before opening it")
	flags.BoolVar(&noBackup, "no-backup", false, "migrate without a backup: a store that then fails its check, or a rollback, has no copy to return to")
	flags.BoolVar(&dryRun, "dry-run", false, "only say what the store's layout is and whether it would be migrated; change nothing")
	flags.BoolVar(&asJSON, "json", false, "print what was done, and the check's report, as JSON")
	return func(ctx context.Context, stdout io.Writer) error {
		switch {
		case dir == "":
			return usageError{errors.New("--data is required")}
		case backup != "" && noBackup:
			return usageError{errors.New("--backup-to and --no-backup: give one")}
		case backup == "" && !noBackup && !dryRun:
			return usageError{errors.New("--backup-to DIR is required (or --no-backup, to migrate without a copy to return to)")}
		}
		if err := unfinishedRestore(dir); err != nil {
			return err
		}
		if _, err := os.Stat(dir); err != nil {
			return err // do not create a store where none is
		}
		if backup != "" {
			if _, err := os.Stat(backup); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%s exists: back up into a new directory", backup)
			}
			if err := apart(dir, backup); err != nil {
				return err
			}
		}
		rep, err := migrate(ctx, dir, backup, dryRun)
		if err != nil {
			return err
		}
		return printMigrate(stdout, asJSON, &rep)
	}
}

// migrate reads the layout of the store in dir, copies the store to
// backup (unless ""), opens it read-write, which migrates it, and checks
// it. It holds the store's lock from the first read to the check, so no
// other process can open the store between the backup and the migration:
// the backup is the store exactly as it was before.
func migrate(ctx context.Context, dir, backup string, dryRun bool) (migrateReport, error) {
	rep := migrateReport{Data: dir, ToLayout: engine.Layout, DryRun: dryRun}
	lock, err := pebble.LockDirectory(dir, vfs.Default)
	if err != nil {
		return rep, fmt.Errorf("lock %s (is it open in another process?): %w", dir, err)
	}
	defer lock.Close()
	opts := &engine.Options{NoBackgroundSweep: true, ConfigurePebble: func(po *pebble.Options) { po.Lock = lock }}
	// A layout no Open reads is refused here, before any copy.
	if rep.FromLayout, err = engine.StoredLayout(dir, opts); err != nil {
		return rep, err
	}
	rep.Migrated = rep.FromLayout != 0 && rep.FromLayout != engine.Layout
	if dryRun {
		rep.ToLayout = rep.FromLayout
		if rep.Migrated {
			rep.ToLayout = engine.Layout
		}
		return rep, nil
	}
	if backup != "" {
		if err := copyTree(dir, backup, "LOCK"); err != nil {
			return rep, fmt.Errorf("back up %s to %s: %w", dir, backup, err)
		}
		rep.Backup = backup
		if rep.BackupBytes, err = dirSize(backup); err != nil {
			return rep, err
		}
	}
	e, err := engine.Open(dir, opts)
	if err != nil {
		return rep, err
	}
	chk, err := e.Check(ctx)
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return rep, err
	}
	rep.Check = &chk
	return rep, nil
}

// printMigrate writes rep, as JSON or as lines, and fails if the check
// found problems.
func printMigrate(stdout io.Writer, asJSON bool, rep *migrateReport) error {
	if asJSON && rep.Check == nil {
		return printJSON(stdout, rep)
	}
	if !asJSON {
		layout := fmt.Sprintf("layout   %d: the current layout, nothing to migrate", rep.ToLayout)
		switch {
		case rep.FromLayout == 0:
			layout = fmt.Sprintf("layout   none yet (no records); this version writes %d", engine.Layout)
		case rep.Migrated && rep.DryRun:
			layout = fmt.Sprintf("layout   %d: a read-write Open migrates it to %d (dry run: nothing done)", rep.FromLayout, rep.ToLayout)
		case rep.Migrated:
			layout = fmt.Sprintf("layout   %d -> %d: migrated in place", rep.FromLayout, rep.ToLayout)
		}
		backup := "backup   none (--no-backup)"
		switch {
		case rep.DryRun:
			backup = "backup   none (dry run)"
		case rep.Backup != "":
			backup = fmt.Sprintf("backup   %s (%d bytes, layout %d)", rep.Backup, rep.BackupBytes, rep.FromLayout)
		}
		if _, err := fmt.Fprintf(stdout, "store    %s\n%s\n%s\n", rep.Data, layout, backup); err != nil {
			return err
		}
		if rep.Check == nil {
			return nil
		}
	}
	return printCheck(stdout, asJSON, rep, engineCheckSummary(rep.Check))
}

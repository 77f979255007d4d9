package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
)

// Backup writes a consistent copy of the store into dir, which must not
// exist, while the store goes on serving: a Pebble checkpoint (its
// sstables hard-linked where the filesystem allows, copied otherwise; the
// write-ahead log and manifest copied). The copy holds every commit that
// returned before Backup was called, and of the commits running meanwhile
// each whole or not at all: an outcome with its effects and events, or
// neither. Local claims in progress live in memory and are not in it (a
// retry after a restore runs anew, as after a crash); remote claims are,
// and a restored store reconciles them as abandoned once their leases
// have run out.
//
// dir may not lie inside the store's own directory (ErrInvalidArgument).
// The copy is a store directory: open it with Open (package engine), or
// put it in place with "idemkv restore". It takes little space at first
// (hard links) and more as the live store compacts away the files it
// shares with the copy.
func (e *Engine) Backup(ctx context.Context, dir string) error {
	if err := e.gate.begin(ctx); err != nil {
		return err
	}
	defer e.gate.exit()
	// One backup at a time: two into one directory would both pass
	// Pebble's check that it does not exist, and the cleanup of a failed
	// one would remove the other's.
	e.backupMu.Lock()
	defer e.backupMu.Unlock()
	if within(dir, e.dir) {
		// The copy would be part of the store it copies: in every later
		// backup, and in the way of Pebble's files.
		return fmt.Errorf("%w: backup to %s: inside the store's own directory %s", idemkv.ErrInvalidArgument, dir, e.dir)
	}
	var opts []pebble.CheckpointOption
	if !e.opts.ReadOnly {
		// Sync the log first: the copy then has every commit that
		// returned, even one whose group synced after Backup's call.
		opts = append(opts, pebble.WithFlushedWAL())
	}
	if err := e.db.Checkpoint(dir, opts...); err != nil {
		return fmt.Errorf("engine: backup to %s: %w", dir, err)
	}
	return nil
}

// within reports whether path is dir or lies inside it, both made
// absolute with their symbolic links followed (a path that cannot be
// made absolute is taken as apart).
func within(path, dir string) bool {
	p, err1 := resolved(path)
	d, err2 := resolved(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// resolved is path made absolute, with the symbolic links of the longest
// part of it that exists followed.
func resolved(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	rest := ""
	for cur := abs; ; {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(r, rest), nil
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return abs, nil
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkv/idemkv/engine"
)

func init() {
	register(&command{
		name:    "backup",
		args:    "(--data DIR | --server URL [--token-file FILE]) --to DIR [--json]",
		summary: "copy a Pebble store consistently into a new directory: one no process has open (--data), or a running service's through its admin API (--server; DIR is then on its machine). A PostgreSQL store is backed up with the database's own tools",
		flags:   backupFlags,
	})
	register(&command{
		name:    "restore",
		args:    "--from DIR --data DIR [--json]",
		summary: "put a backup in place as a new store directory, and check it",
		flags:   restoreFlags,
	})
}

// backupReport is what backup and restore print with --json.
type backupReport struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Bytes is the size of the files of the copy.
	Bytes int64 `json:"bytes"`
	// Check is the restored store's check, for restore.
	Check *engine.CheckReport `json:"check,omitempty"`
	// Layout is the restored store's layout when it is an earlier one
	// (a backup migrate took). Restore checks it if a read-only Open
	// reads that layout (4 and 5), and leaves Check nil otherwise (3).
	Layout uint64 `json:"layout,omitempty"`
}

func backupFlags(flags *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		dir, to, server, tokenFile string
		asJSON                     bool
	)
	flags.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	adminFlags(flags, &server, &tokenFile, "back up the store of the service whose admin API is at `URL` (serve --admin-addr), while it runs")
	flags.StringVar(&to, "to", "", "the backup's directory (`DIR`), which must not exist")
	flags.BoolVar(&asJSON, "json", false, "print what was done as JSON")
	return func(ctx context.Context, stdout io.Writer) error {
		if server != "" {
			if dir != "" || to == "" || !filepath.IsAbs(to) {
				return usageError{errors.New("--server takes --to DIR, an absolute path on the service's machine, and no --data")}
			}
			return backupServer(ctx, server, tokenFile, filepath.Clean(to), asJSON, stdout)
		}
		if dir == "" || to == "" {
			return usageError{errors.New("--data (or --server) and --to are required")}
		}
		if _, err := os.Stat(dir); err != nil {
			return err // do not create a store where none is
		}
		if _, err := os.Stat(to); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s exists: back up into a new directory", to)
		}
		// Opened read-only, the store is locked against other processes
		// and changed by nothing: a copy of its files is the store as it
		// was closed. (Pebble's checkpoint, which a running service's
		// Engine.Backup uses, needs a store opened for writing.)
		e, err := engine.Open(dir, &engine.Options{ReadOnly: true, NoBackgroundSweep: true})
		if err != nil {
			return err
		}
		err = copyTree(dir, to, "LOCK")
		if cerr := e.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("back up %s to %s: %w", dir, to, err)
		}
		rep := backupReport{From: dir, To: to}
		if rep.Bytes, err = dirSize(to); err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, rep)
		}
		_, err = fmt.Fprintf(stdout, "backed up %s to %s (%d bytes)\n", dir, to, rep.Bytes)
		return err
	}
}

// backupServer asks the service at server for a backup into to.
func backupServer(ctx context.Context, server, tokenFile, to string, asJSON bool, stdout io.Writer) error {
	c, err := newAdminClient(server, tokenFile)
	if err != nil {
		return err
	}
	var out struct {
		Dir     string  `json:"dir"`
		Seconds float64 `json:"seconds"`
	}
	if err := c.call(ctx, http.MethodPost, "/admin/v1/backup", map[string]string{"dir": to}, &out); err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, backupReport{From: server, To: out.Dir})
	}
	_, err = fmt.Fprintf(stdout, "backed up the store of %s to %s on its machine (%.1fs)\n", server, out.Dir, out.Seconds)
	return err
}

func restoreFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		from, dir string
		asJSON    bool
	)
	fs.StringVar(&from, "from", "", "the backup's directory (`DIR`), as backup wrote it")
	fs.StringVar(&dir, "data", "", "the new store's directory (`DIR`): it must not exist, or be empty")
	fs.BoolVar(&asJSON, "json", false, "print what was done, and the check's report, as JSON")
	return func(ctx context.Context, stdout io.Writer) error {
		if from == "" || dir == "" {
			return usageError{errors.New("--from and --data are required")}
		}
		if err := unfinishedRestore(dir); err != nil {
			return err
		}
		if err := emptyOrAbsent(dir); err != nil {
			return err
		}
		if err := apart(from, dir); err != nil {
			return err
		}
		// The copy is made and checked apart, and moved into place only
		// once it opens as a store: a failed restore leaves nothing at
		// dir that serve would start an empty store on.
		st, err := newStaging(dir)
		if err != nil {
			return err
		}
		out, rep, err := restoreInto(ctx, from, st.dir)
		if err != nil {
			return errors.Join(err, st.discard())
		}
		if rep != nil && rep.ProblemCount > 0 {
			return fmt.Errorf("the restored store breaks %d invariants (idemkv check --data %s); it is left in %s, and nothing is at %s",
				rep.ProblemCount, st.dir, st.dir, dir)
		}
		if err := st.putInPlace(); err != nil {
			return errors.Join(err, st.discard())
		}
		out.From, out.To = from, dir
		if asJSON {
			return printJSON(stdout, out)
		}
		if rep == nil {
			_, err = fmt.Fprintf(stdout, "restored %s into %s (%d bytes): layout %d, which this version migrates to %d at a read-write Open; not checked (a read-only Open does not read layout %d)\n",
				from, dir, out.Bytes, out.Layout, engine.Layout, out.Layout)
			return err
		}
		_, err = fmt.Fprintf(stdout, "restored %s into %s (%d bytes): %d records (%d completed, %d in progress, %d uncertain), %d effects; check: %d problems\n",
			from, dir, out.Bytes, rep.Records, rep.Completed, rep.InProgress, rep.Uncertain, rep.Effects, rep.ProblemCount)
		return err
	}
}

// restoreInto copies the backup from into dir and checks the copy: it
// must open as a store. The report's check is nil for a store in a layout
// that a read-only Open does not read (a backup migrate took before it
// migrated), which is not checked.
func restoreInto(ctx context.Context, from, dir string) (backupReport, *engine.CheckReport, error) {
	var out backupReport
	if err := copyTree(from, dir, ""); err != nil {
		return out, nil, fmt.Errorf("restore %s: %w", from, err)
	}
	layout, err := engine.StoredLayout(dir, nil)
	if err != nil {
		return out, nil, fmt.Errorf("restore: the copy does not open as a store: %w", err)
	}
	if layout != 0 && layout != engine.Layout {
		out.Layout = layout
	}
	if out.Bytes, err = dirSize(dir); err != nil {
		return out, nil, err
	}
	e, err := engine.Open(dir, &engine.Options{ReadOnly: true, NoBackgroundSweep: true})
	if out.Layout != 0 && errors.Is(err, engine.ErrLayout) {
		// For a rollback to the version that wrote it, or for a
		// read-write Open of this one, which migrates it; a read-only
		// Open, and so the check, does not read this layout.
		return out, nil, nil
	}
	if err != nil {
		return out, nil, fmt.Errorf("restore: the copy does not open as a store: %w", err)
	}
	rep, err := e.Check(ctx)
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return out, nil, err
	}
	out.Check = &rep
	return out, &rep, nil
}

// staging is where a restore copies a backup before it is in place: a
// new directory beside dir if dir is absent, or a hidden one inside dir
// if dir is an existing empty directory (a mount point, or a symbolic
// link to one, which must stay what it is).
type staging struct {
	dir, target string
	inside      bool
}

func newStaging(target string) (*staging, error) {
	target = filepath.Clean(target)
	st := &staging{target: target}
	if _, err := os.Stat(target); err == nil {
		st.inside = true
		st.dir, err = os.MkdirTemp(target, ".restoring-")
		return st, err
	}
	parent := filepath.Dir(target)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parent, "."+filepath.Base(target)+".restoring-")
	if err != nil {
		return nil, err
	}
	st.dir = dir
	return st, os.Chmod(dir, 0o755)
}

// unfinishedRestore refuses dir while it has the copy of a restore that
// has not put it in place: one running, or one killed before it was done
// (newStaging's directory inside dir, or beside it). Opened meanwhile, dir
// would be made an empty store, or be half moved.
func unfinishedRestore(dir string) error {
	dir = filepath.Clean(dir)
	for _, where := range []struct{ parent, prefix string }{
		{dir, ".restoring-"},
		{filepath.Dir(dir), "." + filepath.Base(dir) + ".restoring-"},
	} {
		entries, err := os.ReadDir(where.parent)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		for _, e := range entries {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), where.prefix) {
				continue
			}
			left := filepath.Join(where.parent, e.Name())
			if where.parent == dir {
				// Killed while moving the copy's entries up, it may have
				// moved some: dir was empty before the restore.
				return fmt.Errorf("a restore into %s has not finished: its copy is in %s, and some of it may be in %s already. If no restore is running, empty %s (it was empty before the restore) and restore again",
					dir, left, dir, dir)
			}
			return fmt.Errorf("a restore into %s has not finished: its copy is in %s. If no restore is running, remove that copy (rm -rf %s) and restore again",
				dir, left, left)
		}
	}
	return nil
}

// putInPlace moves the checked copy to the target: renames it there, or
// moves its entries up into the target it is inside. Either way the
// directory that changed is synced.
func (st *staging) putInPlace() error {
	if !st.inside {
		if err := os.Rename(st.dir, st.target); err != nil {
			return err
		}
		return syncPath(filepath.Dir(st.target))
	}
	entries, err := os.ReadDir(st.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.Rename(filepath.Join(st.dir, e.Name()), filepath.Join(st.target, e.Name())); err != nil {
			return err
		}
	}
	if err := os.Remove(st.dir); err != nil {
		return err
	}
	return syncPath(st.target)
}

// discard removes what the restore put in place or apart: the target was
// absent or empty before it.
func (st *staging) discard() error {
	if !st.inside {
		return os.RemoveAll(st.dir)
	}
	entries, err := os.ReadDir(st.target)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(st.target, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// emptyOrAbsent refuses a directory that holds anything: a restore never
// mixes a backup with other files.
func emptyOrAbsent(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case len(entries) > 0:
		return fmt.Errorf("%s is not empty: restore into a new directory", dir)
	}
	return nil
}

// copyTree copies the regular files and directories under from into to,
// except a top-level file named skip, each file synced, then each
// directory. It refuses a destination inside the source, which the walk
// would copy into itself without end, and a source inside the
// destination.
func copyTree(from, to, skip string) error {
	if err := apart(from, to); err != nil {
		return err
	}
	var dirs []string
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		switch {
		case d.IsDir():
			dirs = append(dirs, dst)
			return os.MkdirAll(dst, 0o755)
		case rel == skip:
			return nil
		case d.Type().IsRegular():
			return copyFile(path, dst)
		}
		return fmt.Errorf("%s is neither a file nor a directory", path)
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syncPath(dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies from to to, which must not exist, with from's
// permissions (the audit log's are its owner's only), synced.
func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Sync(); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// dirSize is the size of the regular files under dir.
func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	return n, err
}

// apart refuses two directories of which one is, or is inside, the other
// (to need not exist yet: its nearest existing parent decides).
func apart(from, to string) error {
	a, err := resolved(from)
	if err != nil {
		return err
	}
	b, err := resolved(to)
	if err != nil {
		return err
	}
	within := func(x, y string) bool { // x is y or inside it
		rel, err := filepath.Rel(y, x)
		return err == nil && (rel == "." || !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && rel != "..")
	}
	if within(a, b) || within(b, a) {
		return fmt.Errorf("%s and %s overlap: copy to a directory outside the source", from, to)
	}
	return nil
}

// resolved is path made absolute with its symbolic links followed, as far
// as it exists.
func resolved(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	var rest []string
	for {
		real, err := filepath.EvalSymlinks(abs)
		if err == nil {
			return filepath.Join(append([]string{real}, rest...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(abs)
		if parent == abs {
			return abs, nil
		}
		rest = append([]string{filepath.Base(abs)}, rest...)
		abs = parent
	}
}

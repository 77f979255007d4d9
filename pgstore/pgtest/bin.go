package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// found is the outcome of the search for the binaries.
type found struct {
	dir string // the directory holding them; "" if none
	why string // if none, what was looked at and why it did not fit
}

// search looks for the binaries once per process.
var search = sync.OnceValue(func() found {
	if dir := os.Getenv(binEnv); dir != "" {
		if err := checkBin(dir); err != nil {
			return found{why: fmt.Sprintf("%s=%s: %v", binEnv, dir, err)}
		}
		return found{dir: dir}
	}
	var rejected []string
	for _, dir := range candidates() {
		err := checkBin(dir)
		if err == nil {
			return found{dir: dir}
		}
		if !errors.Is(err, fs.ErrNotExist) {
			rejected = append(rejected, fmt.Sprintf("%s: %v", dir, err))
		}
	}
	if len(rejected) == 0 {
		return found{why: "no initdb and postgres on $PATH, in /usr/lib/postgresql/*/bin or in the package postgresql-15"}
	}
	return found{why: strings.Join(rejected, "; ")}
})

// Available reports the directory holding the PostgreSQL 15 binaries that
// Start and Shared use (see the package documentation for where it looks),
// and whether there is one.
func Available() (binDir string, ok bool) {
	f := search()
	return f.dir, f.dir != ""
}

// candidates returns the directories that may hold the binaries, most
// likely first, each once.
func candidates() []string {
	dirs := []string{"/usr/lib/postgresql/15/bin"}
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r // Debian links /usr/bin's initdb (if any) into the versioned directory
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	if out, err := exec.Command("dpkg", "-L", "postgresql-15").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if filepath.Base(line) == "postgres" && filepath.Base(filepath.Dir(line)) == "bin" {
				dirs = append(dirs, filepath.Dir(line))
			}
		}
	}
	glob, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	dirs = append(dirs, glob...)
	dirs = append(dirs,
		"/usr/pgsql-15/bin",                   // PGDG packages on RHEL and Fedora
		"/opt/homebrew/opt/postgresql@15/bin", // Homebrew on Apple silicon
		"/usr/local/opt/postgresql@15/bin")    // Homebrew on Intel
	seen := make(map[string]bool)
	uniq := dirs[:0]
	for _, d := range dirs {
		if !seen[d] {
			seen[d] = true
			uniq = append(uniq, d)
		}
	}
	return uniq
}

var versionRE = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// checkBin returns nil if dir holds executable initdb and postgres of
// major version 15, and an error wrapping fs.ErrNotExist if it holds
// neither.
func checkBin(dir string) error {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file", name)
		}
	}
	out, err := exec.Command(filepath.Join(dir, "postgres"), "--version").Output()
	if err != nil {
		return fmt.Errorf("postgres --version: %w", err)
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return fmt.Errorf("postgres --version printed %q", bytes.TrimSpace(out))
	}
	if string(m[1]) != "15" {
		return fmt.Errorf("postgres is version %s, not 15", m[1])
	}
	return nil
}

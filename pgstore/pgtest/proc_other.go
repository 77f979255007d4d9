//go:build !linux

package pgtest

import (
	"os"
	"syscall"
)

// sysProcAttr returns the attributes of a server process: run as cred (as
// the test process's own user if nil). Outside Linux there is no parent-
// death signal: a test binary killed before its cleanup leaves its server
// running, to be stopped by hand (pg_ctl stop -D $TMPDIR/pgtest-*/data).
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}

// killTree sends SIGKILL to the postmaster only: outside Linux its children
// are not listed. They exit when they notice its death, and Restart waits
// for them.
func killTree(p *os.Process) error { return p.Kill() }

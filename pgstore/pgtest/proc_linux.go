//go:build linux

package pgtest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// sysProcAttr returns the attributes of a server process: run as cred (as
// the test process's own user if nil), and sent SIGKILL by the kernel if
// the test process dies first (PR_SET_PDEATHSIG), so that a test binary
// killed by a timeout or by hand leaves no server running. Go sets the
// signal after switching to cred, which would otherwise clear it.
//
// The kernel ties the signal to the thread that started the process, not
// to the process. Go's threads live as long as the process unless a
// goroutine exits while locked to its thread (runtime.LockOSThread); no
// caller here does that.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
}

// killTree sends SIGKILL to every child of the postmaster pid (backends,
// the checkpointer, the WAL writer, ...) and then to the postmaster, so
// that none of the server runs on: a crash of the whole server, as the
// machine's would be, rather than of the postmaster alone, whose orphaned
// backends go on (a CPU-bound query to its end) before they notice.
//
// The postmaster is stopped (SIGSTOP) first, and its children listed once
// it is: only the postmaster forks server processes, and a stopped one
// forks no more.
func killTree(p *os.Process) error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	// Wait until it is stopped: a fork under way when SIGSTOP arrived
	// completes first.
	deadline := time.Now().Add(5 * time.Second)
	for {
		state, _, err := procStat(p.Pid)
		if err != nil {
			return err
		}
		if state == 'T' {
			break
		}
		if state == 'Z' || state == 'X' {
			return nil // it exited on its own; its children are no longer its
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postmaster %d not stopped after SIGSTOP (state %c)", p.Pid, state)
		}
		time.Sleep(time.Millisecond)
	}
	kids, err := children(p.Pid)
	if err != nil {
		return err
	}
	for _, kid := range kids {
		_ = syscall.Kill(kid, syscall.SIGKILL) // one that exited meanwhile is a zombie, not another's pid
	}
	return p.Kill()
}

// children returns the pids of pid's children, from /proc.
func children(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var kids []int
	for _, e := range entries {
		kid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue // not a process
		}
		_, ppid, err := procStat(kid)
		if err == nil && ppid == pid {
			kids = append(kids, kid)
		}
	}
	return kids, nil
}

// procStat returns the state and parent of process pid, from
// /proc/PID/stat: "PID (COMM) STATE PPID ...", where COMM may hold spaces
// and parentheses.
func procStat(pid int) (state byte, ppid int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 2 || len(fields[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	ppid, err = strconv.Atoi(string(fields[1]))
	return fields[0][0], ppid, err
}

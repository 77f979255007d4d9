//go:build linux

package engine

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// lowerThreadPriority keeps the calling goroutine on its OS thread for the
// rest of the goroutine's life and sets that thread's nice value to nice.
// Linux keeps a nice value per thread. The goroutine never unlocks the
// thread, so Go ends the thread when the goroutine exits, and no other
// goroutine ever runs on it: the lowered priority cannot leak into
// request work. Threads that Go starts while this one is locked are
// started by its template thread, so they do not inherit the nice value
// either (runtime/proc.go, newm).
func lowerThreadPriority(nice int) error {
	runtime.LockOSThread()
	return unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), nice)
}

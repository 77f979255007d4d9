//go:build linux

package lowprio

import (
	"runtime"

	"golang.org/x/sys/unix"
)

const supported = true

// lowerThread keeps the calling goroutine on its OS thread for the rest of
// the goroutine's life and sets that thread's nice value. Linux keeps a
// nice value per thread. The goroutine never unlocks the thread, so Go
// ends the thread when the goroutine exits and no other goroutine ever
// runs on it (runtime.LockOSThread's contract).
func lowerThread(nice int) error {
	runtime.LockOSThread()
	return unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), nice)
}

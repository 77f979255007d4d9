//go:build unix

package bench

import (
	"syscall"
	"time"
)

// CPUTime returns the CPU time (user + system) this process has used, or
// -1 if it cannot tell.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

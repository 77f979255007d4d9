//go:build !linux

package engine

import "errors"

// lowerThreadPriority is Linux only: elsewhere a thread's priority is the
// process's, so Options.BackgroundNice has no effect.
func lowerThreadPriority(int) error {
	return errors.New("a nice value per thread is Linux only")
}

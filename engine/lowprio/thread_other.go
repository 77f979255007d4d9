//go:build !linux

package lowprio

import "errors"

const supported = false

// lowerThread fails where a thread has no priority of its own.
func lowerThread(int) error { return errors.New("a nice value per thread is Linux only") }

package httpidem

// SetTestHookWaiting installs f to run when a request starts waiting for
// an in-process holder; it returns a function restoring the previous hook.
func SetTestHookWaiting(f func()) (restore func()) {
	prev := testHookWaiting
	testHookWaiting = f
	return func() { testHookWaiting = prev }
}

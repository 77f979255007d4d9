package httpidem_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves a goroutine behind: the
// heartbeats run from timer callbacks, and none may outlive its request.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

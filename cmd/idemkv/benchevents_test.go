package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBenchEventsUsage checks that bad flags of bench events are usage
// errors (exit status 2, the reason and the usage on stderr, nothing run)
// and that help lists its flags. The measurement itself is tested in
// bench/events.
func TestBenchEventsUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--profile", "slow"}, "want quick or full"},
		{[]string{"--concurrency", "1,0"}, `bad concurrency "0"`},
		{[]string{"--rates", "5000,0"}, `bad rate "0"`},
		{[]string{"--rates", "fast"}, `bad rate "fast"`},
		{[]string{"--duration", "soon"}, `bad duration "soon"`},
		{[]string{"--load-duration", "-1s"}, `bad duration "-1s"`},
		{[]string{"--rounds", "-1"}, "negative count"},
		{[]string{"--backlog", "-5"}, "negative count"},
		{[]string{"--background-nice", "20"}, "--background-nice 20 outside 0..19"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"bench", "events"}, tc.args...), &stdout, &stderr)
		require.Equal(t, exitUsage, code, "%v", tc.args)
		require.Contains(t, stderr.String(), tc.want, "%v", tc.args)
		require.Contains(t, stderr.String(), "Usage: idemkv bench events")
		require.Empty(t, stdout.String())
	}
	var stdout bytes.Buffer
	require.Equal(t, exitOK, run(context.Background(), []string{"help", "bench", "events"}, &stdout, &bytes.Buffer{}))
	for _, flag := range []string{"--profile", "--concurrency", "--rounds", "--no-relay", "--rates", "--load-duration", "--backlog", "--json"} {
		require.Contains(t, stdout.String(), flag[1:])
	}
}

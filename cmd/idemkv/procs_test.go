package main

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/require"
)

// The service's defaults: one processor more than Go's own and nice 19,
// unless the environment sets GOMAXPROCS, which then wins; off, both 0.
func TestBackgroundFlagsDefaults(t *testing.T) {
	parse := func(on bool, args ...string) backgroundFlags {
		var b backgroundFlags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		b.register(fs, on)
		require.NoError(t, fs.Parse(args))
		require.NoError(t, b.validate())
		return b
	}
	t.Setenv("GOMAXPROCS", "")
	require.Equal(t, backgroundFlags{procs: goProcs + 1, nice: 19}, parse(true))
	require.Equal(t, backgroundFlags{}, parse(false))
	require.Equal(t, backgroundFlags{procs: 2, nice: 0}, parse(true, "--gomaxprocs", "2", "--background-nice", "0"))
	t.Setenv("GOMAXPROCS", "2")
	require.Equal(t, backgroundFlags{procs: 0, nice: 19}, parse(true))

	o, p, err := backgroundFlags{nice: 5}.apply(nil)
	require.NoError(t, err)
	require.NotNil(t, p)
	require.NotNil(t, o.ConfigurePebble, "a nice value configures Pebble's compaction scheduler")
	o, p, err = backgroundFlags{}.apply(nil)
	require.NoError(t, err)
	require.Nil(t, p)
	require.Nil(t, o.ConfigurePebble)
}

package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/engine"
)

func TestFitMemory(t *testing.T) {
	var o engine.Options
	require.Equal(t, 5000, fitMemory(&o, 0, 5000))
	require.Zero(t, o.ReplayCacheSize, "no limit: the defaults")

	require.Equal(t, 1024, fitMemory(&o, 256<<20, 5000), "a quarter of the limit at 64 KiB a connection")
	require.EqualValues(t, 32<<20, o.ReplayCacheSize)
	require.EqualValues(t, 32<<20, o.CacheSize)

	o = engine.Options{}
	require.Equal(t, 5000, fitMemory(&o, 8<<30, 5000), "never above the file budget's cap")
	def := (&engine.Options{}).EnsureDefaults()
	require.Equal(t, def.ReplayCacheSize, o.ReplayCacheSize, "never above the default")
	require.Equal(t, def.CacheSize, o.CacheSize)

	o = engine.Options{CacheSize: 1 << 30}
	fitMemory(&o, 256<<20, 5000)
	require.EqualValues(t, 1<<30, o.CacheSize, "an option set is kept")
}

// Under a low file limit the memory share never raises the cap above it.
func TestFitMemoryKeepsTheFileCap(t *testing.T) {
	var o engine.Options
	require.Equal(t, 10, fitMemory(&o, 1<<30, 10))
	require.Equal(t, 16, fitMemory(&o, 1<<20, 5000), "at least 16")
}

package main

import (
	"fmt"
	"math"
	"runtime/debug"

	"github.com/idemkv/idemkv/engine"
)

// memoryLimit returns the Go memory limit (GOMEMLIMIT, or one the program
// set), 0 if there is none.
func memoryLimit() int64 {
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		return l
	}
	return 0
}

// connMemory is what one connection may cost at most: its goroutine,
// buffers, and a request's headers at the header limit.
const connMemory = 64 << 10

// fitMemory sizes the store's caches and the connection cap to a memory
// limit, if there is one: an eighth of it each for the replay cache and
// Pebble's block cache, no more than their defaults, and a quarter for
// connections at connMemory each, so that the live heap stays well under
// the limit and the collector does not run back to back near it. Options
// set already are kept. It returns the connection cap: at most maxConns,
// and at least 16 unless maxConns is lower.
// docs/operations.md, "Memory", has the whole budget.
func fitMemory(o *engine.Options, limit int64, maxConns int) int {
	if limit <= 0 {
		return maxConns
	}
	def := (&engine.Options{}).EnsureDefaults()
	share := limit / 8
	if o.ReplayCacheSize == 0 {
		o.ReplayCacheSize = max(1<<20, min(share, def.ReplayCacheSize))
	}
	if o.CacheSize == 0 {
		o.CacheSize = max(8<<20, min(share, def.CacheSize))
	}
	return int(min(int64(maxConns), max(16, limit/4/connMemory)))
}

func limitNote(limit int64) string {
	if limit <= 0 {
		return ""
	}
	return fmt.Sprintf(", GOMEMLIMIT %d MiB", limit>>20)
}

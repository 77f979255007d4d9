//go:build race

package storetest

// raceEnabled says whether the race detector is on: Linearizable then runs
// fewer rounds (see its doc).
const raceEnabled = true

//go:build race

package main

// raceEnabled says whether the race detector is on: its shadow memory makes
// resident-memory figures meaningless.
const raceEnabled = true

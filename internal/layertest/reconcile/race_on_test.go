//go:build race

package reconcile_test

// raceEnabled says whether the race detector is on: the model test then
// plays one run in three.
const raceEnabled = true

//go:build race

package saga_test

// raceEnabled says whether the race detector is on: the model test then
// plays one run in three.
const raceEnabled = true

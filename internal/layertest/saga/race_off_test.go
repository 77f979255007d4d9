//go:build !race

package saga_test

const raceEnabled = false

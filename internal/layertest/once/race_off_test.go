//go:build !race

package once_test

const raceEnabled = false

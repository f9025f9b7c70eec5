//go:build !race

package promobserver_test

// raceEnabled is true when the race detector is on, which allocates where
// ordinary builds do not: allocation counts are then meaningless.
const raceEnabled = false

//go:build !race

// Package race tells tests whether the race detector is on: it allocates
// where ordinary builds do not, so allocation counts are then meaningless.
package race

// Enabled is true when the race detector is on.
const Enabled = false

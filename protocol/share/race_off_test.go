//go:build !race

package share

// raceEnabled: the race detector is on (it allocates).
const raceEnabled = false

//go:build !race

package soft

func raceRelease() {}
func raceAcquire() {}

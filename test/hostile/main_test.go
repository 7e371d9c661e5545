package hostile

import (
	"testing"

	"github.com/lwiofs/lwiofs/test/hostile/rig"
)

// figures collects the numbers the tests measured; TestMain prints them
// after the run, so one summary holds them all (figures.Add also logs
// each line in its test).
var figures rig.Figures

func TestMain(m *testing.M) { figures.Main(m, "hostile-client figures:") }

package hostile

import (
	"testing"

	"github.com/lwiofs/lwiofs/test/hostile/rig"
)

// figures collects the numbers the tests measured; TestMain prints them
// after the run, so one summary holds them all.
var figures rig.Figures

// figure records one line of the summary and logs it in the test.
func figure(t testing.TB, format string, args ...any) {
	t.Helper()
	figures.Add(t, format, args...)
}

func TestMain(m *testing.M) { figures.Main(m, "hostile-client figures:") }

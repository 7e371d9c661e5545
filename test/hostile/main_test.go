package hostile

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// figures collects the numbers the tests measured; TestMain prints them
// after the run, so one summary holds them all.
var figures struct {
	sync.Mutex
	lines []string
}

// figure records one line of the summary and logs it in the test.
func figure(t testing.TB, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	figures.Lock()
	figures.lines = append(figures.lines, t.Name()+": "+line)
	figures.Unlock()
}

func TestMain(m *testing.M) {
	code := m.Run()
	figures.Lock()
	if len(figures.lines) > 0 {
		fmt.Println("hostile-client figures:")
		for _, l := range figures.lines {
			fmt.Println("  " + l)
		}
	}
	figures.Unlock()
	os.Exit(code)
}

package rig

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// Figures collects the numbers a test package measures, so that they are
// printed as one summary after the run (go test shows a passing package's
// t.Log output only with -v; the summary is printed either way).
type Figures struct {
	mu    sync.Mutex
	lines []string
}

// Add records one line of the summary and logs it in the test.
func (f *Figures) Add(t testing.TB, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	f.mu.Lock()
	f.lines = append(f.lines, t.Name()+": "+line)
	f.mu.Unlock()
}

// Main runs the package's tests, prints the summary under title, and exits
// with the tests' status: the body of a TestMain.
func (f *Figures) Main(m *testing.M, title string) {
	code := m.Run()
	f.mu.Lock()
	if len(f.lines) > 0 {
		fmt.Println(title)
		for _, l := range f.lines {
			fmt.Println("  " + l)
		}
	}
	f.mu.Unlock()
	os.Exit(code)
}

package share

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

// TestAppendConcurrent: appends through two handles (two clients' opens)
// and a local O_APPEND writer at once all land whole, none overwrites
// another, and the end offset each Append reports is exactly where its own
// bytes end — however many appended at the same time.
func TestAppendConcurrent(t *testing.T) {
	e := newEnv(t, false)
	e.writeFile(t, "log", "")
	var handles []*OpenFile
	for range 2 {
		f, _, err := e.tr.Open("log", os.O_WRONLY, 0) // not O_APPEND: Append asks per write
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		handles = append(handles, f)
	}
	local, err := os.OpenFile(filepath.Join(e.share, "log"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()

	const per = 200
	type landed struct {
		line string
		end  int64
	}
	var mu sync.Mutex
	var got []landed
	var wg sync.WaitGroup
	for i, f := range handles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range per {
				line := fmt.Sprintf("handle %d line %03d\n", i, j)
				n, end, err := f.Append([]byte(line))
				if err != nil || n != len(line) {
					t.Errorf("Append: %d %v", n, err)
					return
				}
				mu.Lock()
				got = append(got, landed{line, end})
				mu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for j := range per {
			if _, err := fmt.Fprintf(local, "local line %03d\n", j); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()

	data, err := os.ReadFile(filepath.Join(e.share, "log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 3*per {
		t.Fatalf("%d lines, want %d", len(lines), 3*per)
	}
	sort.Strings(lines)
	for i := 1; i < len(lines); i++ {
		if lines[i] == lines[i-1] {
			t.Fatalf("line %q twice", lines[i])
		}
	}
	for _, l := range got {
		start := l.end - int64(len(l.line))
		if start < 0 || l.end > int64(len(data)) || string(data[start:l.end]) != l.line {
			t.Fatalf("Append of %q reported end %d, where the file has %q", l.line, l.end, data[max(start, 0):min(l.end, int64(len(data)))])
		}
	}
}

// TestAppendRules: a read-only open refuses to append; an empty append
// reports the size; a positional write still writes where it is told.
func TestAppendRules(t *testing.T) {
	e := newEnv(t, false)
	e.writeFile(t, "f", "0123456789")
	ro := e.open(t, "f", os.O_RDONLY)
	if _, _, err := ro.Append([]byte("x")); err == nil {
		t.Error("Append through a read-only open succeeded")
	}
	f := e.open(t, "f", os.O_RDWR)
	if n, end, err := f.Append(nil); n != 0 || end != 10 || err != nil {
		t.Errorf("empty Append = %d %d %v, want 0 10 nil", n, end, err)
	}
	if _, end, err := f.Append([]byte("ab")); end != 12 || err != nil {
		t.Errorf("Append = %d %v, want end 12", end, err)
	}
	if _, err := f.WriteAt([]byte("Z"), 0); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.share, "f")); !bytes.Equal(b, []byte("Z123456789ab")) {
		t.Errorf("file = %q: a positional write after an append must not append", b)
	}
}

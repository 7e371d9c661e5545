package fs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func appendTo(t *testing.T, p string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	if n, err := f.Write(data); err != nil || n != len(data) {
		t.Errorf("append %d bytes: %d %v", len(data), n, err)
	}
}

// TestAppendTwoMounts: `echo line >> log` alternating between two mounts
// loses nothing, and each mount's stat and read of the file afterwards are
// the server's, though each had a stale idea of its size.
func TestAppendTwoMounts(t *testing.T) {
	share, a, b, _, _ := twoMounts(t)
	var want strings.Builder
	for i := range 40 {
		line := fmt.Sprintf("line %02d\n", i)
		appendTo(t, filepath.Join([]string{a, b}[i%2], "log"), []byte(line))
		want.WriteString(line)
	}
	if got, _ := os.ReadFile(filepath.Join(share, "log")); string(got) != want.String() {
		t.Fatalf("log on the server:\n%s\nwant\n%s", got, want.String())
	}
	for _, m := range []string{a, b} {
		st, err := os.Stat(filepath.Join(m, "log"))
		if err != nil || st.Size() != int64(want.Len()) {
			t.Errorf("stat on %s: %d %v, want %d", m, st.Size(), err, want.Len())
		}
		if got, _ := os.ReadFile(filepath.Join(m, "log")); string(got) != want.String() {
			t.Errorf("read on %s differs from the server's log", m)
		}
	}
	// A file opened for appending is direct I/O, and can still be mapped
	// shared (by a process of its own: mapper_test.go).
	m := startMapper(t, os.O_RDWR|os.O_APPEND, []string{a}, filepath.Join(a, "log"))
	var got []byte
	for i := range 7 {
		b, err := strconv.Atoi(m.do("get 0 %d", i))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, byte(b))
	}
	if string(got) != "line 00" {
		t.Errorf("mapping reads %q", got)
	}
}

// TestAppendConcurrent: two programs appending 300 lines each at once
// through two mounts, and one on the server host itself: every line
// arrives, whole. Lines go over the session channel (small) and records
// past the inline size over LWIO.
func TestAppendConcurrent(t *testing.T) {
	share, a, b, _, _ := twoMounts(t)
	big := func(who string, i int) []byte {
		// Past appendInlineMax: an LWIO WRITE at FILE_WRITE_TO_END_OF_FILE.
		rec := bytes.Repeat([]byte(fmt.Sprintf("%s big %03d|", who, i)), appendInlineMax/12)
		return append(rec, '\n')
	}
	var group sync.WaitGroup
	for _, w := range []struct{ who, dir string }{{"A", a}, {"B", b}, {"L", share}} {
		group.Add(1)
		go func() {
			defer group.Done()
			f, err := os.OpenFile(filepath.Join(w.dir, "log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			for i := range 300 {
				line := []byte(fmt.Sprintf("%s line %03d\n", w.who, i))
				if i%50 == 0 {
					line = big(w.who, i)
				}
				if _, err := f.Write(line); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	group.Wait()
	data, err := os.ReadFile(filepath.Join(share, "log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 900 {
		t.Fatalf("%d lines, want 900", len(lines))
	}
	var want []string
	for _, who := range []string{"A", "B", "L"} {
		for i := range 300 {
			l := fmt.Sprintf("%s line %03d", who, i)
			if i%50 == 0 {
				l = strings.TrimSuffix(string(big(who, i)), "\n")
			}
			want = append(want, l)
		}
	}
	sort.Strings(lines)
	sort.Strings(want)
	for i := range want {
		if lines[i] != want[i] {
			t.Fatalf("line %d: %.40q, want %.40q (a line lost, torn or doubled)", i, lines[i], want[i])
		}
	}
}

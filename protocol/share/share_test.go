package share

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// env is a share of dir/share connected for user "alice"; dir/outside is a
// directory next to it that nothing must ever reach.
type env struct {
	dir     string
	share   string
	outside string
	tr      *Tree
}

func newEnv(t *testing.T, walk bool) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{dir: dir, share: filepath.Join(dir, "share"), outside: filepath.Join(dir, "outside")}
	for _, d := range []string{e.share, e.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(e.outside, "secret"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.tr = connect(t, Config{Name: "data", Path: e.share}, walk)
	return e
}

// connect opens c and connects alice to it; the share closes with the test.
func connect(t *testing.T, c Config, walk bool) *Tree {
	t.Helper()
	c.AllowRoot = true
	sh, err := Open(c, walk)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	if want := map[bool]string{false: "openat2", true: "walk"}[walk]; sh.Resolver() != want {
		t.Fatalf("resolver %s, want %s", sh.Resolver(), want)
	}
	tr, err := sh.Connect(serverIdentity("alice"))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// serverIdentity is user acting as the server's own account: these tests
// are about confinement and the share's rules, not identity
// (identity_test.go), so a test share run by root allows root.
func serverIdentity(user string) Identity {
	return Identity{User: user, Account: NewAccounts(AccountsConfig{}).Self()}
}

// resolvers runs a test with openat2 and with the walking fallback.
func resolvers(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, walk := range []bool{false, true} {
		t.Run(map[bool]string{false: "openat2", true: "walk"}[walk], func(t *testing.T) {
			fn(t, newEnv(t, walk))
		})
	}
}

func (e *env) writeFile(t *testing.T, rel, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(e.share, rel), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readDir lists a whole directory in one page.
func readDir(tr *Tree, p string) ([]DirEntry, error) {
	ents, _, err := tr.ReadDir(p, "", 1<<30, func(string) int { return 1 })
	return ents, err
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if got := ntstatus.ToErrno(err); got != want {
		t.Errorf("%s: error %v → %v, want %v", what, err, got, want)
	}
}

// TestErrorsAreStatuses: what the share returns is what a client will see,
// an NTSTATUS, whichever channel carries it; ReadAt's end of file is io.EOF.
func TestErrorsAreStatuses(t *testing.T) {
	e := newEnv(t, false)
	e.writeFile(t, "f", "abc")
	var st protocol.Status
	if _, err := e.tr.GetAttr("missing"); !errors.As(err, &st) || st != protocol.StatusObjectNameNotFound {
		t.Errorf("GetAttr missing: %v, want OBJECT_NAME_NOT_FOUND", err)
	}
	if err := e.tr.Rmdir("f"); !errors.As(err, &st) || st != protocol.StatusNotADirectory {
		t.Errorf("Rmdir of a file: %v, want NOT_A_DIRECTORY", err)
	}
	f, _, err := e.tr.Open("f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if n, err := f.ReadAt(buf, 0); n != 3 || err != io.EOF {
		t.Errorf("short ReadAt: %d %v, want 3 io.EOF", n, err)
	}
	if n, err := f.ReadAt(buf, 100); n != 0 || err != io.EOF {
		t.Errorf("ReadAt past the end: %d %v", n, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(buf, 0); err != protocol.StatusFileClosed {
		t.Errorf("ReadAt after Close: %v, want FILE_CLOSED", err)
	}
	if _, err := f.WriteAt(buf, 0); err != protocol.StatusFileClosed {
		t.Errorf("WriteAt after Close: %v, want FILE_CLOSED", err)
	}
}

// TestReadOnlyShare: on a read-only share every change is refused with
// ACCESS_DENIED (writable), through a Tree and through a File, before it
// touches the disk; reading works.
func TestReadOnlyShare(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "file"), []byte("read only"), 0o644); err != nil {
		t.Fatal(err)
	}
	tr := connect(t, Config{Name: "ro", Path: dir, ReadOnly: true}, false)
	denied := func(what string, err error) {
		t.Helper()
		if err != protocol.StatusAccessDenied {
			t.Errorf("%s on a read-only share: %v, want ACCESS_DENIED", what, err)
		}
	}
	_, _, err := tr.Open("file", os.O_WRONLY, 0)
	denied("Open O_WRONLY", err)
	_, _, err = tr.Open("new", os.O_RDONLY|os.O_CREATE, 0o644)
	denied("Open O_CREAT", err)
	_, _, err = tr.Open("file", os.O_RDONLY|os.O_TRUNC, 0)
	denied("Open O_TRUNC", err)
	_, err = tr.Mkdir("d", 0o755)
	denied("Mkdir", err)
	denied("Rmdir", tr.Rmdir("missing"))
	denied("Unlink", tr.Unlink("file"))
	denied("Rename", tr.Rename("file", "g", 0))
	_, err = tr.SetAttr("file", SetAttrIn{Valid: SetMode, Mode: 0o777})
	denied("SetAttr", err)
	denied("SetXattr", tr.SetXattr("file", "user.x", []byte("1"), 0))
	denied("RemoveXattr", tr.RemoveXattr("file", "user.x"))
	_, err = tr.Symlink("file", "l")
	denied("Symlink", err)
	_, err = tr.Link("file", "l")
	denied("Link", err)

	f, _, err := tr.Open("file", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 100)
	if n, _ := f.ReadAt(buf, 0); string(buf[:n]) != "read only" {
		t.Errorf("read %q", buf[:n])
	}
	var file File = f // as the LWIO engine holds it
	_, err = file.WriteAt([]byte("x"), 0)
	denied("WriteAt", err)
	_, err = f.SetAttr(SetAttrIn{Valid: SetSize})
	denied("SetAttr by handle", err)
	if b, _ := os.ReadFile(filepath.Join(dir, "file")); string(b) != "read only" {
		t.Errorf("read-only file changed: %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("read-only share now holds %d entries", len(ents))
	}
}

// TestReadOnlyOpen: a file opened O_RDONLY on a writable share refuses
// writes too.
func TestReadOnlyOpen(t *testing.T) {
	e := newEnv(t, false)
	e.writeFile(t, "f", "x")
	f := e.open(t, "f", os.O_RDONLY)
	if _, err := f.WriteAt([]byte("y"), 0); err != protocol.StatusAccessDenied {
		t.Errorf("WriteAt on an O_RDONLY open: %v", err)
	}
}

func TestConnectUsers(t *testing.T) {
	sh, err := Open(Config{Name: "bobs", Path: t.TempDir(), Users: []string{"Bob"}, AllowRoot: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	if _, err := sh.Connect(serverIdentity("alice")); err != protocol.StatusAccessDenied {
		t.Errorf("alice on bob's share: %v", err)
	}
	if tr, err := sh.Connect(serverIdentity("bob")); err != nil || tr.Share() != sh {
		t.Errorf("bob on bob's share: %v", err)
	}
	for _, name := range []string{"", `a\b`, "a/b"} {
		if _, err := Open(Config{Name: name, Path: t.TempDir()}, false); err == nil {
			t.Errorf("share name %q accepted", name)
		}
	}
	if _, err := Open(Config{Name: "x", Path: filepath.Join(t.TempDir(), "missing")}, false); err == nil {
		t.Error("missing share directory accepted")
	}
}

func TestReadDirPages(t *testing.T) {
	e := newEnv(t, false)
	for i := range 10 {
		e.writeFile(t, fmt.Sprintf("f%d", i), "")
	}
	cost := func(string) int { return 10 }
	ents, more, err := e.tr.ReadDir("", "", 35, cost)
	if err != nil || !more || len(ents) != 3 || ents[0].Name != "f0" || ents[2].Name != "f2" {
		t.Fatalf("first page: %v more %v, %v", ents, more, err)
	}
	ents, more, err = e.tr.ReadDir("", "f2", 1000, cost)
	if err != nil || more || len(ents) != 7 || ents[0].Name != "f3" {
		t.Fatalf("rest: %d entries more %v, %v", len(ents), more, err)
	}
	// A budget smaller than one entry still makes progress.
	if ents, more, _ := e.tr.ReadDir("", "", 1, cost); len(ents) != 1 || !more {
		t.Errorf("tiny budget: %d entries more %v", len(ents), more)
	}
}

func TestDirListingCache(t *testing.T) {
	dir := t.TempDir()
	for i := range 5 {
		os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), nil, 0o644)
	}
	time.Sleep(racyWindow + 50*time.Millisecond)
	var l dirListing
	list := func(after string) []string {
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		names, err := l.list("", after, f)
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	first := list("")
	if again := list("1"); &again[0] != &first[0] {
		t.Error("continuation of an unchanged directory re-read it")
	}
	if fresh := list(""); &fresh[0] == &first[0] {
		t.Error("a new listing (after empty) used the cache")
	}
	cached := list("1")
	os.WriteFile(filepath.Join(dir, "9"), nil, 0o644)
	if changed := list("1"); &changed[0] == &cached[0] || len(changed) != 6 {
		t.Errorf("changed directory served from the cache: %v", changed)
	}
	// Right after a change the listing is racy and never reused.
	racy := list("")
	if again := list("1"); &again[0] == &racy[0] {
		t.Error("racy listing reused")
	}
}

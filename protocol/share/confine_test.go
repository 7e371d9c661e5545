package share

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// TestEscapes tries every way out of the share we could think of. Each
// must fail, and dir/outside must be left exactly as it was.
func TestEscapes(t *testing.T) {
	resolvers(t, func(t *testing.T, e *env) {
		sym := func(target, name string) {
			if err := os.Symlink(target, filepath.Join(e.share, name)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Mkdir(filepath.Join(e.share, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		e.writeFile(t, "file", "inside")
		sym("/etc/passwd", "abs")                        // absolute symlink to a file outside
		sym(e.outside, "absdir")                         // absolute symlink to a directory outside
		sym("../outside", "reldir")                      // relative symlink out
		sym("l2", "l1")                                  // a chain: l1 → l2 → sub/up → ../..
		sym("sub/up/outside", "l2")                      //
		sym("../..", "sub/up")                           //
		sym("../outside/secret", "relfile")              // relative symlink to a file outside
		sym("sub/../../outside/secret", "dotdotinside")  // ".." after a real directory
		sym(filepath.Join(e.share, "file"), "absinside") // absolute even if it names the share

		tr := e.tr
		refused := func(what string, err error) {
			t.Helper()
			switch ntstatus.ToErrno(err) {
			case syscall.EACCES, syscall.ELOOP:
			default:
				t.Errorf("%s: %v, want refused (EACCES or ELOOP)", what, err)
			}
		}
		open := func(p string, flags int) error {
			f, _, err := tr.Open(p, flags, 0o644)
			if err == nil {
				f.Close()
			}
			return err
		}

		// ".." and absolute paths.
		for _, p := range []string{"..", "../outside/secret", "sub/../../outside/secret", "/etc/passwd", "sub/..", "a\x00b"} {
			_, err := tr.GetAttr(p)
			refused("GetAttr "+p, err)
			refused("Open "+p, open(p, os.O_RDONLY))
		}
		// Following symlinks that lead out.
		for _, p := range []string{"abs", "absdir/secret", "reldir/secret", "l1/secret", "sub/up/outside/secret",
			"relfile", "dotdotinside", "absinside"} {
			refused("Open "+p, open(p, os.O_RDONLY))
			refused("Open O_RDWR "+p, open(p, os.O_RDWR))
			refused("Open O_CREAT|O_TRUNC "+p, open(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC))
			_, err := tr.GetAttr(p + "/x")
			refused("GetAttr through "+p, err)
		}
		for _, p := range []string{"absdir", "reldir", "l1", "sub/up"} {
			_, err := readDir(tr, p)
			refused("ReadDir "+p, err)
			_, err = tr.Mkdir(p+"/new", 0o755)
			refused("Mkdir in "+p, err)
			refused("Open O_CREAT in "+p, open(p+"/new", os.O_WRONLY|os.O_CREATE))
			_, err = tr.Symlink("x", p+"/newlink")
			refused("Symlink in "+p, err)
			refused("Unlink through "+p, tr.Unlink(p+"/secret"))
			refused("Rename out through "+p, tr.Rename("file", p+"/stolen", 0))
			refused("Rename in through "+p, tr.Rename(p+"/secret", "got", 0))
			_, err = tr.Link(p+"/secret", "hard")
			refused("Link from "+p, err)
			_, err = tr.Link("file", p+"/hard")
			refused("Link into "+p, err)
			refused("SetXattr through "+p, tr.SetXattr(p+"/secret", "user.x", []byte("1"), 0))
			_, err = tr.SetAttr(p+"/secret", SetAttrIn{Valid: SetMode, Mode: 0o777})
			refused("SetAttr through "+p, err)
		}
		// Renaming onto and out with ".." names.
		refused("Rename ../", tr.Rename("file", "../stolen", 0))
		refused("Rename symlink out", tr.Rename("abs", "../abs", 0))
		// A final symlink is acted on itself, never followed out.
		if a, err := tr.GetAttr("relfile"); err != nil || a.Mode&unix.S_IFMT != unix.S_IFLNK {
			t.Errorf("GetAttr of a symlink: %v mode %o", err, a.Mode)
		}
		if _, err := tr.SetAttr("relfile", SetAttrIn{Valid: SetMode, Mode: 0o777}); ntstatus.ToErrno(err) != syscall.EOPNOTSUPP {
			t.Errorf("chmod of a symlink: %v", err)
		}
		tr.SetAttr("relfile", SetAttrIn{Valid: SetSize, Size: 0})
		tr.SetAttr("relfile", SetAttrIn{Valid: SetUid | SetGid, Uid: 4242, Gid: 4242})
		tr.SetXattr("relfile", "user.x", []byte("1"), 0)
		tr.SetXattr("relfile", "trusted.x", []byte("1"), 0)
		// Hard-linking a symlink links the symlink, which still resolves
		// confined.
		if _, err := tr.Link("relfile", "hardlink"); err != nil {
			t.Errorf("Link of a symlink: %v", err)
		}
		refused("Open a hard link of an escaping symlink", open("hardlink", os.O_RDONLY))
		// Unlinking a symlink removes it, not its target.
		if err := tr.Unlink("relfile"); err != nil {
			t.Errorf("Unlink of a symlink: %v", err)
		}
		if err := tr.Rename("abs", "abs2", 0); err != nil {
			t.Errorf("Rename of a symlink inside: %v", err)
		}
		// A symlink loop ends.
		sym("loop1", "loop2")
		sym("loop2", "loop1")
		err := open("loop1", os.O_RDONLY)
		wantErrno(t, "Open a symlink loop", err, syscall.ELOOP)

		// Nothing outside changed.
		b, err := os.ReadFile(filepath.Join(e.outside, "secret"))
		if err != nil || string(b) != "secret" {
			t.Errorf("outside/secret = %q, %v", b, err)
		}
		st, _ := os.Stat(filepath.Join(e.outside, "secret"))
		if st.Mode().Perm() != 0o644 {
			t.Errorf("outside/secret mode changed to %v", st.Mode())
		}
		var sys unix.Stat_t
		unix.Stat(filepath.Join(e.outside, "secret"), &sys)
		if sys.Uid == 4242 || sys.Nlink != 1 {
			t.Errorf("outside/secret owner %d nlink %d", sys.Uid, sys.Nlink)
		}
		if ents, _ := os.ReadDir(e.outside); len(ents) != 1 {
			t.Errorf("outside now holds %d entries", len(ents))
		}
		if sz, _ := unix.Getxattr(filepath.Join(e.outside, "secret"), "user.x", nil); sz > 0 {
			t.Error("xattr set outside")
		}
		if _, err := os.Lstat(filepath.Join(e.dir, "stolen")); err == nil {
			t.Error("a file was renamed out of the share")
		}
	})
}

// TestMagicLinks serves /proc/self, whose root, cwd and fd/N entries are
// magic links: none may be followed.
func TestMagicLinks(t *testing.T) {
	for _, walk := range []bool{false, true} {
		t.Run(map[bool]string{false: "openat2", true: "walk"}[walk], func(t *testing.T) {
			tr := connect(t, Config{Name: "proc", Path: "/proc/self", ReadOnly: true}, walk)
			for _, p := range []string{"root/etc/passwd", "cwd", "root", "exe", "fd/0", "fd/1", "task/" + strconv.Itoa(os.Getpid()) + "/root/etc"} {
				h, _, err := tr.Open(p, os.O_RDONLY, 0)
				if err == nil {
					h.Close()
					t.Errorf("Open %s through a magic link succeeded", p)
				}
			}
			if _, err := readDir(tr, "root"); err == nil {
				t.Error("ReadDir root (a magic link to /) succeeded")
			}
			if _, err := tr.GetAttr("root/etc"); err == nil {
				t.Error("GetAttr root/etc succeeded")
			}
			// The share itself still works.
			if _, err := tr.GetAttr("status"); err != nil {
				t.Errorf("GetAttr status: %v", err)
			}
		})
	}
}

func TestSplitPath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		err  error
	}{
		{"", "[]", nil},
		{"a", "[a]", nil},
		{"a/b/c", "[a b c]", nil},
		{"..", "", errEscape},
		{"a/../b", "", errEscape},
		{"/a", "", errEscape},
		{"a//b", "", unix.EINVAL},
		{"a/", "", unix.EINVAL},
		{".", "", unix.EINVAL},
		{"a\x00", "", errEscape},
		{strings.Repeat("x", 256), "", unix.ENAMETOOLONG},
		{strings.Repeat("x/", 2049), "", unix.ENAMETOOLONG},
	} {
		got, err := splitPath(tc.in)
		if err != tc.err || (err == nil && strings.Join(got, " ") != strings.Trim(tc.want, "[]")) {
			t.Errorf("splitPath(%q) = %q, %v; want %s, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// TestSymlinksInsideResolve: confinement must not break symlinks that stay
// inside the share, ".." inside targets included.
func TestSymlinksInsideResolve(t *testing.T) {
	resolvers(t, func(t *testing.T, e *env) {
		for _, d := range []string{"a", "a/b", "c"} {
			if err := os.Mkdir(filepath.Join(e.share, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		e.writeFile(t, "a/b/target", "found")
		for _, l := range [][2]string{
			{"b", "a/lb"},              // a/lb → a/b
			{"../a/b/target", "c/lt"},  // c/lt → a/b/target
			{"../../c/lt", "a/b/up"},   // a/b/up → c/lt → a/b/target
			{"a/lb/../../c", "toc"},    // toc → c (".." after a symlink to a directory)
			{"../a/lb/target", "c/l2"}, // through a symlinked directory
		} {
			if err := os.Symlink(l[0], filepath.Join(e.share, l[1])); err != nil {
				t.Fatal(err)
			}
		}
		tr := e.tr
		for _, p := range []string{"a/lb/target", "c/lt", "a/b/up", "toc/lt", "c/l2", "toc/l2"} {
			h, a, err := tr.Open(p, os.O_RDONLY, 0)
			if err != nil {
				t.Errorf("Open %s: %v", p, err)
				continue
			}
			buf := make([]byte, 16)
			n, _ := h.ReadAt(buf, 0)
			if string(buf[:n]) != "found" || a.Size != 5 {
				t.Errorf("Open %s read %q", p, buf[:n])
			}
			h.Close()
		}
		// Creating through a symlinked directory, and listing through one.
		h, _, err := tr.Open("a/lb/new", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			t.Fatalf("O_CREAT through a symlinked dir: %v", err)
		}
		h.Close()
		if _, err := os.Stat(filepath.Join(e.share, "a/b/new")); err != nil {
			t.Error(err)
		}
		ents, err := readDir(tr, "a/lb")
		if err != nil || len(ents) != 3 {
			t.Errorf("ReadDir a/lb: %v %d entries", err, len(ents))
		}
		if _, err := tr.Mkdir("toc/sub", 0o755); err != nil {
			t.Errorf("Mkdir through a symlink: %v", err)
		}
		// O_CREAT on a dangling in-share symlink creates its target, as
		// open(2) does; with O_EXCL it is EEXIST.
		os.Symlink("c/created", filepath.Join(e.share, "dangling"))
		_, _, err = tr.Open("dangling", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		wantErrno(t, "O_CREAT|O_EXCL on a symlink", err, syscall.EEXIST)
		if h, _, err := tr.Open("dangling", os.O_WRONLY|os.O_CREATE, 0o600); err != nil {
			t.Errorf("O_CREAT through a dangling symlink: %v", err)
		} else {
			h.Close()
		}
		// O_NOFOLLOW on a final symlink.
		_, _, err = tr.Open("c/lt", os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		wantErrno(t, "O_NOFOLLOW on a symlink", err, syscall.ELOOP)
	})
}

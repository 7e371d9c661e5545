package mountcmd

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lwiofs/lwiofs/fs"
)

func TestUserOptions(t *testing.T) {
	o, err := parseArgs([]string{"//h/s", "/mnt", "-o", "allow_other,uid=root,gid=0,idmap=none,default_permissions"})
	if err != nil {
		t.Fatal(err)
	}
	if uid, gid := o.localOwner(); uid != 0 || gid != 0 || !o.uidSet || !o.gidSet || o.idMapMode() != fs.IDMapNone ||
		!o.DefaultPermissions || !o.fsOptions().DefaultPermissions {
		t.Errorf("uid/gid/idmap/default_permissions: %+v", o.userOptions)
	}
	o, err = parseArgs([]string{"//h/s", "/mnt", "-o", "multiuser,credentials_dir=/etc/lwio/users,guest_credentials=/etc/lwio/guest,idle_timeout=2.5"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.MultiUser || o.CredentialsDir != "/etc/lwio/users" || o.GuestCredentials != "/etc/lwio/guest" ||
		o.IdleTimeout != 2.5 || o.idMapMode() != fs.IDMapNames || o.fsOptions().DefaultPermissions {
		t.Errorf("multiuser: %+v, idmap %v", o.userOptions, o.idMapMode())
	}
	if o, _ := parseArgs([]string{"//h/s", "/mnt"}); o.idMapMode() != fs.IDMapUser || o.MultiUser {
		t.Errorf("defaults: %+v", o.userOptions)
	}
	for _, bad := range []string{
		"credentials_dir=/x",           // needs multiuser
		"idle_timeout=5",               // needs multiuser
		"multiuser,uid=0",              // one owner for a per-user mount
		"idmap=file",                   // no such mode
		"multiuser,idle_timeout=0",     // must be > 0
		"multiuser=yes",                // a flag
		"default_permissions=1",        // a flag
		"uid=no-such-user-lwio",        // unknown name
		"gid=",                         // empty
		"multiuser,credentials_dir=",   // empty
		"multiuser,guest_credentials=", // empty
	} {
		if _, err := parseArgs([]string{"//h/s", "/mnt", "-o", bad}); err == nil {
			t.Errorf("-o %s accepted", bad)
		}
	}
}

// TestReadUserCredentials: a user's file is used only when it is a
// regular file, not a symlink, owned by that user and readable by no one
// else; each refusal says how to fix it.
func TestReadUserCredentials(t *testing.T) {
	uid := uint32(os.Getuid())
	name := localName(t, uid)
	dir := t.TempDir()
	p := filepath.Join(dir, name)
	write := func(perm os.FileMode) {
		t.Helper()
		os.Remove(p)
		if err := os.WriteFile(p, []byte("username=alice\npassword=pw\ndomain=D\n"), perm); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, perm)
	}
	if _, _, err := readUserCredentials(dir, uid); !errors.Is(err, fs.ErrNoCredentials) {
		t.Errorf("no file: %v, want ErrNoCredentials", err)
	}
	write(0o600)
	c, v1, err := readUserCredentials(dir, uid)
	if err != nil || c.username != "alice" || c.password != "pw" || c.domain != "D" || v1 == "" {
		t.Fatalf("0600 file: %+v %q %v", c, v1, err)
	}
	write(0o400)
	if _, v2, err := readUserCredentials(dir, uid); err != nil || v2 == v1 {
		t.Errorf("0400 file: %v; version %q → %q (a rewritten file is a new version)", err, v1, v2)
	}
	write(0o640)
	if _, _, err := readUserCredentials(dir, uid); err == nil || !strings.Contains(err.Error(), "chmod 600") || errors.Is(err, fs.ErrNoCredentials) {
		t.Errorf("0640 file: %v, want a refusal saying chmod 600", err)
	}
	write(0o600)
	other := filepath.Join(dir, "elsewhere")
	os.Rename(p, other)
	os.Symlink(other, p)
	if _, _, err := readUserCredentials(dir, uid); err == nil {
		t.Error("a symlink was followed")
	}
	os.Remove(p)
	os.Mkdir(p, 0o700)
	if _, _, err := readUserCredentials(dir, uid); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
	os.Remove(p)
	if os.Geteuid() == 0 {
		write(0o600)
		if err := os.Chown(p, 1, 1); err != nil {
			t.Fatal(err)
		}
		if _, _, err := readUserCredentials(dir, uid); err == nil || !strings.Contains(err.Error(), "chown "+name) {
			t.Errorf("a file owned by uid 1: %v, want a refusal saying chown", err)
		}
	}
}

// localName is uid's local user name.
func localName(t *testing.T, uid uint32) string {
	t.Helper()
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		t.Skipf("uid %d has no local name: %v", uid, err)
	}
	return u.Username
}

func TestUserCredsOrder(t *testing.T) {
	uid := uint32(os.Getuid())
	name := localName(t, uid)
	dir := t.TempDir()
	guest := filepath.Join(t.TempDir(), "guest")
	os.WriteFile(guest, []byte("username=guest\npassword=g\n"), 0o600)
	o := &Options{userOptions: userOptions{MultiUser: true, CredentialsDir: dir, GuestCredentials: guest}}
	u := newUserCreds(o, nil)
	if c, v, err := u.find(uid); err != nil || c.username != "guest" || v != "guest" {
		t.Errorf("nothing of its own: %+v %q %v, want the guest credentials", c, v, err)
	}
	os.WriteFile(filepath.Join(dir, name), []byte("username=mine\npassword=m\n"), 0o600)
	if c, _, err := u.find(uid); err != nil || c.username != "mine" {
		t.Errorf("with a file: %+v %v", c, err)
	}
	u.login(uid, credentials{username: "logged", password: "l"})
	c, v1, err := u.find(uid)
	if err != nil || c.username != "logged" {
		t.Errorf("after lwio login: %+v %v", c, err)
	}
	u.login(uid, credentials{username: "logged", password: "l2"})
	if _, v2, _ := u.find(uid); v2 == v1 {
		t.Errorf("a second login has the same version %q: a failed logon would not be retried", v1)
	}
	if !u.logout(uid) || u.logout(uid) {
		t.Error("logout")
	}
	if c, _, _ := u.find(uid); c.username != "mine" {
		t.Errorf("after logout: %+v", c)
	}
	o.GuestCredentials = ""
	os.Remove(filepath.Join(dir, name))
	if _, _, err := u.find(uid); !errors.Is(err, fs.ErrNoCredentials) {
		t.Errorf("nothing at all: %v", err)
	}
}

func TestLoginUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run("lwio", []string{"login"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage: lwio login") {
		t.Errorf("lwio login without a mount: %d %q", code, errb.String())
	}
	errb.Reset()
	if code := run("lwio", []string{"logout", "//nohost-lwio/none"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "no lwio mount of //nohost-lwio/none") {
		t.Errorf("lwio logout of nothing mounted: %d %q", code, errb.String())
	}
}

func TestLoginCredentials(t *testing.T) {
	c, err := loginCredentials("", `DOM\bob`, "pw", strings.NewReader(""), io.Discard)
	if err != nil || c.username != "bob" || c.domain != "DOM" || c.password != "pw" {
		t.Errorf("from the environment: %+v %v", c, err)
	}
	c, err = loginCredentials("", "bob", "", strings.NewReader("typed pw\n"), io.Discard)
	if err != nil || c.password != "typed pw" {
		t.Errorf("from standard input: %+v %v", c, err)
	}
	if _, err := loginCredentials("", "bob", "", strings.NewReader(""), io.Discard); err == nil {
		t.Error("no password accepted")
	}
	f := filepath.Join(t.TempDir(), "cred")
	os.WriteFile(f, []byte("username=carol@EX\npassword=c\n"), 0o600)
	c, err = loginCredentials(f, "", "ignored", strings.NewReader(""), io.Discard)
	if err != nil || c.username != "carol" || c.domain != "EX" || c.password != "c" {
		t.Errorf("from a file: %+v %v", c, err)
	}
}

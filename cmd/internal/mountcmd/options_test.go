package mountcmd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/fs"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/session"
)

func TestParseSource(t *testing.T) {
	for _, tc := range []struct {
		in    string
		host  string
		port  int
		share string
		bad   bool
	}{
		{in: "//srv/share", host: "srv", port: 4450, share: "share"},
		{in: "//srv:9999/share/", host: "srv", port: 9999, share: "share"},
		{in: `\\srv\share`, host: "srv", port: 4450, share: "share"},
		{in: "//[::1]:4460/s", host: "::1", port: 4460, share: "s"},
		{in: "//[fe80::1]/s", host: "fe80::1", port: 4450, share: "s"},
		{in: "//10.0.0.1/s", host: "10.0.0.1", port: 4450, share: "s"},
		{in: "srv/share", bad: true},
		{in: "//srv", bad: true},
		{in: "//srv/", bad: true},
		{in: "//srv/a/b", bad: true},
		{in: "//srv:0/s", bad: true},
		{in: "//srv:x/s", bad: true},
		{in: "///s", bad: true},
	} {
		h, p, s, err := parseSource(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseSource(%q) = %q %d %q, want error", tc.in, h, p, s)
			}
			continue
		}
		if err != nil || h != tc.host || p != tc.port || s != tc.share {
			t.Errorf("parseSource(%q) = %q %d %q %v, want %q %d %q", tc.in, h, p, s, err, tc.host, tc.port, tc.share)
		}
	}
}

func TestParseArgs(t *testing.T) {
	o, err := parseArgs([]string{"//h:1234/s", "/mnt", "-o", "ro,username=bob,provider=softrdma,completion=polling,attr_timeout=2.5,entry_timeout=0,allow_other,debug,conns=4,readahead=256,writebehind=0,pool_memory=8,split_read=0,dev,suid,_netdev,x-systemd.automount"})
	if err != nil {
		t.Fatal(err)
	}
	want := &Options{Host: "h", Port: 1234, Share: "s", Mountpoint: "/mnt", Username: "bob", ReadOnly: true,
		Provider: "softrdma", Completion: "polling", AttrTimeout: 2500 * time.Millisecond, EntryTimeout: 0,
		AllowOther: true, Debug: true, Conns: 4, ReadAheadKB: 256, WriteBehind: -1, PoolMiB: 8, SplitReadKB: -1}
	if summary(o) != summary(want) {
		t.Errorf("parseArgs:\n got %s\nwant %s", summary(o), summary(want))
	}
	// Options first, -oOPTS glued, mount helper flags, defaults.
	o, err = parseArgs([]string{"-n", "-obg", "-t", "fuse.lwio", "//h/s", "/mnt"})
	if err != nil {
		t.Fatal(err)
	}
	if o.Background == nil || !*o.Background || o.Provider != "auto" || o.Completion != "auto" || o.AttrTimeout != time.Second {
		t.Errorf("second form: %s", summary(o))
	}
	for _, bad := range [][]string{
		{"//h/s"},
		{"//h/s", "/mnt", "extra"},
		{"//h/s", "/mnt", "-o", "password=x"},
		{"//h/s", "/mnt", "-o", "provider=tcp"},
		{"//h/s", "/mnt", "-o", "completion=busy"},
		{"//h/s", "/mnt", "-o", "attr_timeout=-1"},
		{"//h/s", "/mnt", "-o", "conns=0"},
		{"//h/s", "/mnt", "-o", "readahead=2048"},
		{"//h/s", "/mnt", "-o", "writebehind=-1"},
		{"//h/s", "/mnt", "-o", "pool_memory=-1"},
		{"//h/s", "/mnt", "-o", "frobnicate"},
		{"//h/s", "/mnt", "-o"},
		{"//h/s", "/mnt", "-x"},
	} {
		if _, err := parseArgs(bad); err == nil {
			t.Errorf("parseArgs(%q) accepted", bad)
		}
	}
	if _, err := parseArgs([]string{"//h/s", "/mnt", "-o", "password=hunter2"}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("password error must not echo the password: %v", err)
	}
}

func TestResolveCredentials(t *testing.T) {
	dir := t.TempDir()
	cred := filepath.Join(dir, "cred")
	if err := os.WriteFile(cred, []byte("# comment\nusername=alice\npassword= with space\ndomain=CORP\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "LWIO_PASSWORD" {
				return v
			}
			return ""
		}
	}
	o := &Options{Credentials: cred}
	if err := o.resolveCredentials(env("fromenv")); err != nil {
		t.Fatal(err)
	}
	if o.Username != "alice" || o.password != " with space" || o.Domain != "CORP" {
		t.Errorf("from file: %q %q %q", o.Username, o.password, o.Domain)
	}
	o = &Options{Username: `DOM\bob`}
	if err := o.resolveCredentials(env("pw")); err != nil || o.Username != "bob" || o.Domain != "DOM" || o.password != "pw" {
		t.Errorf("env: %q %q %q %v", o.Username, o.Domain, o.password, err)
	}
	if err := (&Options{Username: "bob"}).resolveCredentials(env("")); err == nil {
		t.Errorf("no password accepted")
	}
	if err := (&Options{}).resolveCredentials(env("pw")); err == nil {
		t.Errorf("no user accepted")
	}
	os.WriteFile(cred, []byte("user name\n"), 0o600)
	if err := (&Options{Credentials: cred}).resolveCredentials(env("pw")); err == nil {
		t.Errorf("malformed credentials file accepted")
	}
	if o := (&Options{Username: "bob"}); o.resolveCredentials(env("pw")) != nil || !o.passwordFromEnv {
		t.Errorf("a password from LWIO_PASSWORD is not marked as such")
	}
	// A credentials file others can read is refused, naming it and the fix.
	os.WriteFile(cred, []byte("username=alice\npassword=pw\n"), 0o600)
	os.Chmod(cred, 0o644)
	err := (&Options{Credentials: cred}).resolveCredentials(env(""))
	if err == nil || !strings.Contains(err.Error(), cred) || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a 0644 credentials file: %v, want a refusal naming it and chmod 600", err)
	}
}

// The mount is nosuid and nodev whatever mount.fuse3 passes, and noexec
// when asked.
func TestMountFlags(t *testing.T) {
	for _, tc := range []struct {
		opts   string
		noexec bool
	}{{"dev,suid,exec", false}, {"noexec", true}, {"noexec,exec", false}} {
		o, err := parseArgs([]string{"//h/s", "/mnt", "-o", tc.opts})
		if err != nil {
			t.Fatal(err)
		}
		mo := o.fsOptions().MountOptions().MountOptions.Options
		if !slices.Contains(mo, "nosuid") || !slices.Contains(mo, "nodev") || slices.Contains(mo, "noexec") != tc.noexec {
			t.Errorf("-o %s: mount options %v, want nosuid,nodev and noexec=%v", tc.opts, mo, tc.noexec)
		}
	}
}

func TestCheckMountpoint(t *testing.T) {
	dir := t.TempDir()
	if err := checkMountpoint(dir); err != nil {
		t.Errorf("empty dir: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "f"), nil, 0o644)
	if err := checkMountpoint(dir); err == nil || !strings.Contains(err.Error(), "not an empty directory") {
		t.Errorf("non-empty dir: %v", err)
	}
	if err := checkMountpoint(filepath.Join(dir, "f")); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("file: %v", err)
	}
	if err := checkMountpoint(filepath.Join(dir, "nope")); err == nil {
		t.Errorf("missing dir accepted")
	}
	if err := checkMountpoint("/proc"); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Errorf("mount point /proc: %v", err)
	}
}

func TestConnectError(t *testing.T) {
	o := &Options{Host: "h", Port: 4450, Share: "s", Username: "u"}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		stage string
		err   error
		want  string
	}{
		{"session", fmt.Errorf("x: %w", session.ErrLogonFailure), "wrong user name or password"},
		{"tree", protocol.StatusBadNetworkName, `share "s" not found`},
		{"tree", protocol.StatusAccessDenied, `may not use share "s"`},
		{"session", refused, "cannot reach server h:4450: connection refused"},
		{"session", errors.New("odd"), "session h:4450: odd"},
		{"lwio", errors.New("no usable local RDMA provider"), "provider=auto: no usable local RDMA provider"},
	} {
		o.Provider = "auto"
		got := connectError(o, &fs.DialError{Step: tc.stage, Err: tc.err}).Error()
		if !strings.Contains(got, tc.want) || strings.Contains(got, "\n") {
			t.Errorf("connectError(%v) = %q, want it to say %q", tc.err, got, tc.want)
		}
	}
}

// summary prints the exported options (Options holds a sync.Once, so it is
// not copied into fmt).
func summary(o *Options) string {
	return fmt.Sprintf("%s %d %s %s %s %s %v %s %s %v %v %v %v %d %d %d %d %d %v %s %s %s %v",
		o.Host, o.Port, o.Share, o.Mountpoint, o.Username, o.Domain, o.ReadOnly, o.Provider, o.Completion,
		o.AttrTimeout, o.EntryTimeout, o.AllowOther, o.Debug, o.Conns, o.ReadAheadKB, o.WriteBehind, o.PoolMiB, o.SplitReadKB, o.Background, o.LogFile, o.LogLevel,
		o.LogFormat, o.ReconnectWait)
}

func TestSealOption(t *testing.T) {
	for _, tc := range []struct {
		opts string
		want session.SealMode
	}{{"ro", session.SealAuto}, {"seal,ro", session.SealRequired}} {
		o, err := parseArgs([]string{"//h/s", "/mnt", "-o", tc.opts})
		if err != nil {
			t.Fatal(err)
		}
		if got := sealMode(o.Seal); got != tc.want {
			t.Errorf("-o %s: seal mode %v, want %v", tc.opts, got, tc.want)
		}
	}
	if _, err := parseArgs([]string{"//h/s", "/mnt", "-o", "seal=yes"}); err == nil {
		t.Error("seal=yes accepted")
	}
}

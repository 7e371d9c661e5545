package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/smbauth"
)

// pwHash is the nt_hash the configurations below give their users: the
// password "pw".
var pwHash = smbauth.FormatNTHash(smbauth.NTHash("pw"))

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// mustBuild is the configuration the command line args make, failing the
// test if they make none.
func mustBuild(t *testing.T, args ...string) *Config {
	t.Helper()
	f, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := buildConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "s.toml", `
server_name = "fs1"
[log]
level = "debug"
format = "json"
[listen]
session = "127.0.0.1:5000"
verbs = ["10.0.0.1:5002"]
metrics = "127.0.0.1:9450"
[limits]
credits_per_connection = 16
max_buffer_memory = 33554432
workers = 8
[shares.data]
path = "`+dir+`"
read_only = true
users = ["alice"]
[users.alice]
nt_hash = "`+pwHash+`"
`)
	c, err := loadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if c.ServerName != "fs1" || c.Log.Format != "json" || c.Limits.CreditsPerConnection != 16 || c.Limits.MaxBufferMemory != 32<<20 ||
		!c.Shares["data"].ReadOnly || c.Shares["data"].Users[0] != "alice" || c.Listen.Verbs[0] != "10.0.0.1:5002" || c.Listen.Metrics != "127.0.0.1:9450" {
		t.Errorf("decoded %+v", c)
	}
	if a, err := c.softrdmaAddrs(); err != nil || len(a) != 1 || a[0] != "127.0.0.1:5001" {
		t.Errorf("default softrdma = %v %v, want session port + 1", a, err)
	}

	for name, text := range map[string]string{
		"unknown key":  "[shares.x]\npath = \"/\"\nreadonly = true\n",
		"syntax":       "[shares.x\n",
		"wrong type":   "[limits]\nworkers = \"many\"\n",
		"top-level kv": "sesion = \"x\"\n",
	} {
		if _, err := loadConfig(writeFile(t, dir, "bad.toml", text)); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: err %v, want a one-line error", name, err)
		}
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	good := func() *Config {
		return &Config{
			Shares: map[string]ShareConfig{"s": {Path: dir}},
			Users:  map[string]UserConfig{"u": {NTHash: pwHash}},
		}
	}
	if err := good().validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"no shares":      func(c *Config) { c.Shares = nil },
		"no users":       func(c *Config) { c.Users = nil },
		"bad hash":       func(c *Config) { c.Users["u"] = UserConfig{NTHash: "xyz"} },
		"missing path":   func(c *Config) { c.Shares["s"] = ShareConfig{Path: filepath.Join(dir, "nope")} },
		"file as share":  func(c *Config) { c.Shares["s"] = ShareConfig{Path: writeFile(t, dir, "f", "")} },
		"unknown user":   func(c *Config) { c.Shares["s"] = ShareConfig{Path: dir, Users: []string{"zed"}} },
		"slash in name":  func(c *Config) { c.Shares["a/b"] = ShareConfig{Path: dir} },
		"bad listen":     func(c *Config) { c.Listen.Session = "nohost" },
		"bad soft addr":  func(c *Config) { c.Listen.Softrdma, c.softrdmaSet = []string{"x"}, true },
		"credits > 255":  func(c *Config) { c.Limits.CreditsPerConnection = 300 },
		"negative limit": func(c *Config) { c.Limits.Workers = -1 },
	} {
		c := good()
		mod(c)
		if err := c.validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := good()
	c.Listen.Softrdma, c.softrdmaSet = []string{"none"}, true
	if a, _ := c.softrdmaAddrs(); len(a) != 0 {
		t.Errorf("softrdma none = %v", a)
	}
	c = good()
	c.Shares["s"] = ShareConfig{Path: dir, Users: []string{"U"}}
	if err := c.validate(); err != nil {
		t.Errorf("user names match case-insensitively: %v", err)
	}
}

func TestParseShareFlag(t *testing.T) {
	for _, tc := range []struct {
		in, name, path string
		ro, bad        bool
	}{
		{in: "demo=/srv/demo", name: "demo", path: "/srv/demo"},
		{in: "demo=/srv/demo:ro", name: "demo", path: "/srv/demo", ro: true},
		{in: "demo=/srv/a:b:rw", name: "demo", path: "/srv/a:b"},
		{in: "demo", bad: true},
		{in: "=/x", bad: true},
		{in: "x=", bad: true},
	} {
		name, sc, err := parseShareFlag(tc.in)
		if tc.bad != (err != nil) || !tc.bad && (name != tc.name || sc.Path != tc.path || sc.ReadOnly != tc.ro) {
			t.Errorf("parseShareFlag(%q) = %q %+v %v", tc.in, name, sc, err)
		}
	}
}

func TestBuildConfigQuickStart(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("LWIO_PASSWORD", "pw")
	f, err := parseFlags([]string{"-share", "demo=" + dir + ":ro", "-listen", "127.0.0.1:4450", "-soft", "none", "-user", "demo"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := buildConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Shares["demo"].ReadOnly || c.Users["demo"].NTHash != pwHash {
		t.Errorf("quick start config %+v", c)
	}
	if a, _ := c.softrdmaAddrs(); len(a) != 0 {
		t.Errorf("-soft none left %v", a)
	}
	t.Setenv("LWIO_PASSWORD", "")
	f, _ = parseFlags([]string{"-share", "demo=" + dir, "-user", "demo"}, io.Discard)
	if _, err := buildConfig(f); err == nil || !strings.Contains(err.Error(), "LWIO_PASSWORD") {
		t.Errorf("-user without LWIO_PASSWORD: %v", err)
	}
}

func TestAddUser(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "s.toml", "# my server\n[shares.s]\npath = \""+dir+"\" # the data\n\n[users.alice]\nnt_hash = \"00000000000000000000000000000000\"\n\n[users.bob]\n# bob's\n")
	t.Setenv("LWIO_PASSWORD", "alicepw")
	if err := addUser(p, "alice", strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LWIO_PASSWORD", "bobpw")
	if err := addUser(p, "bob", strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	os.Unsetenv("LWIO_PASSWORD")
	if err := addUser(p, "carol", strings.NewReader("carolpw\n")); err != nil {
		t.Fatal(err)
	}
	c, err := loadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	for u, pw := range map[string]string{"alice": "alicepw", "bob": "bobpw", "carol": "carolpw"} {
		if got := c.Users[u].NTHash; got != smbauth.FormatNTHash(smbauth.NTHash(pw)) {
			t.Errorf("%s: nt_hash %q", u, got)
		}
	}
	text, _ := os.ReadFile(p)
	if !strings.Contains(string(text), "# my server") || !strings.Contains(string(text), "# the data") {
		t.Errorf("comments lost:\n%s", text)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode())
	}
	// A new file is created.
	if err := addUser(filepath.Join(dir, "new.toml"), "dave", strings.NewReader("pw\n")); err != nil {
		t.Errorf("new file: %v", err)
	}
	if err := addUser(p, "eve", strings.NewReader("")); err == nil {
		t.Errorf("empty password accepted")
	}
}

// encrypt = server-wide and per share, and -encrypt over the file.
func TestEncryptSetting(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "s.toml", "encrypt = \"desired\"\n[shares.open]\npath = \""+dir+"\"\n"+
		"[shares.secret]\npath = \""+dir+"\"\nencrypt = \"required\"\n[users.u]\nnt_hash = \""+pwHash+"\"\n")
	c := mustBuild(t, "-config", p)
	if c.encrypt() != session.EncryptDesired || c.Shares["secret"].encrypt() != session.EncryptRequired ||
		c.Shares["open"].encrypt() != session.EncryptIfRequired {
		t.Errorf("encrypt %v, shares %v %v", c.encrypt(), c.Shares["secret"].encrypt(), c.Shares["open"].encrypt())
	}
	f, _ := parseFlags([]string{"-config", p, "-encrypt", "off"}, io.Discard)
	if c, err := buildConfig(f); err != nil || c.encrypt() != session.EncryptOff {
		t.Errorf("-encrypt off over the file: %v %v", c.encrypt(), err)
	}
	f, _ = parseFlags([]string{"-config", p, "-encrypt", "mandatory"}, io.Discard)
	if _, err := buildConfig(f); err == nil || !strings.Contains(err.Error(), "want off, if_required, desired or required") {
		t.Errorf("-encrypt mandatory: %v", err)
	}
	bad := writeFile(t, dir, "bad.toml", "[shares.s]\npath = \""+dir+"\"\nencrypt = \"yes\"\n[users.u]\nnt_hash = \""+pwHash+"\"\n")
	f, _ = parseFlags([]string{"-config", bad}, io.Discard)
	if _, err := buildConfig(f); err == nil || !strings.Contains(err.Error(), "shares.s") {
		t.Errorf("share encrypt = yes: %v", err)
	}
}

// Identity, policy and limit keys map onto the session server's config;
// -account and -allow-root do the same for a quick start.
func TestIdentityAndLimitSettings(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "s.toml", `
guest_account = "nobody"
[limits]
max_open_files = 100
max_open_files_per_user = 10
max_pending_connections = 20
max_pending_per_address = 5
idle_timeout = -1
logon_delay_max = 7
shared_receive_queue = false
[shares.s]
path = "`+dir+`"
allow_root = true
allow_setid = true
allow_devices = true
[users.u]
nt_hash = "`+pwHash+`"
account = "unix-u"
`)
	fc, err := serverConfig(mustBuild(t, "-config", p), logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	sc := fc.Session
	if sc.Accounts.Guest != "nobody" || sc.Accounts.Map["u"] != "unix-u" || sc.MaxOpenFiles != 100 || sc.MaxUserHandles != 10 ||
		sc.MaxPending != 20 || sc.MaxPendingPerAddr != 5 || sc.IdleTimeout >= 0 || sc.LogonDelayMax != 7*time.Second {
		t.Errorf("session config %+v", sc)
	}
	if s := sc.Shares[0]; !s.AllowRoot || !s.AllowSetid || !s.AllowDevices {
		t.Errorf("share config %+v", s)
	}
	if !fc.Engine.PrivateReceiveQueues {
		t.Error("shared_receive_queue = false: the engine still shares receive queues")
	}

	t.Setenv("LWIO_PASSWORD", "pw")
	if qs, err := serverConfig(mustBuild(t, "-share", "q="+dir, "-user", "demo"), logrus.New()); err != nil || qs.Engine.PrivateReceiveQueues {
		t.Errorf("shared receive queues off by default (%v)", err)
	}
	if c := mustBuild(t, "-share", "demo="+dir, "-user", "demo", "-account", "root", "-allow-root"); c.Users["demo"].Account != "root" || !c.Shares["demo"].AllowRoot {
		t.Errorf("-account root -allow-root: %+v", c)
	}
	f, _ := parseFlags([]string{"-share", "demo=" + dir, "-account", "root"}, io.Discard)
	if _, err := buildConfig(f); err == nil {
		t.Error("-account without -user accepted")
	}
}

// A configuration holding NT hashes that group or others can read is
// refused, naming the file and the fix; without hashes it is not.
func TestConfigWithHashesMustBePrivate(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "s.toml", "[shares.s]\npath = \""+dir+"\"\n[users.u]\nnt_hash = \""+pwHash+"\"\n")
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := loadConfig(p)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "chmod 600 "+p) {
		t.Errorf("a 0644 configuration with hashes: %v, want a refusal naming the file and chmod 600", err)
	}
	q := writeFile(t, dir, "shares.toml", "[shares.s]\npath = \""+dir+"\"\n")
	if err := os.Chmod(q, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig(q); err != nil {
		t.Errorf("a 0644 configuration without hashes: %v", err)
	}
}

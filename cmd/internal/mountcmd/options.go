package mountcmd

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lwiofs/lwiofs/cmd/internal/cli"
	"github.com/lwiofs/lwiofs/fs"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/transport"
)

// DefaultPort is the session channel's port when the source names none.
const DefaultPort = 4450

// Options is a parsed command line.
type Options struct {
	// Source: //HOST[:PORT]/SHARE.
	Host, Share string
	Port        int
	Mountpoint  string

	Username, Domain string
	password         string // from the credentials file or LWIO_PASSWORD, never argv
	// passwordFromEnv: password came from LWIO_PASSWORD, which the mount
	// warns about (any process of the user can read another's
	// environment) and hands to a re-executed process over a pipe
	// (secret.go).
	passwordFromEnv bool
	Credentials     string

	ReadOnly     bool
	NoExec       bool   // -o noexec: programs on the mount may not be executed
	Seal         bool   // require sealing of the session channel (-o seal)
	NoLeases     bool   // ask the server for no leases (-o noleases)
	SyncClose    bool   // close(2) waits for held-back writes (-o sync_close)
	Provider     string // auto, verbs, softrdma, none
	Completion   string // auto, interrupt, polling
	AttrTimeout  time.Duration
	EntryTimeout time.Duration
	AllowOther   bool
	Debug        bool
	Conns        int // RDMA connections; 0 = engine default
	ReadAheadKB  int // readahead window in KiB; 0 = fs default (1 MiB), -1 = the kernel's
	WriteBehind  int // writes of a file in flight; 0 = fs default, -1 = write through
	PoolMiB      int // idle registered buffers kept, MiB; 0 = engine default, -1 = unbounded
	SplitReadKB  int // reads split over idle connections from this size, KiB; 0 = engine default, -1 = never
	// Background: true returns once mounted (mount helper behaviour),
	// false stays in the foreground; nil decides by how we were started.
	Background *bool
	LogFile    string
	LogLevel   string
	LogFormat  string
	// ReconnectWait bounds how long a file operation waits for a lost
	// server to come back (0: fs.DefaultWaitTimeout).
	ReconnectWait time.Duration
	userOptions

	providersOnce sync.Once
	providers     []transport.Provider
	// stats are the mount's counters, across reconnects (lwio stat).
	stats *fs.Stats
}

// Addr is the session channel address.
func (o *Options) Addr() string { return net.JoinHostPort(o.Host, strconv.Itoa(o.Port)) }

// Source is the source as /proc/mounts shows it.
func (o *Options) Source() string {
	if o.Port == DefaultPort {
		return "//" + o.Host + "/" + o.Share
	}
	return "//" + o.Addr() + "/" + o.Share
}

// parseSource parses //HOST[:PORT]/SHARE (backslashes allowed, as in UNC).
func parseSource(s string) (host string, port int, share string, err error) {
	bad := fmt.Errorf("source %q: want //HOST[:PORT]/SHARE", s)
	u := strings.ReplaceAll(s, `\`, "/")
	if !strings.HasPrefix(u, "//") {
		return "", 0, "", bad
	}
	hp, share, ok := strings.Cut(u[2:], "/")
	share = strings.Trim(share, "/")
	if !ok || hp == "" || share == "" || strings.Contains(share, "/") {
		return "", 0, "", bad
	}
	port = DefaultPort
	host = hp
	if h, p, err := net.SplitHostPort(hp); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > 65535 {
			return "", 0, "", fmt.Errorf("source %q: bad port %q", s, p)
		}
		host, port = h, n
	} else if strings.HasPrefix(hp, "[") && strings.HasSuffix(hp, "]") {
		host = hp[1 : len(hp)-1]
	}
	if host == "" {
		return "", 0, "", bad
	}
	return host, port, share, nil
}

// ignoredOptions are mount(8) and mount.fuse3 options that mean nothing
// here (fstab lines carry them). The mount is always nosuid and nodev:
// mount.fuse3 adds "dev,suid" to every mount it runs, so those two cannot
// say that the user asked for them, and a set-user-ID program or a device
// node on a network share must not act on this host.
var ignoredOptions = map[string]bool{
	"rw": true, "defaults": true, "auto": true, "noauto": true, "user": true, "nouser": true,
	"users": true, "owner": true, "group": true, "_netdev": true, "nofail": true,
	"suid": true, "nosuid": true, "dev": true, "nodev": true, "async": true,
	"atime": true, "noatime": true, "relatime": true, "strictatime": true, "diratime": true,
	"nodiratime": true, "lazytime": true, "nolazytime": true, "loud": true, "silent": true,
}

// applyOption applies one -o option.
func (o *Options) applyOption(opt string) error {
	key, val, hasVal := strings.Cut(opt, "=")
	seconds := func() (time.Duration, error) {
		f, err := strconv.ParseFloat(val, 64)
		if err != nil || f < 0 {
			return 0, fmt.Errorf("option %s=%q: want seconds (a number >= 0)", key, val)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	// number parses a whole number from lo to hi; want names the range.
	number := func(lo, hi int, want string) (int, error) {
		n, err := strconv.Atoi(val)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("option %s=%q: want %s", key, val, want)
		}
		return n, nil
	}
	// zeroIsOff is number from 0 to hi for an option whose 0 turns the
	// feature off: the Options field holds that as -1, its own 0 meaning
	// the default.
	zeroIsOff := func(hi int, want string) (int, error) {
		n, err := number(0, hi, want)
		if err == nil && n == 0 {
			n = -1
		}
		return n, err
	}
	var err error
	switch key {
	case "credentials", "cred":
		o.Credentials = val
	case "username":
		o.Username = val
	case "domain", "dom":
		o.Domain = val
	case "password", "pass":
		return errors.New("password= is not accepted on the command line (it would show in ps): use credentials=FILE or LWIO_PASSWORD")
	case "ro":
		o.ReadOnly = true
	case "noleases":
		o.NoLeases = true
	case "sync_close":
		o.SyncClose = true
	case "noexec":
		o.NoExec = true
	case "exec":
		o.NoExec = false
	case "seal":
		if hasVal {
			return fmt.Errorf("option seal takes no value (%q)", opt)
		}
		o.Seal = true
	case "provider":
		switch val {
		case "auto", "verbs", "softrdma", "none":
			o.Provider = val
		default:
			return fmt.Errorf("option provider=%q: want auto, verbs, softrdma or none", val)
		}
	case "completion":
		switch val {
		case "auto", "interrupt", "polling":
			o.Completion = val
		default:
			return fmt.Errorf("option completion=%q: want auto, interrupt or polling", val)
		}
	case "attr_timeout", "actimeo":
		o.AttrTimeout, err = seconds()
		if key == "actimeo" {
			o.EntryTimeout = o.AttrTimeout
		}
	case "entry_timeout":
		o.EntryTimeout, err = seconds()
	case "reconnect_timeout":
		o.ReconnectWait, err = seconds()
	case "allow_other":
		o.AllowOther = true
	case "debug":
		o.Debug = true
	case "conns":
		o.Conns, err = number(1, 64, "1 to 64")
	case "readahead":
		o.ReadAheadKB, err = zeroIsOff(fs.MaxWrite/1024, fmt.Sprintf("0 (the kernel's default) to %d KiB", fs.MaxWrite/1024))
	case "writebehind":
		o.WriteBehind, err = zeroIsOff(64, "0 (write through) to 64")
	case "pool_memory":
		o.PoolMiB, err = zeroIsOff(4096, "0 (unbounded) to 4096 MiB")
	case "split_read":
		o.SplitReadKB, err = zeroIsOff(fs.MaxWrite/1024, fmt.Sprintf("0 (never split) to %d KiB", fs.MaxWrite/1024))
	case "bg", "background":
		t := true
		o.Background = &t
	case "fg", "foreground":
		f := false
		o.Background = &f
	case "log", "logfile":
		o.LogFile = val
	case "log_level":
		o.LogLevel = val
	case "log_format":
		o.LogFormat = val
	case "uid", "gid", "idmap", "default_permissions", "multiuser", "credentials_dir", "guest_credentials", "idle_timeout":
		return o.applyUserOption(key, val, hasVal)
	default:
		if ignoredOptions[key] && !hasVal || strings.HasPrefix(key, "x-") || key == "comment" {
			return nil
		}
		return fmt.Errorf("unknown option %q", opt)
	}
	if err == nil && hasVal && val == "" && key != "domain" && key != "dom" {
		err = fmt.Errorf("option %s= needs a value", key)
	}
	return err
}

// parseArgs parses `SOURCE MOUNTPOINT [-o opts]...` with options before,
// between or after the positionals (mount.fuse3 puts them last), plus the
// mount(8) helper flags -n -s -v -f and -t TYPE, which are accepted and
// ignored. It does not read credentials.
func parseArgs(args []string) (*Options, error) {
	o := &Options{
		Provider: "auto", Completion: "auto",
		AttrTimeout: fs.DefaultAttrTimeout, EntryTimeout: fs.DefaultEntryTimeout,
	}
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o":
			if i+1 == len(args) {
				return nil, errors.New("-o needs options")
			}
			i++
			if err := o.applyOptions(args[i]); err != nil {
				return nil, err
			}
		case strings.HasPrefix(a, "-o"):
			if err := o.applyOptions(a[2:]); err != nil {
				return nil, err
			}
		case a == "-t":
			i++ // mount helper: the type
		case a == "-n", a == "-s", a == "-v", a == "-f":
			// mount helper flags: no mtab, sloppy, verbose, fake (unused)
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(a, "-") && a != "-":
			return nil, fmt.Errorf("unknown flag %q", a)
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return nil, errors.New("usage: lwio-mount //HOST[:PORT]/SHARE MOUNTPOINT [-o opts]")
	}
	var err error
	if o.Host, o.Port, o.Share, err = parseSource(pos[0]); err != nil {
		return nil, err
	}
	o.Mountpoint = pos[1]
	return o, o.checkUserOptions()
}

func (o *Options) applyOptions(s string) error {
	for _, opt := range strings.Split(s, ",") {
		if opt == "" {
			continue
		}
		if err := o.applyOption(opt); err != nil {
			return err
		}
	}
	return nil
}

// credentials is a credentials file: lines username=, password=, domain=
// (the mount.cifs format); blank lines and # comments are skipped.
type credentials struct{ username, password, domain string }

func readCredentialsFile(path string) (credentials, error) {
	f, err := os.Open(path)
	if err != nil {
		return credentials{}, fmt.Errorf("credentials file: %w", err)
	}
	defer f.Close()
	if err := cli.CheckPrivate(path, "a password"); err != nil {
		return credentials{}, fmt.Errorf("credentials file %w", err)
	}
	return readCredentials(f, path)
}

// readCredentials reads the lines of credentials file path from r.
func readCredentials(r io.Reader, path string) (credentials, error) {
	var c credentials
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return c, fmt.Errorf("credentials file %s line %d: want key=value", path, n)
		}
		switch strings.TrimSpace(strings.ToLower(k)) {
		case "username", "user":
			c.username = strings.TrimSpace(v)
		case "password", "pass":
			c.password = v // spaces may be part of a password
		case "domain", "dom":
			c.domain = strings.TrimSpace(v)
		default:
			return c, fmt.Errorf("credentials file %s line %d: unknown key %q", path, n, k)
		}
	}
	return c, sc.Err()
}

// splitDomain splits a user "DOMAIN\name" or "name@DOMAIN" when no domain
// is given.
func splitDomain(user, domain *string) {
	if d, u, ok := strings.Cut(*user, `\`); ok && *domain == "" {
		*domain, *user = d, u
	} else if u, d, ok := strings.Cut(*user, "@"); ok && *domain == "" {
		*domain, *user = d, u
	}
}

// resolveCredentials fills in user, domain and password: a credentials
// file first (a user named with -o username= wins over the file's), then
// LWIO_PASSWORD; a user "DOMAIN\name" or "name@DOMAIN" is split.
func (o *Options) resolveCredentials(getenv func(string) string) error {
	if o.Credentials != "" {
		c, err := readCredentialsFile(o.Credentials)
		if err != nil {
			return err
		}
		if o.Username == "" {
			o.Username = c.username
		}
		if o.Domain == "" {
			o.Domain = c.domain
		}
		o.password = c.password
	}
	if o.password == "" {
		o.password = getenv(passwordEnv)
		o.passwordFromEnv = o.password != ""
	}
	splitDomain(&o.Username, &o.Domain)
	if o.Username == "" {
		return errors.New("no user name: give -o username=NAME or a credentials file with username=")
	}
	if o.password == "" {
		return errors.New("no password: set LWIO_PASSWORD or give -o credentials=FILE with password=")
	}
	return nil
}

// fsOptions maps the mount options onto the filesystem's.
func (o *Options) fsOptions() fs.Options {
	return fs.Options{
		AttrTimeout:  o.AttrTimeout,
		EntryTimeout: o.EntryTimeout,
		ReadOnly:     o.ReadOnly,
		NoLeases:     o.NoLeases,
		SyncClose:    o.SyncClose,
		NoExec:       o.NoExec,
		AllowOther:   o.AllowOther,
		Debug:        o.Debug,
		// Without default_permissions the server decides, as the account
		// each caller acts as (docs/usage.md, "Who owns what").
		DefaultPermissions: o.DefaultPermissions,
		FsName:             o.Source(),
		ReadAhead:          o.ReadAheadKB * 1024,
		WriteBehind:        o.WriteBehind,
	}
}

// sealMode is the session's sealing mode for -o seal: required, or (as
// mount.cifs without "seal") sealed when the server or share asks.
func sealMode(seal bool) session.SealMode {
	if seal {
		return session.SealRequired
	}
	return session.SealAuto
}

// Command lwio-server serves shares over the LWIO protocol: the session
// channel (NTLM, tree connect, namespace operations, resume keys, the
// \PIPE\LWIO negotiate) on TCP, and the LWIO engine on every enabled RDMA
// provider (softrdma over TCP, verbs through rdma_cm).
//
//	lwio-server -config /etc/lwio/server.toml
//	LWIO_PASSWORD=secret lwio-server -share demo=/srv/demo -listen 127.0.0.1:4450 -user demo
//	LWIO_PASSWORD=secret lwio-server adduser -config /etc/lwio/server.toml alice
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/lwiofs/lwiofs/cmd/internal/cli"
	"github.com/lwiofs/lwiofs/smbauth"
)

const prog = "lwio-server"

// shareFlags collects repeated -share flags.
type shareFlags []string

func (s *shareFlags) String() string     { return strings.Join(*s, ",") }
func (s *shareFlags) Set(v string) error { *s = append(*s, v); return nil }

// flags are the command line of the serving form.
type flags struct {
	config    string
	shares    shareFlags
	listen    string
	soft      string
	verbs     string
	metrics   string
	user      string
	account   string
	allowRoot bool
	encrypt   string
	logLevel  string
	logFormat string
	stateDir  string
	durable   time.Duration
	set       map[string]bool // flags given explicitly
}

func parseFlags(args []string, stderr io.Writer) (*flags, error) {
	f := &flags{set: map[string]bool{}}
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "", "TOML configuration `file`")
	fs.Var(&f.shares, "share", "serve `NAME=PATH[:ro]` (repeatable)")
	fs.StringVar(&f.listen, "listen", DefaultSessionAddr, "session channel `address`")
	fs.StringVar(&f.soft, "soft", "", "softrdma listen `address`, \"none\" disables (default: session host, port+1)")
	fs.StringVar(&f.verbs, "verbs", "", "verbs (rdma_cm) listen `address` (default: none)")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics at http://`ADDR`/metrics (default: none)")
	fs.StringVar(&f.user, "user", "", "add user `NAME`, password from LWIO_PASSWORD")
	fs.StringVar(&f.account, "account", "", "the Unix `ACCOUNT` the -user acts as on this host (default: the account of the same name)")
	fs.BoolVar(&f.allowRoot, "allow-root", false, "let users whose account is root (uid 0) use every share")
	fs.StringVar(&f.encrypt, "encrypt", "if_required", "sealing (encryption) of the session channel, `MODE`: off, if_required, desired or required")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json")
	fs.StringVar(&f.stateDir, "state-dir", "", "`directory` of the key durable handles survive a restart with (default "+DefaultStateDir+")")
	fs.DurationVar(&f.durable, "durable-timeout", 0, "how long an open file and its locks outlive a lost connection (default 60s; negative: not at all)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s -config FILE\n       %s -share NAME=PATH[:ro] [-listen ADDR] [-soft ADDR|none] [-verbs ADDR] [-metrics ADDR] [-encrypt MODE] -user NAME [-account ACCOUNT] [-allow-root]\n       %s adduser -config FILE NAME\n", prog, prog, prog)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	return f, nil
}

// buildConfig merges the configuration file (if any) with the quick-start
// flags; flags given explicitly win.
func buildConfig(f *flags) (*Config, error) {
	c := &Config{}
	if f.config != "" {
		var err error
		if c, err = loadConfig(f.config); err != nil {
			return nil, err
		}
	}
	if c.Shares == nil {
		c.Shares = map[string]ShareConfig{}
	}
	if c.Users == nil {
		c.Users = map[string]UserConfig{}
	}
	for _, s := range f.shares {
		name, sc, err := parseShareFlag(s)
		if err != nil {
			return nil, err
		}
		c.Shares[name] = sc
	}
	if f.set["listen"] || c.Listen.Session == "" {
		c.Listen.Session = f.listen
	}
	if f.set["soft"] {
		c.Listen.Softrdma, c.softrdmaSet = []string{f.soft}, true
	}
	if f.set["verbs"] {
		c.Listen.Verbs = nil
		if f.verbs != "" && f.verbs != "none" {
			c.Listen.Verbs = []string{f.verbs}
		}
	}
	if f.set["metrics"] {
		c.Listen.Metrics = f.metrics
	}
	if f.user != "" {
		pw := os.Getenv("LWIO_PASSWORD")
		if pw == "" {
			return nil, fmt.Errorf("-user %s: set the password in LWIO_PASSWORD", f.user)
		}
		c.Users[f.user] = UserConfig{NTHash: smbauth.FormatNTHash(smbauth.NTHash(pw)), Account: f.account}
	} else if f.account != "" {
		return nil, errors.New("-account names the account of -user: give -user too")
	}
	if f.allowRoot {
		for name, s := range c.Shares {
			s.AllowRoot = true
			c.Shares[name] = s
		}
	}
	if f.set["state-dir"] {
		c.StateDir = f.stateDir
	}
	if f.set["durable-timeout"] {
		c.Limits.DurableTimeout = int(f.durable / time.Second)
		if f.durable < 0 {
			c.Limits.DurableTimeout = -1
		} else if c.Limits.DurableTimeout == 0 {
			c.Limits.DurableTimeout = 1 // shorter than a second rounds up, not to the default
		}
	}
	if f.set["encrypt"] {
		c.Encrypt = f.encrypt
	}
	if f.set["log-level"] || c.Log.Level == "" {
		c.Log.Level = f.logLevel
	}
	if f.set["log-format"] || c.Log.Format == "" {
		c.Log.Format = f.logFormat
	}
	return c, c.validate()
}

// The main goroutine keeps the main thread to itself, so that no request's
// disk operation ever blocks there: the kernel gives a SIGTERM sent to the
// process to its main thread first, and one waiting in a disk that lets
// only a fatal signal end the wait (a hard NFS mount) would keep the
// signal pending, never handled — the server would not begin its shutdown
// (docs/usage.md: SIGTERM stops it within 5 s whatever its disks do).
func init() { runtime.LockOSThread() }

func main() {
	args := os.Args[1:]
	cli.HandleVersion(prog, args)
	cli.TraceFromEnv(prog)
	if len(args) > 0 && args[0] == "adduser" {
		os.Exit(runAddUser(args[1:]))
	}
	f, err := parseFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		os.Exit(2)
	}
	c, err := buildConfig(f)
	if err != nil {
		cli.Fatal(prog, 2, err)
	}
	log, err := cli.NewLogger(os.Stderr, c.Log.Level, c.Log.Format)
	if err != nil {
		cli.Fatal(prog, 2, err)
	}
	if err := serve(c, log); err != nil {
		cli.Fatal(prog, 1, err)
	}
}

func runAddUser(args []string) int {
	fs := flag.NewFlagSet(prog+" adduser", flag.ContinueOnError)
	config := fs.String("config", "", "TOML configuration `file` to write the user into")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: %s adduser -config FILE NAME   (password from LWIO_PASSWORD or stdin)\n", prog)
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *config == "" || fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	name := fs.Arg(0)
	if err := addUser(*config, name, os.Stdin); err != nil {
		fmt.Fprintf(os.Stderr, "%s adduser: %v\n", prog, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "%s adduser: wrote the NT hash of %s into %s\n", prog, name, *config)
	return 0
}

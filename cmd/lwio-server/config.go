package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/lwiofs/lwiofs/cmd/internal/cli"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
)

// Config is the server's TOML configuration file. Every field's zero value
// is a usable default except Shares and Users.
//
//	server_name = "fileserver"        # default: the host name
//	domain = "LWIO"
//	state_dir = "/var/lib/lwio"       # the identity key of durable handles
//	encrypt = "if_required"           # sealing: off, if_required, desired, required
//	trusted_fabric = false            # true: sealed sessions may use verbs, in clear
//	guest_account = "nobody"          # a user without a Unix account acts as it; default: refused
//	[log]
//	level = "info"                    # debug, info, warn, error
//	format = "text"                   # text or json
//	[listen]
//	session = "0.0.0.0:4450"          # the session channel (TCP)
//	softrdma = ["0.0.0.0:4451"]       # software RDMA listeners; [] disables
//	softrdma_advertise = ["198.51.100.7:4451"] # offered instead, behind a NAT
//	verbs = ["192.0.2.10:4452"]       # verbs (rdma_cm) listeners; default none
//	metrics = "127.0.0.1:9450"        # Prometheus /metrics; default none
//	[limits]
//	credits_per_connection = 64
//	max_buffer_memory = 33554432      # receive buffers of all connections together, bytes
//	max_rdma_window = 1048576         # bytes one READ/WRITE may carry
//	max_recv_buffer = 131120          # a receive buffer: 128 KiB of WRITE data + header
//	workers = 0                       # disk I/O goroutines; 0 = engine default
//	shared_receive_queue = true       # false: a receive queue per connection
//	max_open_files = 0                # handles of all users; 0 = 3/4 of RLIMIT_NOFILE
//	max_open_files_per_user = 16384
//	max_pending_connections = 512     # connections not logged on yet; beyond, the oldest is closed
//	max_pending_per_address = 64
//	idle_timeout = 300                # seconds; a logged-on session idle that long is closed; -1 never
//	logon_delay_max = 30              # seconds: the most a failed logon delays the next
//	durable_timeout = 60              # seconds an open file outlives its connection; -1 none
//	[shares.demo]
//	path = "/srv/demo"
//	read_only = false
//	users = ["alice"]                 # empty: every configured user
//	encrypt = "required"              # desired or required: seal this share's traffic
//	allow_root = false                # users whose account is uid 0 may connect
//	allow_setid = false               # set-user-ID/set-group-ID bits reach the disk
//	allow_devices = false             # clients may create device nodes
//	[users.alice]
//	nt_hash = "..."                   # 32 hex digits; lwio-server adduser writes it
//	account = "alice"                 # the Unix account alice acts as; default: the same name
type Config struct {
	ServerName   string `toml:"server_name"`
	Domain       string `toml:"domain"`
	StateDir     string `toml:"state_dir"`
	Encrypt      string `toml:"encrypt"`
	GuestAccount string `toml:"guest_account"`
	// TrustedFabric lets sealed sessions use RDMA providers that cannot
	// seal (verbs), their file data in clear on the fabric.
	TrustedFabric bool                   `toml:"trusted_fabric"`
	Log           LogConfig              `toml:"log"`
	Listen        ListenConfig           `toml:"listen"`
	Limits        LimitsConfig           `toml:"limits"`
	Shares        map[string]ShareConfig `toml:"shares"`
	Users         map[string]UserConfig  `toml:"users"`

	// softrdmaSet says listen.softrdma was given (so [] means "none").
	softrdmaSet bool
}

// LogConfig is [log].
type LogConfig struct {
	Level  string `toml:"level"`
	Format string `toml:"format"`
}

// ListenConfig is [listen].
type ListenConfig struct {
	// Session is the session channel's TCP address; "" means 0.0.0.0:4450.
	Session string `toml:"session"`
	// Softrdma are the software provider's listen addresses; unset means
	// the session host at the session port + 1.
	Softrdma []string `toml:"softrdma"`
	// SoftrdmaAdvertise, when set, is what the negotiate offers for the
	// softrdma listeners instead of their own addresses: the "ip:port"
	// clients reach them at through a NAT or a port forward.
	SoftrdmaAdvertise []string `toml:"softrdma_advertise"`
	// Verbs are the verbs provider's listen addresses; unset means none.
	Verbs []string `toml:"verbs"`
	// Metrics is where the Prometheus text exposition is served at
	// /metrics; "" means nowhere.
	Metrics string `toml:"metrics"`
}

// LimitsConfig is [limits]; zero fields leave the defaults.
type LimitsConfig struct {
	CreditsPerConnection int `toml:"credits_per_connection"`
	// MaxBufferMemory is the server's receive memory in bytes, which the
	// credits of all connections are granted against (issue 20).
	MaxBufferMemory int64 `toml:"max_buffer_memory"`
	// CreditBudget is the same budget in credits (older configurations);
	// it wins over MaxBufferMemory when both are set.
	CreditBudget  int `toml:"credit_budget"`
	MaxRDMAWindow int `toml:"max_rdma_window"`
	MaxRecvBuffer int `toml:"max_recv_buffer"`
	Workers       int `toml:"workers"`
	// SharedReceiveQueue (default true) posts every connection's receive
	// buffers to its device's shared receive queue; false gives each
	// connection a queue of its own (issue 20; docs/security.md).
	SharedReceiveQueue *bool `toml:"shared_receive_queue"`
	// LeaseBreakTimeout bounds, in seconds, how long a change waits for
	// a client to acknowledge a lease break (0: the share's default).
	LeaseBreakTimeout float64 `toml:"lease_break_timeout"`
	// MaxOpenFiles bounds the handles of all users together; 0 is three
	// quarters of RLIMIT_NOFILE (raised to its hard limit at start).
	MaxOpenFiles int `toml:"max_open_files"`
	// MaxOpenFilesPerUser bounds one user's handles over its sessions.
	MaxOpenFilesPerUser int `toml:"max_open_files_per_user"`
	// MaxPendingConnections and MaxPendingPerAddress bound the
	// connections that have not logged on yet, in all and per source
	// address.
	MaxPendingConnections int `toml:"max_pending_connections"`
	MaxPendingPerAddress  int `toml:"max_pending_per_address"`
	// IdleTimeout (seconds) closes a logged-on session that sent nothing
	// for that long; -1 never.
	IdleTimeout int `toml:"idle_timeout"`
	// LogonDelayMax (seconds) caps the delay failed logons put on the
	// next attempt of the same user from the same address.
	LogonDelayMax int `toml:"logon_delay_max"`
	// DurableTimeout is in seconds; 0 the default, negative none.
	DurableTimeout int `toml:"durable_timeout"`
}

// ShareConfig is one [shares.NAME].
type ShareConfig struct {
	Path     string   `toml:"path"`
	ReadOnly bool     `toml:"read_only"`
	Users    []string `toml:"users"`
	Encrypt  string   `toml:"encrypt"`
	// Leases false grants no leases on the share; unset or true grants
	// them when the kernel can watch the share.
	Leases *bool `toml:"leases"`
	// AllowRoot lets users whose account is uid 0 connect.
	AllowRoot bool `toml:"allow_root"`
	// AllowSetid lets set-user-ID and set-group-ID bits reach the disk.
	AllowSetid bool `toml:"allow_setid"`
	// AllowDevices lets clients create device nodes.
	AllowDevices bool `toml:"allow_devices"`
}

// leases reports whether the share grants leases.
func (s ShareConfig) leases() bool { return s.Leases == nil || *s.Leases }

// UserConfig is one [users.NAME].
type UserConfig struct {
	NTHash string `toml:"nt_hash"`
	// Account is the Unix account the user acts as; empty: the account
	// of the same name.
	Account string `toml:"account"`
}

// DefaultSessionAddr is where the session channel listens by default.
const DefaultSessionAddr = "0.0.0.0:4450"

// DefaultStateDir keeps what must survive a restart (the key that seals
// file identities) when state_dir is not set.
const DefaultStateDir = "/var/lib/lwio"

// loadConfig reads a configuration file, refusing unknown keys (a typo
// should not silently mean a default).
func loadConfig(path string) (*Config, error) {
	var c Config
	md, err := toml.DecodeFile(path, &c)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, oneLine(err))
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("config %s: unknown key(s) %s", path, strings.Join(keys, ", "))
	}
	c.softrdmaSet = md.IsDefined("listen", "softrdma")
	for _, u := range c.Users {
		if u.NTHash != "" {
			if err := cli.CheckPrivate(path, "NT hashes (password equivalents)"); err != nil {
				return nil, fmt.Errorf("config %w", err)
			}
			break
		}
	}
	return &c, nil
}

// oneLine keeps a TOML parse error to its first line.
func oneLine(err error) error {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return errors.New(s)
}

// sessionAddr is the session listen address with the default applied.
func (c *Config) sessionAddr() string {
	if c.Listen.Session == "" {
		return DefaultSessionAddr
	}
	return c.Listen.Session
}

// softrdmaAddrs are the software provider's listen addresses with the
// default applied: the session host at the session port + 1. "none"
// disables.
func (c *Config) softrdmaAddrs() ([]string, error) {
	if c.softrdmaSet {
		var out []string
		for _, a := range c.Listen.Softrdma {
			if a != "none" && a != "" {
				out = append(out, a)
			}
		}
		return out, nil
	}
	host, port, err := net.SplitHostPort(c.sessionAddr())
	if err != nil {
		return nil, fmt.Errorf("listen.session %q: %w", c.sessionAddr(), err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p >= 65535 {
		return nil, fmt.Errorf("listen.session %q: need a numeric port to derive the softrdma port from", c.sessionAddr())
	}
	return []string{net.JoinHostPort(host, strconv.Itoa(p+1))}, nil
}

// softrdmaAdvertise parses listen.softrdma_advertise; nil when unset.
func (c *Config) softrdmaAdvertise() ([]transport.Instance, error) {
	var out []transport.Instance
	for _, a := range c.Listen.SoftrdmaAdvertise {
		in, err := transport.InstanceFor(a)
		if err != nil {
			return nil, fmt.Errorf("listen.softrdma_advertise %q: %v", a, err)
		}
		out = append(out, in)
	}
	return out, nil
}

// validate checks everything that can be checked before listening.
func (c *Config) validate() error {
	if _, _, err := net.SplitHostPort(c.sessionAddr()); err != nil {
		return fmt.Errorf("listen.session %q: %v", c.sessionAddr(), err)
	}
	addrs, err := c.softrdmaAddrs()
	if err != nil {
		return err
	}
	for _, a := range append(addrs, c.Listen.Verbs...) {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("listen address %q: %v", a, err)
		}
	}
	if _, err := c.softrdmaAdvertise(); err != nil {
		return err
	}
	if m := c.Listen.Metrics; m != "" {
		if _, _, err := net.SplitHostPort(m); err != nil {
			return fmt.Errorf("listen.metrics %q: %v", m, err)
		}
	}
	if _, err := session.ParseEncrypt(c.Encrypt); err != nil {
		return err
	}
	if len(c.Shares) == 0 {
		return errors.New("no shares configured (give -share NAME=PATH or [shares.NAME] in the config)")
	}
	if len(c.Users) == 0 {
		return errors.New("no users configured (give -user NAME with LWIO_PASSWORD, or [users.NAME] nt_hash in the config)")
	}
	for name, u := range c.Users {
		if name == "" {
			return errors.New("a user has an empty name")
		}
		if _, err := smbauth.ParseNTHash(u.NTHash); err != nil {
			return fmt.Errorf("users.%s.nt_hash: %v", name, err)
		}
	}
	for _, name := range sortedKeys(c.Shares) {
		s := c.Shares[name]
		if name == "" || strings.ContainsAny(name, `/\`) {
			return fmt.Errorf("share name %q: must be non-empty and contain no slashes", name)
		}
		if s.Path == "" {
			return fmt.Errorf("shares.%s: no path", name)
		}
		if _, err := session.ParseEncrypt(s.Encrypt); err != nil {
			return fmt.Errorf("shares.%s: %v", name, err)
		}
		st, err := os.Stat(s.Path)
		if err != nil {
			return fmt.Errorf("shares.%s: %v", name, err)
		}
		if !st.IsDir() {
			return fmt.Errorf("shares.%s: %s is not a directory", name, s.Path)
		}
		for _, u := range s.Users {
			if _, ok := c.userFold(u); !ok {
				return fmt.Errorf("shares.%s: user %q is not in [users]", name, u)
			}
		}
	}
	l := c.Limits
	if l.CreditsPerConnection < 0 || l.CreditBudget < 0 || l.MaxBufferMemory < 0 || l.MaxRDMAWindow < 0 || l.MaxRecvBuffer < 0 || l.Workers < 0 ||
		l.MaxOpenFiles < 0 || l.MaxOpenFilesPerUser < 0 || l.MaxPendingConnections < 0 || l.MaxPendingPerAddress < 0 ||
		l.LogonDelayMax < 0 || l.IdleTimeout < -1 || l.LeaseBreakTimeout < 0 {
		return errors.New("limits: values must not be negative (idle_timeout: -1 for never)")
	}
	if c.Limits.CreditsPerConnection > 255 {
		return errors.New("limits.credits_per_connection: at most 255 (a u8 on the wire)")
	}
	return nil
}

// encrypt is the validated server-wide sealing policy.
func (c *Config) encrypt() session.Encrypt {
	e, _ := session.ParseEncrypt(c.Encrypt)
	return e
}

// encrypt is the validated sealing policy of the share.
func (s ShareConfig) encrypt() session.Encrypt {
	e, _ := session.ParseEncrypt(s.Encrypt)
	return e
}

// userFold finds a user case-insensitively, as NTLM matches names.
func (c *Config) userFold(name string) (UserConfig, bool) {
	for n, u := range c.Users {
		if strings.EqualFold(n, name) {
			return u, true
		}
	}
	return UserConfig{}, false
}

// parseShareFlag parses -share NAME=PATH[:ro].
func parseShareFlag(s string) (string, ShareConfig, error) {
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return "", ShareConfig{}, fmt.Errorf("-share %q: want NAME=PATH[:ro]", s)
	}
	var sc ShareConfig
	switch {
	case strings.HasSuffix(path, ":ro"):
		sc.ReadOnly = true
		path = strings.TrimSuffix(path, ":ro")
	case strings.HasSuffix(path, ":rw"):
		path = strings.TrimSuffix(path, ":rw")
	}
	sc.Path = path
	return name, sc, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

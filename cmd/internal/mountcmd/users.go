package mountcmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/fs"
)

// userOptions are the options of "who owns what" and multiuser mounts
// (docs/usage.md, "Who owns what").
type userOptions struct {
	// LocalUID and LocalGID are who the mount's account shows as: uid=
	// and gid=, else the mounting user.
	LocalUID, LocalGID uint32
	uidSet, gidSet     bool
	// IDMap is idmap=; nil means the mode's default (user, or names
	// with multiuser).
	IDMap *fs.IDMapMode
	// DefaultPermissions has the kernel check the mode bits.
	DefaultPermissions bool
	// MultiUser gives each local user a session with their own
	// credentials, from CredentialsDir or `lwio login`.
	MultiUser        bool
	CredentialsDir   string
	GuestCredentials string
	IdleTimeout      float64 // seconds; 0: fs.DefaultIdleTimeout
}

// applyUserOption applies one of the options applyOption hands over.
func (o *Options) applyUserOption(key, val string, hasVal bool) error {
	flag := func() error {
		if hasVal {
			return fmt.Errorf("option %s takes no value", key)
		}
		return nil
	}
	needVal := func() error {
		if val == "" {
			return fmt.Errorf("option %s= needs a value", key)
		}
		return nil
	}
	var err error
	switch key {
	case "uid":
		o.LocalUID, err = localID(key, val, lookupUser)
		o.uidSet = err == nil
	case "gid":
		o.LocalGID, err = localID(key, val, lookupGroup)
		o.gidSet = err == nil
	case "idmap":
		var m fs.IDMapMode
		if m, err = fs.ParseIDMapMode(val); err == nil {
			o.IDMap = &m
		}
	case "default_permissions":
		o.DefaultPermissions, err = true, flag()
	case "multiuser":
		// Other local users must reach the mount at all.
		o.MultiUser, o.AllowOther, err = true, true, flag()
	case "credentials_dir":
		o.CredentialsDir, err = val, needVal()
	case "guest_credentials":
		o.GuestCredentials, err = val, needVal()
	case "idle_timeout":
		f, perr := strconv.ParseFloat(val, 64)
		if perr != nil || f <= 0 {
			return fmt.Errorf("option idle_timeout=%q: want seconds (a number > 0)", val)
		}
		o.IdleTimeout = f
	}
	return err
}

// checkUserOptions refuses combinations that mean nothing.
func (o *Options) checkUserOptions() error {
	if !o.MultiUser && (o.CredentialsDir != "" || o.GuestCredentials != "" || o.IdleTimeout != 0) {
		return errors.New("credentials_dir=, guest_credentials= and idle_timeout= need -o multiuser")
	}
	if o.MultiUser && (o.uidSet || o.gidSet) {
		return errors.New("uid= and gid= mean one local owner for the mount's account: not with multiuser, where each user's account shows as that user")
	}
	return nil
}

// idMapMode is idmap= or the mode's default.
func (o *Options) idMapMode() fs.IDMapMode {
	switch {
	case o.IDMap != nil:
		return *o.IDMap
	case o.MultiUser:
		return fs.IDMapNames
	}
	return fs.IDMapUser
}

// localOwner is who the mount's account shows as on a single-credential
// mount: uid=/gid=, else the mounting user.
func (o *Options) localOwner() (uid, gid uint32) {
	uid, gid = uint32(os.Getuid()), uint32(os.Getgid())
	if o.uidSet {
		uid = o.LocalUID
	}
	if o.gidSet {
		gid = o.LocalGID
	}
	return uid, gid
}

func lookupUser(name string) (string, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return "", err
	}
	return u.Uid, nil
}

func lookupGroup(name string) (string, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return "", err
	}
	return g.Gid, nil
}

// localID parses uid= or gid=: a number or a local name.
func localID(key, val string, lookup func(string) (string, error)) (uint32, error) {
	if val == "" {
		return 0, fmt.Errorf("option %s= needs a value", key)
	}
	s := val
	if _, err := strconv.ParseUint(val, 10, 32); err != nil {
		if s, err = lookup(val); err != nil {
			return 0, fmt.Errorf("option %s=%s: %v", key, val, err)
		}
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("option %s=%s: not an id", key, val)
	}
	return uint32(n), nil
}

// ownerMap builds the mount's owner map over the mount's first session
// r: on a single-credential mount every local user acts as r's account,
// which shows as localOwner.
func (o *Options) ownerMap(r *fs.Reconnector, log logrus.FieldLogger) *fs.IDMap {
	ids := fs.NewIDMap(o.idMapMode(), r, nil, log)
	acct, known := r.Account()
	if !known {
		log.WithField("idmap", o.idMapMode().String()).Warn("the server does not say which account this session acts as: " +
			"owners show as the server's ids, and chown to yourself is sent as your own uid")
		return ids
	}
	if !o.MultiUser {
		uid, gid := o.localOwner()
		ids.Bind(uid, gid, acct)
		ids.ActAsForAll(acct)
	}
	return ids
}

// userCreds finds each local user's credentials on a multiuser mount:
// those added with `lwio login`, else the user's file in credentials_dir,
// else guest_credentials.
type userCreds struct {
	o   *Options
	log *logrus.Logger

	mu      sync.Mutex
	logins  map[uint32]login  // from `lwio login`, in memory only
	logged  uint64            // logins so far: each one's version
	refused map[uint32]string // the last refusal logged per user
}

// login is credentials a user gave with `lwio login`.
type login struct {
	c credentials
	n uint64
}

func newUserCreds(o *Options, log *logrus.Logger) *userCreds {
	return &userCreds{o: o, log: log, logins: map[uint32]login{}, refused: map[uint32]string{}}
}

// login records credentials uid gave with `lwio login`.
func (u *userCreds) login(uid uint32, c credentials) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.logged++
	u.logins[uid] = login{c, u.logged}
	delete(u.refused, uid)
}

// logout forgets them.
func (u *userCreds) logout(uid uint32) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.logins[uid]
	delete(u.logins, uid)
	return ok
}

// Credentials is fs.MultiUserConfig.Credentials.
func (u *userCreds) Credentials(ctx context.Context, uid uint32) (fs.Dialer, string, error) {
	c, version, err := u.find(uid)
	if err != nil {
		return nil, "", err
	}
	return u.o.userDialer(c, u.log), version, nil
}

func (u *userCreds) find(uid uint32) (credentials, string, error) {
	u.mu.Lock()
	l, ok := u.logins[uid]
	u.mu.Unlock()
	if ok {
		return l.c, fmt.Sprintf("login %d", l.n), nil
	}
	if u.o.CredentialsDir != "" {
		c, version, err := readUserCredentials(u.o.CredentialsDir, uid)
		if err == nil {
			return c, version, nil
		}
		if !errors.Is(err, fs.ErrNoCredentials) {
			u.refuse(uid, err)
		}
	}
	if u.o.GuestCredentials != "" {
		c, err := readCredentialsFile(u.o.GuestCredentials)
		if err != nil {
			u.refuse(uid, err)
			return c, "", fs.ErrNoCredentials
		}
		return c, "guest", nil
	}
	return credentials{}, "", fs.ErrNoCredentials
}

// refuse logs why a user's credentials were refused, once per reason.
func (u *userCreds) refuse(uid uint32, err error) {
	u.mu.Lock()
	last := u.refused[uid]
	u.refused[uid] = err.Error()
	u.mu.Unlock()
	if last != err.Error() {
		u.log.WithField("uid", uid).WithError(err).Warn("multiuser: credentials file refused")
	}
}

// readUserCredentials reads the credentials file of local user uid in
// dir: the file named after the user, a regular file owned by that user
// and readable by no one else (mode 0600 or stricter) — anything else is
// refused, as ssh refuses a private key others can read. The version is
// the file's identity and change time.
func readUserCredentials(dir string, uid uint32) (credentials, string, error) {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return credentials{}, "", fmt.Errorf("%w: uid %d has no local user name (%v)", fs.ErrNoCredentials, uid, err)
	}
	path := filepath.Join(dir, u.Username)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return credentials{}, "", fmt.Errorf("%w: no %s", fs.ErrNoCredentials, path)
	}
	if err != nil {
		return credentials{}, "", fmt.Errorf("%s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return credentials{}, "", fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return credentials{}, "", fmt.Errorf("%s is not a regular file", path)
	case st.Uid != uid:
		return credentials{}, "", fmt.Errorf("%s is owned by uid %d, not by %s (uid %d): fix with chown %s %s", path, st.Uid, u.Username, uid, u.Username, path)
	case st.Mode&0o077 != 0:
		return credentials{}, "", fmt.Errorf("%s has mode %04o: others may read it; fix with chmod 600 %s", path, st.Mode&0o7777, path)
	}
	c, err := readCredentials(f, path)
	if err != nil {
		return c, "", err
	}
	return c, fmt.Sprintf("%d:%d:%d.%d:%d", st.Dev, st.Ino, st.Ctim.Sec, st.Ctim.Nsec, st.Size), nil
}

// userDialer dials a session of the mount with credentials c.
func (o *Options) userDialer(c credentials, log *logrus.Logger) fs.Dialer {
	cfg := dialConfig(o, log)
	cfg.Session.User, cfg.Session.Domain, cfg.Session.Password = c.username, c.domain, c.password
	splitDomain(&cfg.Session.User, &cfg.Session.Domain)
	return func(ctx context.Context) (*fs.Session, error) { return fs.Dial(ctx, cfg) }
}

// mountTree is what the mount serves: the first session r, which every
// local user acts through, or with multiuser a router that gives each
// local user a session of their own (r pinned as the mounting user's), and
// then um, the login operations for the mount's control endpoint. It sets
// fopts.Owners; stop ends what it started.
func (o *Options) mountTree(r *fs.Reconnector, log *logrus.Logger, fopts *fs.Options) (tree fs.Tree, data fs.DataPath, um *userMount, stop func()) {
	fsLog := log.WithField("component", "fs")
	fopts.Owners = o.ownerMap(r, fsLog)
	if !o.MultiUser {
		return r, r, nil, func() {}
	}
	creds := newUserCreds(o, log)
	idle := time.Duration(o.IdleTimeout * float64(time.Second))
	mu := fs.NewMultiUser(fs.MultiUserConfig{Credentials: creds.Credentials, IdleTimeout: idle,
		ReconnectWait: o.ReconnectWait, Owners: fopts.Owners, Logger: fsLog})
	mu.Pin(uint32(os.Getuid()), uint32(os.Getgid()), r)
	um = &userMount{creds: creds, mu: mu, log: log.WithField("component", "control"), slots: make(chan struct{}, maxLoginsAtOnce)}
	return mu, mu, um, func() { mu.Close() }
}

package share

import (
	"errors"
	"fmt"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
)

// DefaultAccountTTL is how long a looked-up account is trusted: a change
// to the account database (a user added to a group, say) takes effect
// within it, without a restart and without a reconnect.
const DefaultAccountTTL = 30 * time.Second

// AccountsConfig says how logon names become Unix accounts on the server.
// The zero value is Samba's convention: every user is the account of the
// same name in the server's passwd/group database, and a user without one
// is refused.
type AccountsConfig struct {
	// Map maps a logon name (matched case-insensitively) to the name of
	// the account it acts as; a name not in it is its own account.
	Map map[string]string
	// Guest is the account a user with no account of its own acts as
	// (Samba's "map to guest = bad user" with "guest account"); empty
	// refuses such a user.
	Guest string
	// TTL is how long a lookup is trusted; zero means DefaultAccountTTL.
	TTL time.Duration
	// Lookup finds an account by name; nil uses the system's database
	// (os/user: getpwnam_r and getgrouplist through NSS when built with
	// cgo, /etc/passwd and /etc/group otherwise). For tests.
	Lookup func(name string) (Account, error)
}

// ErrNoAccount is what a lookup returns for a name the account database
// does not know.
var ErrNoAccount = errors.New("no such account")

// Accounts turns logon names into the accounts their sessions act as,
// caching each lookup for the configured TTL. When the process cannot act
// per user (PerUser is false) every logon acts as the server's own
// account. Safe for concurrent use.
type Accounts struct {
	cfg    AccountsConfig
	mapped map[string]string // Map, by lower-cased logon name
	self   Account
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]*accountEntry // by lower-cased logon name
	names map[accountQ]accountA    // name ↔ id answers (names.go)
}

// accountEntry is one resolved logon: its account, the credentials
// prepared for the system calls, and until when it is trusted.
type accountEntry struct {
	acct    Account
	cred    *cred
	guest   bool
	expires time.Time
}

// NewAccounts returns a resolver. The server's own account is looked up
// here, once.
func NewAccounts(cfg AccountsConfig) *Accounts {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultAccountTTL
	}
	if cfg.Lookup == nil {
		cfg.Lookup = LookupAccount
	}
	a := &Accounts{cfg: cfg, mapped: map[string]string{}, now: time.Now, cache: map[string]*accountEntry{}}
	for k, v := range cfg.Map {
		a.mapped[strings.ToLower(k)] = v
	}
	a.self = Account{Uid: self.uid, Gid: self.gid, Groups: self.groups}
	a.self.Name = strconv.Itoa(int(self.uid))
	if u, err := user.LookupId(a.self.Name); err == nil {
		a.self.Name = u.Username
	}
	return a
}

// PerUser reports whether sessions act as their own accounts; false when
// the process cannot change a thread's credentials (not root), and then
// every user acts as Self.
func (a *Accounts) PerUser() bool { return self.perUser }

// Self is the server's own account.
func (a *Accounts) Self() Account { return a.self }

// Identity resolves a logged-on user to the identity its trees act with:
// its account (Map's, or the one of the same name), the Guest account when
// it has none, or an error wrapping ErrNoAccount. The tree connected with
// it looks the account up again once the TTL has passed.
func (a *Accounts) Identity(logon string) (Identity, bool, error) {
	e, err := a.entry(logon)
	if err != nil {
		return Identity{}, false, err
	}
	return Identity{User: logon, Account: e.acct, src: a}, e.guest, nil
}

// entry returns the logon's cached entry, looking it up again when it has
// expired.
func (a *Accounts) entry(logon string) (*accountEntry, error) {
	if !self.perUser {
		return &accountEntry{acct: a.self, expires: farFuture}, nil
	}
	key := strings.ToLower(logon)
	now := a.now()
	a.mu.Lock()
	e := a.cache[key]
	a.mu.Unlock()
	if e != nil && now.Before(e.expires) {
		return e, nil
	}
	name := logon
	if m, ok := a.mapped[key]; ok {
		name = m
	}
	acct, err := a.cfg.Lookup(name)
	guest := false
	if errors.Is(err, ErrNoAccount) && a.cfg.Guest != "" {
		acct, err = a.cfg.Lookup(a.cfg.Guest)
		guest = true
	}
	if err != nil {
		a.mu.Lock()
		delete(a.cache, key)
		a.mu.Unlock()
		return nil, fmt.Errorf("user %q (account %q): %w", logon, name, err)
	}
	e = &accountEntry{acct: acct, cred: newCred(acct), guest: guest, expires: now.Add(a.cfg.TTL)}
	a.mu.Lock()
	a.cache[key] = e
	a.mu.Unlock()
	return e, nil
}

var farFuture = time.Unix(1<<62, 0)

// LookupAccount finds an account by name in the system's database
// (os/user), with its supplementary groups. An unknown name is an error
// wrapping ErrNoAccount.
func LookupAccount(name string) (Account, error) {
	u, err := user.Lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			return Account{}, fmt.Errorf("%w: %q", ErrNoAccount, name)
		}
		return Account{}, err
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return Account{}, fmt.Errorf("account %q: %w", name, err)
	}
	acct := Account{Name: u.Username, Uid: uint32(uid), Gid: uint32(gid)}
	ids, err := u.GroupIds()
	if err != nil {
		return Account{}, fmt.Errorf("account %q: groups: %w", name, err)
	}
	for _, s := range ids {
		g, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return Account{}, fmt.Errorf("account %q: group %q: %w", name, s, err)
		}
		acct.Groups = append(acct.Groups, uint32(g))
	}
	return acct, nil
}

// RootRefused is why a tree connect is refused: the user acts as root
// (uid 0) and the share does not allow it (Config.AllowRoot). It is
// STATUS_ACCESS_DENIED on the wire.
type RootRefused struct {
	User, Account, Share string
	// Server: the server cannot act per user (no CAP_SETUID and
	// CAP_SETGID), so the user would act as the server, which is root
	// or overrides the file permission checks.
	Server bool
}

func (e *RootRefused) Error() string {
	if e.Server {
		return fmt.Sprintf("user %q would act as the server, which is root (or overrides permission checks) but cannot act per user (no CAP_SETUID and CAP_SETGID), and share %q does not allow_root", e.User, e.Share)
	}
	return fmt.Sprintf("user %q acts as account %q, which is uid 0 (root), and share %q does not allow_root", e.User, e.Account, e.Share)
}

func (e *RootRefused) Unwrap() error { return protocol.StatusAccessDenied }

// treeCred is the credentials a tree's next disk operation runs with:
// its identity's account, looked up again once the TTL has passed (a
// lookup that now fails, or an account that became root on a share that
// does not allow it, refuses the operation).
func (t *Tree) treeCred() (*cred, error) {
	e := t.acct.Load()
	if t.id.src == nil || t.id.src.now().Before(e.expires) {
		return e.cred, nil
	}
	e, err := t.id.src.entry(t.id.User)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", protocol.StatusAccessDenied, err)
	}
	if err := t.sh.rootAllowed(t.id.User, e.acct); err != nil {
		return nil, err
	}
	t.acct.Store(e)
	return e.cred, nil
}

// as runs fn with the tree's credentials (identity_linux.go) and maps
// what it returns to an NTSTATUS.
func (t *Tree) as(fn func() error) error {
	c, err := t.treeCred()
	if err != nil {
		return err
	}
	return fail(c.run(fn))
}

// Run runs fn on one identity thread in the tree's credentials, so that
// the tree's operations fn makes run on that thread in place instead of
// each being handed to one (identity_threads_linux.go, "Nested runs"): a
// request of several disk operations (an OPEN that also reads attributes
// and takes a lease; a BATCH of writes, setattrs and a close) then costs
// one hand-off. fn runs with the user's filesystem credentials throughout,
// so it must do only what the tree's operations may do as the user — disk
// operations and the server's bookkeeping — and nothing that needs the
// server's own thread: no RDMA post (the verbs device refuses a thread
// whose credentials changed), no open by file handle. An operation with the
// server's credentials made inside fn (another tree's, of the server's own
// account) still runs as the server, on a goroutine of its own. Run returns
// what fn returns; when the tree's credentials cannot be had (its account
// is gone) or are the server's, fn runs where Run was called, and its
// operations do as they would have.
func (t *Tree) Run(fn func() error) error {
	c, err := t.treeCred()
	if err != nil || c == nil {
		return fn()
	}
	runsActive.Add(1)
	defer runsActive.Add(-1)
	return runAs(c, fn)
}

// rootAllowed refuses an account with uid 0 unless the share allows root.
// A server that cannot act per user runs every user as itself: it refuses
// them all there when it is root, or holds a capability that overrides
// the file permission checks — root without CAP_SETUID or CAP_SETGID (a
// unit whose bounding set lost them) would otherwise make every user root.
func (s *Share) rootAllowed(user string, a Account) error {
	if s.AllowRoot {
		return nil
	}
	if self.perUser && a.Uid == 0 {
		return &RootRefused{User: user, Account: a.Name, Share: s.Name}
	}
	if !self.perUser && (self.uid == 0 || self.caps[0].Effective&fsCaps != 0 || self.caps[1].Effective&fsCapsHigh != 0) {
		return &RootRefused{User: user, Account: a.Name, Share: s.Name, Server: true}
	}
	return nil
}

package share

import (
	"errors"
	"os/user"
	"strconv"
	"strings"
	"time"
)

// ErrNoName is an id or name the server host's account databases do not
// have.
var ErrNoName = errors.New("share: no such user or group")

// maxNamesCached bounds the cache of name ↔ id answers; past it the cache
// starts over.
const maxNamesCached = 4096

// The name ↔ id questions about the host's users and groups are answered by
// Accounts too (one account lookup for logons and for IDMAP): from its
// databases through os/user, so NSS sources (LDAP, sssd) count, except that
// a user name's uid comes from AccountsConfig.Lookup, the lookup logons use.
// Answers, unknown ones included, are cached for the Accounts' TTL, so `ls
// -l` of a directory of one owner costs one lookup, not one per file. A
// client uses an Accounts of its own host to show owners under the local
// ids of the same names (the session channel's IDMAP; fs.LocalAccounts).

type accountQ struct {
	kind byte // 'u' uid→name, 'g' gid→name, 'U' name→uid, 'G' name→gid
	id   uint32
	name string
}

type accountA struct {
	id   uint32
	name string
	err  error
	at   time.Time
}

// UserName is the name of user uid.
func (a *Accounts) UserName(uid uint32) (string, error) {
	r := a.ask(accountQ{kind: 'u', id: uid})
	return r.name, r.err
}

// GroupName is the name of group gid.
func (a *Accounts) GroupName(gid uint32) (string, error) {
	r := a.ask(accountQ{kind: 'g', id: gid})
	return r.name, r.err
}

// UserID is the uid of user name.
func (a *Accounts) UserID(name string) (uint32, error) {
	r := a.ask(accountQ{kind: 'U', name: name})
	return r.id, r.err
}

// GroupID is the gid of group name.
func (a *Accounts) GroupID(name string) (uint32, error) {
	r := a.ask(accountQ{kind: 'G', name: name})
	return r.id, r.err
}

// lookup asks the host's databases question q: Lookup for a user's uid,
// os/user otherwise.
func (a *Accounts) lookup(q accountQ) (accountA, error) {
	id := strconv.FormatUint(uint64(q.id), 10)
	switch q.kind {
	case 'u':
		u, err := user.LookupId(id)
		return answer(err, func() accountA { return accountA{name: u.Username} })
	case 'g':
		g, err := user.LookupGroupId(id)
		return answer(err, func() accountA { return accountA{name: g.Name} })
	case 'U':
		acct, err := a.cfg.Lookup(q.name)
		if errors.Is(err, ErrNoAccount) {
			err = user.UnknownUserError(q.name)
		}
		return answer(err, func() accountA { return accountA{id: acct.Uid} })
	default:
		g, err := user.LookupGroup(q.name)
		return answer(err, func() accountA { return numbered(g.Gid) })
	}
}

// answer is a's result when the lookup found something.
func answer(err error, a func() accountA) (accountA, error) {
	if err != nil {
		return accountA{}, err
	}
	r := a()
	return r, r.err
}

// numbered is the answer holding the id s.
func numbered(s string) accountA {
	id, err := strconv.ParseUint(s, 10, 32)
	return accountA{id: uint32(id), err: err}
}

// ask answers q from the cache or with lookup, which runs unlocked: an NSS
// source can be slow, and two lookups of one name at once are harmless.
func (a *Accounts) ask(q accountQ) accountA {
	if q.kind == 'U' || q.kind == 'G' {
		if !accountName(q.name) {
			return accountA{err: ErrNoName}
		}
	}
	now := a.now()
	a.mu.Lock()
	r, ok := a.names[q]
	a.mu.Unlock()
	if ok && now.Sub(r.at) < a.cfg.TTL {
		return r
	}
	r, err := a.lookup(q)
	var unknownUser user.UnknownUserError
	var unknownUID user.UnknownUserIdError
	var unknownGroup user.UnknownGroupError
	var unknownGID user.UnknownGroupIdError
	switch {
	case err == nil:
	case errors.As(err, &unknownUser), errors.As(err, &unknownUID), errors.As(err, &unknownGroup), errors.As(err, &unknownGID):
		r.err = ErrNoName
	default:
		return accountA{err: err} // a failing NSS source: not cached
	}
	r.at = now
	a.mu.Lock()
	if a.names == nil || len(a.names) >= maxNamesCached {
		a.names = map[accountQ]accountA{}
	}
	a.names[q] = r
	a.mu.Unlock()
	return r
}

// accountName reports whether s can be an account name at all: what
// useradd and groupadd accept, and not a number (getpwnam of a number
// would be answered by some NSS modules).
func accountName(s string) bool {
	if s == "" || len(s) > 256 || strings.ContainsAny(s, ":/\x00\n") {
		return false
	}
	_, err := strconv.ParseUint(s, 10, 64)
	return err != nil
}

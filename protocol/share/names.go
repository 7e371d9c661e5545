package share

import (
	"errors"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNoName is an id or name the server host's account databases do not
// have.
var ErrNoName = errors.New("share: no such user or group")

// namesTTL is how long an answer is reused: a renamed or new account
// shows within a minute, and `ls -l` of a directory of one owner costs one
// lookup, not one per file.
const namesTTL = time.Minute

// maxNamesCached bounds the cache; past it the cache starts over.
const maxNamesCached = 4096

// AccountNames answers name ↔ id questions about the server host's users and
// groups — its passwd and group databases through os/user, so NSS sources
// (LDAP, sssd) count — for clients that show owners under the local ids of
// the same names (the session channel's IDMAP). Answers, unknown ones
// included, are cached for a minute. Safe for concurrent use; the zero
// value is ready.
type AccountNames struct {
	mu    sync.Mutex
	cache map[accountQ]accountA
}

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
func (a *AccountNames) UserName(uid uint32) (string, error) {
	r := a.ask(accountQ{kind: 'u', id: uid})
	return r.name, r.err
}

// GroupName is the name of group gid.
func (a *AccountNames) GroupName(gid uint32) (string, error) {
	r := a.ask(accountQ{kind: 'g', id: gid})
	return r.name, r.err
}

// UserID is the uid of user name.
func (a *AccountNames) UserID(name string) (uint32, error) {
	r := a.ask(accountQ{kind: 'U', name: name})
	return r.id, r.err
}

// GroupID is the gid of group name.
func (a *AccountNames) GroupID(name string) (uint32, error) {
	r := a.ask(accountQ{kind: 'G', name: name})
	return r.id, r.err
}

// lookup asks the host's databases (os/user) question q.
func lookup(q accountQ) (accountA, error) {
	id := strconv.FormatUint(uint64(q.id), 10)
	switch q.kind {
	case 'u':
		u, err := user.LookupId(id)
		return answer(err, func() accountA { return accountA{name: u.Username} })
	case 'g':
		g, err := user.LookupGroupId(id)
		return answer(err, func() accountA { return accountA{name: g.Name} })
	case 'U':
		u, err := user.Lookup(q.name)
		return answer(err, func() accountA { return numbered(u.Uid) })
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
func (a *AccountNames) ask(q accountQ) accountA {
	if q.kind == 'U' || q.kind == 'G' {
		if !accountName(q.name) {
			return accountA{err: ErrNoName}
		}
	}
	now := time.Now()
	a.mu.Lock()
	r, ok := a.cache[q]
	a.mu.Unlock()
	if ok && now.Sub(r.at) < namesTTL {
		return r
	}
	r, err := lookup(q)
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
	if a.cache == nil || len(a.cache) >= maxNamesCached {
		a.cache = map[accountQ]accountA{}
	}
	a.cache[q] = r
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

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
	r := a.ask(accountQ{kind: 'u', id: uid}, func(q accountQ) (accountA, error) {
		u, err := user.LookupId(strconv.FormatUint(uint64(q.id), 10))
		if err != nil {
			return accountA{}, err
		}
		return accountA{name: u.Username}, nil
	})
	return r.name, r.err
}

// GroupName is the name of group gid.
func (a *AccountNames) GroupName(gid uint32) (string, error) {
	r := a.ask(accountQ{kind: 'g', id: gid}, func(q accountQ) (accountA, error) {
		g, err := user.LookupGroupId(strconv.FormatUint(uint64(q.id), 10))
		if err != nil {
			return accountA{}, err
		}
		return accountA{name: g.Name}, nil
	})
	return r.name, r.err
}

// UserID is the uid of user name.
func (a *AccountNames) UserID(name string) (uint32, error) {
	r := a.ask(accountQ{kind: 'U', name: name}, func(q accountQ) (accountA, error) {
		u, err := user.Lookup(q.name)
		if err != nil {
			return accountA{}, err
		}
		id, err := strconv.ParseUint(u.Uid, 10, 32)
		return accountA{id: uint32(id)}, err
	})
	return r.id, r.err
}

// GroupID is the gid of group name.
func (a *AccountNames) GroupID(name string) (uint32, error) {
	r := a.ask(accountQ{kind: 'G', name: name}, func(q accountQ) (accountA, error) {
		g, err := user.LookupGroup(q.name)
		if err != nil {
			return accountA{}, err
		}
		id, err := strconv.ParseUint(g.Gid, 10, 32)
		return accountA{id: uint32(id)}, err
	})
	return r.id, r.err
}

// ask answers q from the cache or with look, which runs unlocked: an NSS
// source can be slow, and two lookups of one name at once are harmless.
func (a *AccountNames) ask(q accountQ, look func(accountQ) (accountA, error)) accountA {
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
	r, err := look(q)
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

package fs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/enum"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// Account is the Unix account a session acts as on the server: the logon's
// account there, which the server reports at tree connect (issue 14's
// identity; docs/session.md, "Identity").
type Account struct {
	Name     string
	Uid, Gid uint32
	// Groups are the account's supplementary gids; nil when unknown.
	Groups []uint32
	// Shared says the server acts as this one account for every user
	// (it does not run as root): users of a multiuser mount are then not
	// kept apart on the server.
	Shared bool
}

// IDMapMode says how the owners of files on the server are shown on the
// mount, and how chown/chgrp on the mount are sent back (docs/usage.md,
// "Who owns what"). In every mode but none, an account a local user acts
// as (the mount's account, or each multiuser session's) shows as that
// local user, and back.
type IDMapMode int

const (
	// IDMapUser (idmap=user, the default of a single-credential mount,
	// after sshfs): the mount's account shows as the mounting user (or
	// uid=/gid=); every other owner as its server id, unchanged.
	IDMapUser IDMapMode = iota
	// IDMapNone (idmap=none): every owner as its server id.
	IDMapNone
	// IDMapNames (idmap=names, the default of a multiuser mount, after
	// NFSv4's idmapping): every owner by name — the server's name of the
	// id (IDMAP) and the local id of that name; an owner with no local
	// name shows as NobodyID.
	IDMapNames
)

var idMapModes = []string{IDMapUser: "user", IDMapNone: "none", IDMapNames: "names"}

func (m IDMapMode) String() string { return enum.Name(idMapModes, m, "IDMapMode") }

// ParseIDMapMode parses the idmap= option's value.
func ParseIDMapMode(s string) (IDMapMode, error) {
	for i, n := range idMapModes {
		if n == s {
			return IDMapMode(i), nil
		}
	}
	return 0, fmt.Errorf("idmap=%q: want user, none or names", s)
}

// NobodyID is the id a server owner with no local counterpart shows as
// under idmap=names: the kernel's overflow uid and gid ("nobody",
// "nogroup").
const NobodyID = 65534

// IDMapper is the server's IDMAP (name ↔ id of its accounts):
// *session.Tree, *session.Client and *Reconnector have it.
type IDMapper interface {
	MapID(ctx context.Context, kind session.IDKind, id uint32, name string) (uint32, string, error)
}

// LocalAccounts is this host's passwd and group databases; *share.Accounts
// (os/user, cached) is the one in use.
type LocalAccounts interface {
	UserName(uid uint32) (string, error)
	GroupName(gid uint32) (string, error)
	UserID(name string) (uint32, error)
	GroupID(name string) (uint32, error)
}

// Lifetimes of what IDMapNames learned: an account renamed or added shows
// within namesTTL; one unknown is asked again after missTTL.
const (
	namesTTL      = 10 * time.Minute
	missTTL       = time.Minute
	idLookupLimit = 5 * time.Second // one IDMAP question
	maxNames      = 4096            // cached answers before starting over
)

// IDMap maps owners between the server's ids and this host's (see
// IDMapMode). The nil *IDMap shows every owner as its server id. Safe for
// concurrent use.
type IDMap struct {
	mode   IDMapMode
	server IDMapper
	local  LocalAccounts
	log    logrus.FieldLogger

	mu sync.Mutex
	// uid and gid pair accounts with the local users acting as them.
	uid, gid idPairs
	// acting is the account each local user's operations act as; all,
	// when set, is the account everyone's do (a single-credential mount).
	acting map[uint32]Account
	all    *Account
	names  map[nameKey]nameEntry
}

// idPairs is a one-to-one map between server and local ids.
type idPairs struct{ toLocal, toServer map[uint32]uint32 }

func (p *idPairs) add(server, local uint32) {
	if p.toLocal == nil {
		p.toLocal, p.toServer = map[uint32]uint32{}, map[uint32]uint32{}
	}
	// The first pairing of either side wins: two local users acting as
	// one account cannot both show as its owner.
	if _, ok := p.toLocal[server]; ok {
		return
	}
	if _, ok := p.toServer[local]; ok {
		return
	}
	p.toLocal[server], p.toServer[local] = local, server
}

// nameKey is one question of IDMapNames: an id to map, in one direction.
type nameKey struct {
	toLocal bool
	group   bool
	id      uint32
}

type nameEntry struct {
	id  uint32
	ok  bool
	exp time.Time
}

// NewIDMap returns the owner map of a mount. server answers IDMAP (needed
// by IDMapNames only; nil maps every owner to NobodyID there); local nil
// means this host's databases.
func NewIDMap(mode IDMapMode, server IDMapper, local LocalAccounts, log logrus.FieldLogger) *IDMap {
	if local == nil {
		local = share.NewAccounts(share.AccountsConfig{})
	}
	if log == nil {
		log = Options{}.logger()
	}
	return &IDMap{mode: mode, server: server, local: local, log: log, acting: map[uint32]Account{}, names: map[nameKey]nameEntry{}}
}

// Mode is the map's mode (IDMapNone for nil).
func (m *IDMap) Mode() IDMapMode {
	if m == nil {
		return IDMapNone
	}
	return m.mode
}

// Bind records that local user uid (primary group gid) acts as account a:
// a's files show as uid's and gid's, and uid's chown to itself means a.
// A multiuser mount binds each user's session; a single-credential mount
// binds the mounting user (or uid=/gid=) and calls ActAsForAll.
func (m *IDMap) Bind(uid, gid uint32, a Account) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mode != IDMapNone {
		m.uid.add(a.Uid, uid)
		m.gid.add(a.Gid, gid)
	}
	m.acting[uid] = a
}

// ActAsForAll records that every local user's operations act as account a
// (one credential for the whole mount): chown to oneself means a, and
// access(2) is answered as a would be checked.
func (m *IDMap) ActAsForAll(a Account) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.all = &a
}

// accountOf is the account the caller's operations act as.
func (m *IDMap) accountOf(c *fuse.Caller) (Account, bool) {
	if m == nil || c == nil {
		return Account{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if a, ok := m.acting[c.Uid]; ok {
		return a, true
	}
	if m.all != nil {
		return *m.all, true
	}
	return Account{}, false
}

// Local returns a with its owner shown as this host's ids.
func (m *IDMap) Local(a session.Attr) session.Attr {
	if m == nil || m.mode == IDMapNone {
		return a
	}
	m.mu.Lock()
	u, uok := m.uid.toLocal[a.Uid]
	g, gok := m.gid.toLocal[a.Gid]
	m.mu.Unlock()
	switch {
	case uok:
		a.Uid = u
	case m.mode == IDMapNames:
		a.Uid = m.byName(nameKey{toLocal: true, id: a.Uid})
	}
	switch {
	case gok:
		a.Gid = g
	case m.mode == IDMapNames:
		a.Gid = m.byName(nameKey{toLocal: true, group: true, id: a.Gid})
	}
	return a
}

// errUnmappedOwner is a chown to a local id with no server counterpart:
// EINVAL, as NFSv4 answers a bad owner.
var errUnmappedOwner = syscall.EINVAL

// Server rewrites the owner a chown on the mount sets (s.Uid, s.Gid when
// Valid names them) as the server's ids. The caller's own uid (gid) is the
// account it acts as: `chown $USER f` by anyone on a single-credential
// mount gives f to the mount's account.
func (m *IDMap) Server(c *fuse.Caller, s *session.SetAttrIn) error {
	if m == nil || m.mode == IDMapNone || s.Valid&(session.SetUid|session.SetGid) == 0 {
		return nil
	}
	acct, acting := m.accountOf(c)
	if s.Valid&session.SetUid != 0 {
		id, err := m.toServer(c, acct, acting, false, s.Uid)
		if err != nil {
			return err
		}
		s.Uid = id
	}
	if s.Valid&session.SetGid != 0 {
		id, err := m.toServer(c, acct, acting, true, s.Gid)
		if err != nil {
			return err
		}
		s.Gid = id
	}
	return nil
}

func (m *IDMap) toServer(c *fuse.Caller, acct Account, acting, group bool, id uint32) (uint32, error) {
	if acting && c != nil {
		switch {
		case !group && id == c.Uid:
			return acct.Uid, nil
		case group && id == c.Gid:
			return acct.Gid, nil
		}
	}
	m.mu.Lock()
	p := &m.uid
	if group {
		p = &m.gid
	}
	s, ok := p.toServer[id]
	m.mu.Unlock()
	switch {
	case ok:
		return s, nil
	case m.mode != IDMapNames:
		return id, nil
	case id == NobodyID:
		return 0, errUnmappedOwner // "nobody" stands for owners without a name here
	}
	k := nameKey{group: group, id: id}
	if v, ok := m.lookupName(k); ok {
		return v, nil
	}
	return 0, errUnmappedOwner
}

// byName maps a server id to the local one of the same name, or NobodyID.
func (m *IDMap) byName(k nameKey) uint32 {
	if v, ok := m.lookupName(k); ok {
		return v
	}
	return NobodyID
}

// lookupName answers k through the names (cached): server id → server name
// (IDMAP) → local id, or local id → local name → server id (IDMAP).
func (m *IDMap) lookupName(k nameKey) (uint32, bool) {
	now := time.Now()
	m.mu.Lock()
	e, ok := m.names[k]
	m.mu.Unlock()
	if ok && now.Before(e.exp) {
		return e.id, e.ok
	}
	id, err := m.resolve(k)
	e = nameEntry{id: id, ok: err == nil, exp: now.Add(namesTTL)}
	if err != nil {
		e.exp = now.Add(missTTL)
		if !errors.Is(err, session.StatusNoneMapped) && !errors.Is(err, share.ErrNoName) {
			m.log.WithFields(logrus.Fields{"id": k.id, "group": k.group, "to_local": k.toLocal}).WithError(err).Warn("fs: owner lookup failed")
			if protocol.IsConnectionLost(err) || errors.Is(err, context.DeadlineExceeded) {
				return 0, false // not remembered: the server may be back soon
			}
		}
	}
	m.mu.Lock()
	if len(m.names) >= maxNames {
		m.names = map[nameKey]nameEntry{}
	}
	m.names[k] = e
	m.mu.Unlock()
	return e.id, e.ok
}

func (m *IDMap) resolve(k nameKey) (uint32, error) {
	if m.server == nil {
		return 0, share.ErrNoName
	}
	ctx, cancel := context.WithTimeout(context.Background(), idLookupLimit)
	defer cancel()
	byID, byName, localName, localID := session.IDUserByID, session.IDUserByName, m.local.UserName, m.local.UserID
	if k.group {
		byID, byName, localName, localID = session.IDGroupByID, session.IDGroupByName, m.local.GroupName, m.local.GroupID
	}
	if k.toLocal {
		_, name, err := m.server.MapID(ctx, byID, k.id, "")
		if err != nil {
			return 0, err
		}
		return localID(name)
	}
	name, err := localName(k.id)
	if err != nil {
		return 0, err
	}
	id, _, err := m.server.MapID(ctx, byName, 0, name)
	return id, err
}

// Owner mapping at the FUSE boundary.

// fillAttr fills out with a, its owner shown as this host's ids.
func (n *Node) fillAttr(out *fuse.Attr, a session.Attr) {
	fillAttr(out, n.fs.opts.Owners.Local(a))
}

// serverOwner rewrites a chown's ids as the server's (IDMap.Server).
func (n *Node) serverOwner(ctx context.Context, s *session.SetAttrIn) syscall.Errno {
	c, _ := fuse.FromContext(ctx)
	if err := n.fs.opts.Owners.Server(c, s); err != nil {
		return n.errno("chown", n.path(), err)
	}
	return 0
}

// treeAccount is the account the server reported for the tree connect
// (TREE_CONNECT's Account: the one every disk operation of the tree acts
// as).
func treeAccount(t *session.Tree) *Account {
	a := t.Account()
	return &Account{Name: a.Name, Uid: a.Uid, Gid: a.Gid, Groups: a.Groups, Shared: t.SharedAccount()}
}

// MapID asks the live session's server (IDMapper), waiting for a
// reconnect like any read-only call.
func (r *Reconnector) MapID(ctx context.Context, kind session.IDKind, id uint32, name string) (rid uint32, rname string, err error) {
	err = r.do(ctx, true, func(s *Session, _ uint64) error {
		m, ok := s.Tree.(IDMapper)
		if !ok {
			return protocol.StatusNotSupported
		}
		rid, rname, err = m.MapID(ctx, kind, id, name)
		return err
	})
	return rid, rname, err
}

// Account is the account the current session acts as on the server, if
// the server said.
func (r *Reconnector) Account() (Account, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil || r.cur.Account == nil {
		return Account{}, false
	}
	return *r.cur.Account, true
}

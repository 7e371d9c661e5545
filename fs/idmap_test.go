package fs

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// fakeAccounts is an account database: names by id, for users and groups.
type fakeAccounts struct {
	users, groups map[uint32]string
}

func lookupName(m map[uint32]string, id uint32) (string, error) {
	if n, ok := m[id]; ok {
		return n, nil
	}
	return "", share.ErrNoName
}

func lookupID(m map[uint32]string, name string) (uint32, error) {
	for id, n := range m {
		if n == name {
			return id, nil
		}
	}
	return 0, share.ErrNoName
}

func (a fakeAccounts) UserName(uid uint32) (string, error)  { return lookupName(a.users, uid) }
func (a fakeAccounts) GroupName(gid uint32) (string, error) { return lookupName(a.groups, gid) }
func (a fakeAccounts) UserID(name string) (uint32, error)   { return lookupID(a.users, name) }
func (a fakeAccounts) GroupID(name string) (uint32, error)  { return lookupID(a.groups, name) }

// fakeIDMAP is a server answering IDMAP from its accounts, counting
// questions; fail makes every question fail with that error.
type fakeIDMAP struct {
	accts fakeAccounts
	mu    sync.Mutex
	asked int
	fail  error
}

func (f *fakeIDMAP) MapID(_ context.Context, kind session.IDKind, id uint32, name string) (uint32, string, error) {
	f.mu.Lock()
	f.asked++
	fail := f.fail
	f.mu.Unlock()
	if fail != nil {
		return 0, "", fail
	}
	var err error
	switch kind {
	case session.IDUserByID:
		name, err = f.accts.UserName(id)
	case session.IDGroupByID:
		name, err = f.accts.GroupName(id)
	case session.IDUserByName:
		id, err = f.accts.UserID(name)
	case session.IDGroupByName:
		id, err = f.accts.GroupID(name)
	}
	if err != nil {
		return 0, "", session.StatusNoneMapped
	}
	return id, name, nil
}

func (f *fakeIDMAP) questions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked
}

func caller(uid, gid uint32) *fuse.Caller { return &fuse.Caller{Owner: fuse.Owner{Uid: uid, Gid: gid}} }

// owner is what Local shows for a file owned by uid:gid on the server.
func owner(m *IDMap, uid, gid uint32) [2]uint32 {
	a := m.Local(session.Attr{Uid: uid, Gid: gid, Mode: 0o100644, Size: 7})
	return [2]uint32{a.Uid, a.Gid}
}

// chown is what Server sends for a chown to uid:gid by c.
func chown(m *IDMap, c *fuse.Caller, uid, gid uint32) ([2]uint32, error) {
	s := session.SetAttrIn{Valid: session.SetUid | session.SetGid, Uid: uid, Gid: gid}
	err := m.Server(c, &s)
	return [2]uint32{s.Uid, s.Gid}, err
}

func TestIDMapUser(t *testing.T) {
	// A single-credential mount made by uid 1000 (gid 100) whose account
	// is 500:600 on the server; 7:8 is another server owner.
	m := NewIDMap(IDMapUser, nil, fakeAccounts{}, nil)
	acct := Account{Name: "svc", Uid: 500, Gid: 600}
	m.Bind(1000, 100, acct)
	m.ActAsForAll(acct)
	if got := owner(m, 500, 600); got != [2]uint32{1000, 100} {
		t.Errorf("the account's file shows as %v, want the mounting user 1000:100", got)
	}
	if got := owner(m, 7, 8); got != [2]uint32{7, 8} {
		t.Errorf("another owner shows as %v, want its server ids 7:8", got)
	}
	if got := owner(m, 500, 8); got != [2]uint32{1000, 8} {
		t.Errorf("uid and gid map apart: %v, want 1000:8", got)
	}
	a := m.Local(session.Attr{Uid: 500, Gid: 600, Mode: 0o100640, Size: 7, Ino: 9})
	if a.Mode != 0o100640 || a.Size != 7 || a.Ino != 9 {
		t.Errorf("Local changed more than the owner: %+v", a)
	}
	for _, tc := range []struct {
		c        *fuse.Caller
		uid, gid uint32
		want     [2]uint32
	}{
		{caller(2000, 2000), 2000, 2000, [2]uint32{500, 600}}, // anyone's chown to oneself: the account
		{caller(1000, 100), 1000, 100, [2]uint32{500, 600}},   // the mounting user's too
		{caller(2000, 2000), 1000, 100, [2]uint32{500, 600}},  // to the owner shown: the account
		{caller(2000, 2000), 7, 8, [2]uint32{7, 8}},           // others: as they are
		{nil, 2000, 2000, [2]uint32{2000, 2000}},              // no caller: nothing to map by
	} {
		if got, err := chown(m, tc.c, tc.uid, tc.gid); err != nil || got != tc.want {
			t.Errorf("chown %d:%d by %v → %v %v, want %v", tc.uid, tc.gid, tc.c, got, err, tc.want)
		}
	}
	// Only the fields set are touched.
	s := session.SetAttrIn{Valid: session.SetMode, Mode: 0o600, Uid: 2000}
	if err := m.Server(caller(2000, 2000), &s); err != nil || s.Uid != 2000 {
		t.Errorf("chmod: %+v %v", s, err)
	}
}

func TestIDMapNone(t *testing.T) {
	m := NewIDMap(IDMapNone, nil, fakeAccounts{}, nil)
	m.Bind(1000, 100, Account{Uid: 500, Gid: 600})
	if got := owner(m, 500, 600); got != [2]uint32{500, 600} {
		t.Errorf("idmap=none shows %v, want the server ids", got)
	}
	if got, err := chown(m, caller(1000, 100), 1000, 100); err != nil || got != [2]uint32{1000, 100} {
		t.Errorf("idmap=none chown: %v %v", got, err)
	}
	var nilMap *IDMap
	if got := owner(nilMap, 5, 6); got != [2]uint32{5, 6} || nilMap.Mode() != IDMapNone {
		t.Errorf("nil map: %v %v", got, nilMap.Mode())
	}
	if _, ok := nilMap.accountOf(caller(1, 1)); ok {
		t.Error("nil map knows an account")
	}
}

func TestIDMapNames(t *testing.T) {
	srv := &fakeIDMAP{accts: fakeAccounts{
		users:  map[uint32]string{500: "alice", 501: "bob", 502: "carol"},
		groups: map[uint32]string{600: "staff", 601: "ops"},
	}}
	local := fakeAccounts{
		users:  map[uint32]string{1500: "alice", 1502: "carol", 4000: "dave"},
		groups: map[uint32]string{1600: "staff"},
	}
	m := NewIDMap(IDMapNames, srv, local, nil)
	// carol's session: logged on as server account 502, local uid 3333
	// (a different name here): the session pairs them.
	m.Bind(3333, 1600, Account{Name: "carol", Uid: 502, Gid: 600})
	for _, tc := range []struct {
		uid, gid uint32
		want     [2]uint32
	}{
		{500, 600, [2]uint32{1500, 1600}},         // by name
		{501, 601, [2]uint32{NobodyID, NobodyID}}, // no local bob, no local ops
		{999, 999, [2]uint32{NobodyID, NobodyID}}, // no server name
		{502, 600, [2]uint32{3333, 1600}},         // the session's pair wins over the name
	} {
		if got := owner(m, tc.uid, tc.gid); got != tc.want {
			t.Errorf("server %d:%d shows as %v, want %v", tc.uid, tc.gid, got, tc.want)
		}
	}
	asked := srv.questions()
	owner(m, 500, 600)
	owner(m, 501, 601)
	if srv.questions() != asked {
		t.Errorf("answers (and misses) are not cached: %d more questions", srv.questions()-asked)
	}
	for _, tc := range []struct {
		c        *fuse.Caller
		uid, gid uint32
		want     [2]uint32
		err      error
	}{
		{caller(1500, 1600), 1500, 1600, [2]uint32{500, 600}, nil},    // alice by name
		{caller(3333, 1600), 3333, 1600, [2]uint32{502, 600}, nil},    // carol: her session's account
		{caller(1500, 1600), 3333, 1600, [2]uint32{502, 600}, nil},    // to carol, by alice: the pair
		{caller(1500, 1600), 4000, 1600, [2]uint32{}, syscall.EINVAL}, // dave: no server account
		{caller(1500, 1600), NobodyID, 1600, [2]uint32{}, syscall.EINVAL},
	} {
		got, err := chown(m, tc.c, tc.uid, tc.gid)
		if !errors.Is(err, tc.err) || err == nil && got != tc.want {
			t.Errorf("chown %d:%d by %d → %v %v, want %v %v", tc.uid, tc.gid, tc.c.Uid, got, err, tc.want, tc.err)
		}
	}
	// A server that cannot answer: nobody, logged, and asked again next
	// time (not remembered as unknown).
	srv2 := &fakeIDMAP{accts: srv.accts, fail: &protocol.ConnectionError{Conn: "session", Err: errors.New("reset")}}
	m2 := NewIDMap(IDMapNames, srv2, local, nil)
	if got := owner(m2, 500, 600); got != [2]uint32{NobodyID, NobodyID} {
		t.Errorf("server away: %v, want nobody", got)
	}
	srv2.mu.Lock()
	srv2.fail = nil
	srv2.mu.Unlock()
	if got := owner(m2, 500, 600); got != [2]uint32{1500, 1600} {
		t.Errorf("server back: %v, want 1500:1600 (a lost connection must not be cached)", got)
	}
	// Without a server to ask (nil), every owner is nobody.
	if got := owner(NewIDMap(IDMapNames, nil, local, nil), 500, 600); got != [2]uint32{NobodyID, NobodyID} {
		t.Errorf("no server: %v", got)
	}
}

// TestIDMapPairsOneToOne: a second local user acting as an account already
// paired does not take it over, and is still that account for chown.
func TestIDMapPairsOneToOne(t *testing.T) {
	m := NewIDMap(IDMapUser, nil, fakeAccounts{}, nil)
	m.Bind(1000, 100, Account{Uid: 500, Gid: 600})
	m.Bind(2000, 200, Account{Uid: 500, Gid: 600})
	if got := owner(m, 500, 600); got != [2]uint32{1000, 100} {
		t.Errorf("shows as %v, want the first pair 1000:100", got)
	}
	if got, err := chown(m, caller(2000, 200), 2000, 200); err != nil || got != [2]uint32{500, 600} {
		t.Errorf("the second user's chown to self: %v %v", got, err)
	}
	if a, ok := m.accountOf(caller(2000, 200)); !ok || a.Uid != 500 {
		t.Errorf("accountOf the second user: %v %v", a, ok)
	}
}

func TestParseIDMapMode(t *testing.T) {
	for _, s := range []string{"user", "none", "names"} {
		m, err := ParseIDMapMode(s)
		if err != nil || m.String() != s {
			t.Errorf("%q → %v %v", s, m, err)
		}
	}
	if _, err := ParseIDMapMode("file"); err == nil {
		t.Error("idmap=file accepted")
	}
}

func TestMayAccess(t *testing.T) {
	const r, w, x = 4, 2, 1
	acct := Account{Uid: 500, Gid: 600}
	file := func(uid, gid, mode uint32) session.Attr {
		return session.Attr{Uid: uid, Gid: gid, Mode: syscall.S_IFREG | mode}
	}
	dir := func(uid, gid, mode uint32) session.Attr {
		return session.Attr{Uid: uid, Gid: gid, Mode: syscall.S_IFDIR | mode}
	}
	for _, tc := range []struct {
		name string
		acct Account
		a    session.Attr
		mask uint32
		want bool
	}{
		{"owner rw of 0600", acct, file(500, 1, 0o600), r | w, true},
		{"owner x of 0600", acct, file(500, 1, 0o600), x, false},
		{"owner of 0077 file", acct, file(500, 600, 0o077), r, false},
		{"chdir into own 0700", acct, dir(500, 1, 0o700), x, true},
		{"group r of 0640", acct, file(1, 600, 0o640), r, true},
		{"group w of 0640", acct, file(1, 600, 0o640), w, false},
		{"other r of 0604", acct, file(1, 1, 0o604), r, true},
		{"other w of 0644", acct, file(1, 1, 0o644), w, false},
		{"unknown group's w (generous)", acct, file(1, 1, 0o660), w, true},
		{"supplementary group's w", Account{Uid: 500, Gid: 600, Groups: []uint32{27}}, file(1, 27, 0o660), w, true},
		{"other group's w, groups known", Account{Uid: 500, Gid: 600, Groups: []uint32{27}}, file(1, 1, 0o660), w, false},
		{"other's r, groups known", Account{Uid: 500, Gid: 600, Groups: []uint32{}}, file(1, 1, 0o604), r, true},
		{"existence", acct, file(1, 1, 0), 0, true},
		{"root reads 0000", Account{}, file(1, 1, 0), r | w, true},
		{"root x of 0644", Account{}, file(1, 1, 0o644), x, false},
		{"root x of 0100", Account{}, file(1, 1, 0o100), x, true},
		{"root chdir 0000", Account{}, dir(1, 1, 0), x, true},
	} {
		if got := mayAccess(tc.acct, tc.a, tc.mask); got != tc.want {
			t.Errorf("%s: mayAccess = %v, want %v", tc.name, got, tc.want)
		}
	}
}

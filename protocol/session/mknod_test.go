package session

import (
	"encoding/hex"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
)

func init() {
	// The round-trip, prefix and fuzz tests (frame_test.go) take every
	// body from samples: these are MKNOD's and IDMAP's, every field set.
	samples = append(samples,
		&mknodReq{Path: "d/fifo", Mode: unix.S_IFCHR | 0o640, Rdev: 0x0103},
		&idMapMsg{Kind: uint32(IDGroupByName), ID: 1000, Name: "staff"},
	)
}

func TestMknodIDMapGolden(t *testing.T) {
	// MKNOD: path (u16 count + bytes), Mode u32, Rdev u32.
	want := "0100" + "66" + "80110000" + "03010000"
	if got := hex.EncodeToString(marshal(&mknodReq{Path: "f", Mode: unix.S_IFIFO | 0o600, Rdev: 0x103})); got != want {
		t.Errorf("mknodReq = %s, want %s", got, want)
	}
	// IDMAP: Kind u32, ID u32, Name (u16 count + bytes).
	want = "03000000" + "e8030000" + "0300" + "626f62"
	if got := hex.EncodeToString(marshal(&idMapMsg{Kind: 3, ID: 1000, Name: "bob"})); got != want {
		t.Errorf("idMapMsg = %s, want %s", got, want)
	}
	if CmdMknod != 37 || CmdIDMap != 45 || CmdMknod.String() != "MKNOD" || CmdIDMap.String() != "IDMAP" {
		t.Errorf("command numbers: MKNOD %d %v, IDMAP %d %v (WAVE2 reserves 37 and 45)", CmdMknod, CmdMknod, CmdIDMap, CmdIDMap)
	}
}

func TestMknod(t *testing.T) {
	resolvers(t, func(t *testing.T, e *env) {
		tr := e.tree("data")
		ctx := ctxT(t)
		if _, err := tr.Mkdir(ctx, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			mode uint32
		}{{"d/fifo", unix.S_IFIFO | 0o640}, {"d/sock", unix.S_IFSOCK | 0o755}, {"d/reg", unix.S_IFREG | 0o604}, {"d/zero", 0o600}} {
			a, err := tr.Mknod(ctx, c.name, c.mode|unix.S_ISUID, 77)
			if c.mode&unix.S_IFMT == 0 {
				c.mode |= unix.S_IFREG // mknod(2)'s type 0 is a regular file
			}
			if err != nil {
				t.Fatalf("Mknod %s: %v", c.name, err)
			}
			if a.Mode != c.mode || a.Rdev != 0 {
				t.Errorf("Mknod %s: mode %o rdev %d, want %o and 0 (no set-id bits, no device number)", c.name, a.Mode, a.Rdev, c.mode)
			}
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(e.share, c.name), &st); err != nil || st.Mode != c.mode {
				t.Errorf("%s on the server's disk: mode %o %v, want %o", c.name, st.Mode, err, c.mode)
			}
		}
		_, err := tr.Mknod(ctx, "d/fifo", unix.S_IFIFO|0o600, 0)
		wantErrno(t, "Mknod over an existing name", err, syscall.EEXIST)
		// Device nodes: refused without allow_devices, EPERM, and
		// nothing is made.
		for _, typ := range []uint32{unix.S_IFCHR, unix.S_IFBLK} {
			_, err := tr.Mknod(ctx, "d/dev", typ|0o666, 0x0103)
			wantErrno(t, "Mknod a device", err, syscall.EPERM)
		}
		if _, err := os.Lstat(filepath.Join(e.share, "d/dev")); !os.IsNotExist(err) {
			t.Errorf("a refused device node exists: %v", err)
		}
		for _, typ := range []uint32{unix.S_IFDIR, unix.S_IFLNK, 0o170000} {
			_, err := tr.Mknod(ctx, "d/bad", typ|0o644, 0)
			wantErrno(t, "Mknod of type "+strconv.FormatUint(uint64(typ), 8), err, syscall.EINVAL)
		}
		// Confined as every other name.
		_, err = tr.Mknod(ctx, "../outside/fifo", unix.S_IFIFO|0o644, 0)
		wantErrno(t, "Mknod outside the share", err, syscall.EACCES)
		if _, err := os.Lstat(filepath.Join(e.outside, "fifo")); !os.IsNotExist(err) {
			t.Errorf("a FIFO was made outside the share: %v", err)
		}
		// The node is listed and stat-able, but OPEN refuses it (the client
		// opens FIFOs and sockets locally).
		ents, err := tr.ReadDir(ctx, "d")
		if err != nil || len(ents) != 4 {
			t.Fatalf("ReadDir: %v %v", ents, err)
		}
		_, _, err = tr.Open(ctx, "d/fifo", os.O_RDONLY|unix.O_NONBLOCK, 0)
		if err == nil {
			t.Error("OPEN of a FIFO succeeded")
		}
		if err := tr.Unlink(ctx, "d/sock"); err != nil {
			t.Errorf("Unlink a socket node: %v", err)
		}
	})
}

// TestMknodDevices: on a share with allow_devices MKNOD makes device nodes
// as the tree's account — root's is made (CAP_MKNOD) with its number and
// owner; an ordinary account's is refused by the kernel, EPERM, and none
// is made — and without allow_devices even root's is refused.
func TestMknodDevices(t *testing.T) {
	if !share.PerUser() {
		t.Skip("SKIP: not root: no device nodes, and every user acts as the server's account")
	}
	root := share.Account{Name: "root"}
	nobody := share.Account{Name: "nobody", Uid: 65534, Gid: 65534}
	e := newEnv(t, func(c *ServerConfig) {
		c.Accounts = share.AccountsConfig{Map: map[string]string{testUser: "root", "bob": "nobody"}, Lookup: accountsOf(root, nobody)}
		c.Shares = append(c.Shares, share.Config{Name: "devs", Path: e0(c), AllowDevices: true, AllowRoot: true},
			share.Config{Name: "nodevs", Path: e0(c), AllowRoot: true})
	})
	// A directory nobody may create in: the kernel's CAP_MKNOD check is
	// then what refuses it.
	open := filepath.Join(e.share, "open")
	if err := os.Mkdir(open, 0o777); err != nil || os.Chmod(open, 0o777) != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	devs := e.tree("devs")
	dev := unix.Mkdev(1, 3)
	a, err := devs.Mknod(ctx, "open/null", unix.S_IFCHR|0o666, uint32(dev))
	var st unix.Stat_t
	if err != nil || a.Mode&unix.S_IFMT != unix.S_IFCHR || uint64(a.Rdev) != dev {
		t.Errorf("Mknod a device as root with allow_devices: %+v %v", a, err)
	} else if err := unix.Lstat(filepath.Join(open, "null"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != dev || st.Uid != 0 {
		t.Errorf("the device node on the server's disk: %+v %v", st, err)
	}
	_, err = e.tree("nodevs").Mknod(ctx, "open/null2", unix.S_IFCHR|0o666, uint32(dev))
	wantErrno(t, "Mknod a device as root without allow_devices", err, syscall.EPERM)
	bt := e.treeAs("bob", "bob's", "devs")
	_, err = bt.Mknod(ctx, "open/bobs", unix.S_IFBLK|0o660, uint32(dev))
	wantErrno(t, "Mknod a device as an ordinary account", err, syscall.EPERM)
	// The same account may make a FIFO there, owned by it.
	if a, err := bt.Mknod(ctx, "open/fifo", unix.S_IFIFO|0o600, 0); err != nil || a.Uid != nobody.Uid {
		t.Errorf("Mknod a FIFO as nobody: %+v %v, want owned by %d", a, err, nobody.Uid)
	}
	for _, n := range []string{"null2", "bobs"} {
		if _, err := os.Lstat(filepath.Join(open, n)); !os.IsNotExist(err) {
			t.Errorf("refused device node %s exists: %v", n, err)
		}
	}
}

// TestMknodReadOnlyShare: the read-only rule comes before the device
// policy.
func TestMknodReadOnlyShare(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("ro")
	_, err := tr.Mknod(ctxT(t), "fifo", unix.S_IFIFO|0o644, 0)
	if err != protocol.StatusAccessDenied {
		t.Errorf("Mknod on a read-only share: %v, want ACCESS_DENIED", err)
	}
	_, err = tr.Mknod(ctxT(t), "dev", unix.S_IFCHR|0o644, 0x103)
	if err != protocol.StatusAccessDenied {
		t.Errorf("Mknod of a device on a read-only share: %v, want ACCESS_DENIED", err)
	}
}

func TestIDMap(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	ctx := ctxT(t)
	me, err := user.Current()
	if err != nil {
		t.Skip(err)
	}
	uid, _ := strconv.ParseUint(me.Uid, 10, 32)
	gid, _ := strconv.ParseUint(me.Gid, 10, 32)
	grp, err := user.LookupGroupId(me.Gid)
	if err != nil {
		t.Skip(err)
	}
	if _, name, err := tr.MapID(ctx, IDUserByID, uint32(uid), ""); err != nil || name != me.Username {
		t.Errorf("uid %d → %q %v, want %q", uid, name, err, me.Username)
	}
	if id, _, err := tr.MapID(ctx, IDUserByName, 0, me.Username); err != nil || uint64(id) != uid {
		t.Errorf("user %q → %d %v, want %d", me.Username, id, err, uid)
	}
	if _, name, err := tr.MapID(ctx, IDGroupByID, uint32(gid), ""); err != nil || name != grp.Name {
		t.Errorf("gid %d → %q %v, want %q", gid, name, err, grp.Name)
	}
	if id, _, err := tr.MapID(ctx, IDGroupByName, 0, grp.Name); err != nil || uint64(id) != gid {
		t.Errorf("group %q → %d %v, want %d", grp.Name, id, err, gid)
	}
	for _, q := range []struct {
		kind IDKind
		id   uint32
		name string
	}{
		{IDUserByID, 3_999_999_999, ""}, {IDGroupByID, 3_999_999_999, ""},
		{IDUserByName, 0, "no-such-user-lwio"}, {IDGroupByName, 0, "no-such-group-lwio"},
		{IDUserByName, 0, "0"}, {IDUserByName, 0, ""}, {IDUserByName, 0, "a:b"},
	} {
		if _, _, err := tr.MapID(ctx, q.kind, q.id, q.name); err != StatusNoneMapped {
			t.Errorf("MapID(%d, %d, %q): %v, want NONE_MAPPED", q.kind, q.id, q.name, err)
		}
	}
	if _, _, err := tr.MapID(ctx, 9, 0, ""); err != protocol.StatusInvalidParameter {
		t.Errorf("MapID of kind 9: %v, want INVALID_PARAMETER", err)
	}
	// Session-scoped: no tree needed, and the session still works after.
	if _, _, err := tr.Client().MapID(ctx, IDUserByID, uint32(uid), ""); err != nil {
		t.Errorf("MapID on the client: %v", err)
	}
}

// TestIDMapAccounts: IDMAP's user names come from the lookup logons use
// (one account database for both).
func TestIDMapAccounts(t *testing.T) {
	carol := share.Account{Name: "carol-lwio", Uid: 61234, Gid: 61234}
	e := newEnv(t, func(c *ServerConfig) {
		c.Accounts = share.AccountsConfig{Map: map[string]string{testUser: "carol-lwio"}, Lookup: accountsOf(carol)}
	})
	tr := e.tree("data")
	if id, _, err := tr.MapID(ctxT(t), IDUserByName, 0, "carol-lwio"); err != nil || id != carol.Uid {
		t.Errorf("user carol-lwio → %d %v, want %d (the account lookup's)", id, err, carol.Uid)
	}
	if _, _, err := tr.MapID(ctxT(t), IDUserByName, 0, "no-such-user-lwio"); err != StatusNoneMapped {
		t.Errorf("an account the lookup does not know: %v, want NONE_MAPPED", err)
	}
}

// TestIDMapNeedsLogon: before session setup IDMAP is refused like every
// other command.
func TestIDMapNeedsLogon(t *testing.T) {
	e := newEnv(t)
	conn := dialFrom(t, "127.0.0.1", e.addr)
	body := marshal(&idMapMsg{Kind: uint32(IDUserByID)})
	if _, err := conn.Write(AppendFrame(nil, Header{MessageID: 1, Command: CmdIDMap}, body)); err != nil {
		t.Fatal(err)
	}
	f, _, err := ReadFrame(conn)
	if err != nil {
		t.Fatal(err)
	}
	if f.Status != protocol.StatusAccessDenied || len(f.Body) != 0 {
		t.Errorf("IDMAP before logon: status %v, %d body bytes; want ACCESS_DENIED and nothing", f.Status, len(f.Body))
	}
}

func TestRegisterTwicePanics(t *testing.T) {
	for _, c := range []Command{CmdMknod, CmdGetAttr, cmdLimit} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("registering command %d again did not panic", c)
				}
			}()
			register(c, "AGAIN", func() message { return new(empty) }, func() message { return new(empty) })
		}()
	}
	if CmdMknod.String() != "MKNOD" {
		t.Errorf("a refused registration changed MKNOD's name: %v", CmdMknod)
	}
}

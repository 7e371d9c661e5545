package session

import (
	"encoding/hex"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
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
		// Device nodes: refused (no share allows them yet), EPERM, and
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

// TestIDMapNeedsLogon: before session setup IDMAP is refused like every
// other command.
func TestIDMapNeedsLogon(t *testing.T) {
	e := newEnv(t)
	conn, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
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

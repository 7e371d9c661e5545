package hostile

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
)

// rawSession is a session channel client written by hand: it runs the
// NTLM session setup itself and then sends whatever frames a test builds,
// signed or not.
type rawSession struct {
	t   testing.TB
	nc  net.Conn
	key []byte // the NTLM exported session key
	id  uint64 // the session id
	msg uint64 // the last message id sent
	// authTok is the AUTHENTICATE message sent: what an observer of the
	// setup captures.
	authTok []byte
}

const sigOffset = 40 // Signature in the frame header (docs/session.md)

// frame encodes a request; key non-nil signs it (FlagSigned set,
// HMAC-SHA256/16 over the frame with a zero signature).
func frame(h session.Header, body []byte, key []byte) []byte {
	if key != nil {
		h.Flags |= session.FlagSigned
	}
	raw := session.AppendFrame(nil, h, body)
	if key != nil {
		sig := smbauth.Sign(key, raw)
		copy(raw[sigOffset:], sig[:])
	}
	return raw
}

func blob(b []byte) []byte {
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(b))), b...)
}

// setupBody is a SESSION_SETUP request body: the NTLMSSP token and the
// SealOffer of a client that cannot seal (flags 0, no cipher;
// docs/session.md, "Sealing").
func setupBody(tok []byte) []byte { return append(blob(tok), 0, 0, 0, 0) }

// dialRaw connects and runs session setup with password (the server
// answers LOGON_FAILURE to a wrong one: setup then returns that status).
func dialRaw(t testing.TB, s *rig.Server, password string) (*rawSession, protocol.Status) {
	t.Helper()
	return dialRawFrom(t, s, "", password)
}

// dialRawFrom is dialRaw from the local address src ("" any).
func dialRawFrom(t testing.TB, s *rig.Server, src, password string) (*rawSession, protocol.Status) {
	t.Helper()
	d := net.Dialer{}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	nc, err := d.Dial("tcp", s.SessionAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	r := &rawSession{t: t, nc: nc}
	cl := smbauth.NewClient(smbauth.ClientConfig{User: rig.User, Password: password, Workstation: "hostile"})
	neg, err := cl.Negotiate()
	if err != nil {
		t.Fatal(err)
	}
	r.write(frame(session.Header{MessageID: r.nextID(), Command: session.CmdSessionSetup}, setupBody(neg), nil))
	f := r.read("NEGOTIATE")
	if f.Status != protocol.StatusMoreProcessingReq || len(f.Body) < 4 {
		t.Fatalf("NEGOTIATE answered %v", f.Status)
	}
	auth, key, err := cl.Authenticate(f.Body[4:])
	if err != nil {
		t.Fatal(err)
	}
	r.authTok = auth
	r.write(frame(session.Header{MessageID: r.nextID(), Command: session.CmdSessionSetup}, setupBody(auth), nil))
	f = r.read("AUTHENTICATE")
	if f.Status != protocol.StatusSuccess {
		return r, f.Status
	}
	if f.Flags&session.FlagSigned == 0 {
		t.Fatal("final SESSION_SETUP response not signed")
	}
	r.key, r.id = key, f.SessionID
	return r, f.Status
}

func (r *rawSession) nextID() uint64 { r.msg++; return r.msg }

func (r *rawSession) write(b []byte) {
	r.t.Helper()
	r.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.nc.Write(b); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// read reads the next frame, failing the test if none comes.
func (r *rawSession) read(why string) session.Frame {
	r.t.Helper()
	r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, _, err := session.ReadFrame(r.nc)
	if err != nil {
		r.t.Fatalf("%s: %v", why, err)
	}
	return f
}

// wantClosed expects the server to close the connection without another
// frame.
func (r *rawSession) wantClosed(why string) {
	r.t.Helper()
	r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, _, err := session.ReadFrame(r.nc)
	if err == nil {
		r.t.Fatalf("%s: server answered (%v, status %v), want the connection closed", why, f.Command, f.Status)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		r.t.Fatalf("%s: connection still open after 10 s", why)
	}
}

// echo builds a signed ECHO with message id id.
func (r *rawSession) echo(id uint64) []byte {
	return frame(session.Header{MessageID: id, Command: session.CmdEcho, SessionID: r.id}, nil, r.key)
}

// wantEcho sends a good ECHO and expects its signed answer.
func (r *rawSession) wantEcho() {
	r.t.Helper()
	id := r.nextID()
	r.write(r.echo(id))
	f := r.read("ECHO")
	if f.MessageID != id || f.Status != protocol.StatusSuccess || f.Flags&session.FlagSigned == 0 {
		r.t.Fatalf("ECHO answered id %d status %v flags %#x", f.MessageID, f.Status, f.Flags)
	}
}

// TestSessionFrames sends frames a session must refuse after setup: bad
// or missing signatures, tampered and replayed frames, frames of another
// session. Each ends the connection with no answer.
func TestSessionFrames(t *testing.T) {
	s := newServer(t, rig.Options{})
	other, _ := dialRaw(t, s, rig.Password)
	other.wantEcho()
	captured := other.echo(1000) // valid on its own session
	cases := []struct {
		name string
		send func(r *rawSession) []byte
	}{
		{"bad signature", func(r *rawSession) []byte {
			b := r.echo(r.nextID())
			b[sigOffset] ^= 1
			return b
		}},
		{"body tampered after signing", func(r *rawSession) []byte {
			b := frame(session.Header{MessageID: r.nextID(), Command: session.CmdGetAttr, SessionID: r.id}, []byte{1, 0, 'x'}, r.key)
			b[len(b)-1] = 'y'
			return b
		}},
		{"TreeID tampered after signing", func(r *rawSession) []byte {
			b := r.echo(r.nextID())
			b[32] ^= 1
			return b
		}},
		{"unsigned frame", func(r *rawSession) []byte {
			return frame(session.Header{MessageID: r.nextID(), Command: session.CmdEcho, SessionID: r.id}, nil, nil)
		}},
		{"replayed frame (same message id)", func(r *rawSession) []byte {
			b := r.echo(r.nextID())
			r.write(b)
			if f := r.read("the original"); f.Status != protocol.StatusSuccess {
				t.Fatalf("original ECHO: %v", f.Status)
			}
			return b
		}},
		{"older message id, correctly signed", func(r *rawSession) []byte {
			r.msg += 5
			r.wantEcho()
			return r.echo(r.msg - 2)
		}},
		{"frame captured on another session", func(r *rawSession) []byte { return captured }},
		{"own SessionID, another session's key", func(r *rawSession) []byte {
			return frame(session.Header{MessageID: r.nextID(), Command: session.CmdEcho, SessionID: r.id}, nil, other.key)
		}},
		{"another SessionID, own key", func(r *rawSession) []byte {
			return frame(session.Header{MessageID: r.nextID(), Command: session.CmdEcho, SessionID: other.id}, nil, r.key)
		}},
		{"response flag from a client", func(r *rawSession) []byte {
			return frame(session.Header{MessageID: r.nextID(), Command: session.CmdEcho, SessionID: r.id, Flags: session.FlagResponse}, nil, r.key)
		}},
		{"unknown flag", func(r *rawSession) []byte {
			return frame(session.Header{MessageID: r.nextID(), Command: session.CmdEcho, SessionID: r.id, Flags: 0x80}, nil, r.key)
		}},
		{"Length beyond the frame limit", func(r *rawSession) []byte {
			b := r.echo(r.nextID())
			binary.LittleEndian.PutUint32(b, session.MaxFrameSize+1)
			return b
		}},
		{"malformed body, correctly signed", func(r *rawSession) []byte {
			return frame(session.Header{MessageID: r.nextID(), Command: session.CmdGetAttr, SessionID: r.id}, []byte{0xff}, r.key)
		}},
		{"MKNOD body without its Rdev", func(r *rawSession) []byte {
			body := append(str16("fifo"), 0, 0x10, 0, 0)
			return frame(session.Header{MessageID: r.nextID(), Command: session.CmdMknod, SessionID: r.id}, body, r.key)
		}},
		{"IDMAP body with a trailing byte", func(r *rawSession) []byte {
			body := append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, uint32(session.IDUserByID)), 0), append(str16(""), 7)...)
			return frame(session.Header{MessageID: r.nextID(), Command: session.CmdIDMap, SessionID: r.id}, body, r.key)
		}},
	}
	for _, c := range cases {
		r, st := dialRaw(t, s, rig.Password)
		if st != protocol.StatusSuccess {
			t.Fatalf("session setup: %v", st)
		}
		r.wantEcho()
		r.write(c.send(r))
		r.wantClosed(c.name)
		other.wantEcho() // the other session goes on
		s.Check(t)
	}
	figures.Add(t, "%d forged or replayed session frames: %d connections closed without an answer; the other session and a new client served after each", len(cases), len(cases))
}

// TestSessionSetupRefused: commands before setup are refused without
// ending the connection; wrong passwords get LOGON_FAILURE and the third
// ends it.
func TestSessionSetupRefused(t *testing.T) {
	s := newServer(t, rig.Options{})
	nc, err := net.Dial("tcp", s.SessionAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := &rawSession{t: t, nc: nc}
	for _, cmd := range []session.Command{session.CmdTreeConnect, session.CmdGetAttr, session.CmdOpen, session.CmdPipeOpen, session.CmdEcho} {
		r.write(frame(session.Header{MessageID: r.nextID(), Command: cmd}, blob(nil), nil))
		if f := r.read(cmd.String()); f.Status != protocol.StatusAccessDenied {
			t.Fatalf("%v before session setup answered %v", cmd, f.Status)
		}
	}
	// Signed with a made-up key before setup: still just refused.
	r.write(frame(session.Header{MessageID: r.nextID(), Command: session.CmdTreeConnect, SessionID: 12345}, blob(nil), []byte("0123456789abcdef")))
	if f := r.read("forged signed TREE_CONNECT"); f.Status != protocol.StatusAccessDenied {
		t.Fatalf("forged signed frame before setup answered %v", f.Status)
	}
	failures := 0
	for i := 0; i < 3; i++ {
		r, st := dialRaw(t, s, "wrong password")
		if st != protocol.StatusLogonFailure {
			t.Fatalf("wrong password: %v", st)
		}
		failures++
		_ = r
	}
	// Three failures on one connection end it.
	nc2, err := net.Dial("tcp", s.SessionAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	r2 := &rawSession{t: t, nc: nc2}
	for i := 0; i < 3; i++ {
		cl := smbauth.NewClient(smbauth.ClientConfig{User: rig.User, Password: "nope", Workstation: "hostile"})
		neg, _ := cl.Negotiate()
		r2.write(frame(session.Header{MessageID: r2.nextID(), Command: session.CmdSessionSetup}, setupBody(neg), nil))
		f := r2.read("NEGOTIATE")
		auth, _, err := cl.Authenticate(f.Body[4:])
		if err != nil {
			t.Fatal(err)
		}
		r2.write(frame(session.Header{MessageID: r2.nextID(), Command: session.CmdSessionSetup}, setupBody(auth), nil))
		if f := r2.read("AUTHENTICATE"); f.Status != protocol.StatusLogonFailure {
			t.Fatalf("wrong password answered %v", f.Status)
		}
		failures++
	}
	r2.wantClosed("after three logon failures")
	// A captured AUTHENTICATE (right password) replayed on a new
	// connection answers an old challenge: refused.
	good, st := dialRaw(t, s, rig.Password)
	if st != protocol.StatusSuccess {
		t.Fatal(st)
	}
	nc3 := dial(t, s.SessionAddr)
	r3 := &rawSession{t: t, nc: nc3}
	cl := smbauth.NewClient(smbauth.ClientConfig{User: rig.User, Password: "unknown to the attacker", Workstation: "hostile"})
	neg, _ := cl.Negotiate()
	r3.write(frame(session.Header{MessageID: r3.nextID(), Command: session.CmdSessionSetup}, setupBody(neg), nil))
	if f := r3.read("NEGOTIATE"); f.Status != protocol.StatusMoreProcessingReq {
		t.Fatal(f.Status)
	}
	r3.write(frame(session.Header{MessageID: r3.nextID(), Command: session.CmdSessionSetup}, setupBody(good.authTok), nil))
	if f := r3.read("replayed AUTHENTICATE"); f.Status != protocol.StatusLogonFailure {
		t.Fatalf("a replayed AUTHENTICATE answered %v, want LOGON_FAILURE", f.Status)
	}
	s.Check(t)
	figures.Add(t, "6 commands before session setup: STATUS_ACCESS_DENIED; %d wrong-password setups: LOGON_FAILURE, the third on one connection closes it; a captured AUTHENTICATE replayed on a new connection: LOGON_FAILURE", failures)
}

// TestPathEscapes tries to leave the share through the client API: ..,
// absolute paths, absolute and relative symlinks out, hard links and
// renames through them. Every attempt is refused and nothing outside the
// share is read, created or changed.
func TestPathEscapes(t *testing.T) {
	for _, walk := range []bool{false, true} {
		name := "openat2"
		if walk {
			name = "walker"
		}
		t.Run(name, func(t *testing.T) { pathEscapes(t, walk) })
	}
}

// pathEscapes runs the attempts with the openat2 resolver or the
// component walker used where openat2 is missing.
func pathEscapes(t *testing.T, walk bool) {
	s := newServer(t, rig.Options{Session: session.ServerConfig{DisableOpenat2: walk}})
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("outside the share"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := ctx10(t)
	tr := s.TestSession(ctx, t).Tree
	rel, err := filepath.Rel(s.Dir, outside)
	if err != nil {
		t.Fatal(err)
	}
	// Symlinks may be made (they are only text); following them out may not.
	for _, l := range [][2]string{{outside, "abs"}, {secret, "abs-file"}, {rel, "rel"}, {"..", "dotdot"}, {"/", "root"}, {"/proc/self/root", "magic"}} {
		if _, err := tr.Symlink(ctx, l[0], l[1]); err != nil {
			t.Fatalf("symlink %s -> %s: %v", l[1], l[0], err)
		}
	}
	if _, err := tr.Mkdir(ctx, "d", 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Symlink(ctx, "../../"+filepath.Base(outside), "d/up"); err != nil {
		t.Fatal(err)
	}
	type attempt struct {
		name string
		do   func() error
	}
	open := func(p string, flags int) func() error {
		return func() error {
			h, _, err := tr.Open(ctx, p, flags, 0o644)
			if err == nil {
				tr.CloseHandle(ctx, h)
			}
			return err
		}
	}
	attempts := []attempt{
		{"open ../secret", open("../"+filepath.Base(outside)+"/secret", os.O_RDONLY)},
		{"open absolute path", open(secret, os.O_RDONLY)},
		{"open /etc/passwd", open("/etc/passwd", os.O_RDONLY)},
		{"open ..", open("..", os.O_RDONLY)},
		{"open d/../../x", open("d/../../"+filepath.Base(outside)+"/secret", os.O_RDONLY)},
		{"open through absolute symlink dir", open("abs/secret", os.O_RDONLY)},
		{"open absolute symlink to a file", open("abs-file", os.O_RDWR)},
		{"open through relative symlink out", open("rel/secret", os.O_RDONLY)},
		{"open through nested relative symlink", open("d/up/secret", os.O_RDONLY)},
		{"open through symlink ..", open("dotdot/"+filepath.Base(outside)+"/secret", os.O_RDONLY)},
		{"open through symlink /", open("root/etc/passwd", os.O_RDONLY)},
		{"open through /proc magic link", open("magic/etc/passwd", os.O_RDONLY)},
		{"create through absolute symlink", open("abs/created", os.O_RDWR|os.O_CREATE)},
		{"create through relative symlink", open("rel/created2", os.O_RDWR|os.O_CREATE)},
		{"truncate absolute symlink target", open("abs-file", os.O_RDWR|os.O_TRUNC)},
		{"getattr ../", func() error { _, err := tr.GetAttr(ctx, "../"+filepath.Base(outside)); return err }},
		{"getattr through symlink", func() error { _, err := tr.GetAttr(ctx, "abs/secret"); return err }},
		{"readdir absolute symlink", func() error { _, err := tr.ReadDir(ctx, "abs"); return err }},
		{"readdir ..", func() error { _, err := tr.ReadDir(ctx, ".."); return err }},
		{"readdir symlink ..", func() error { _, err := tr.ReadDir(ctx, "dotdot"); return err }},
		{"mkdir through symlink", func() error { _, err := tr.Mkdir(ctx, "abs/newdir", 0o755); return err }},
		{"unlink through symlink", func() error { return tr.Unlink(ctx, "abs/secret") }},
		{"rename into symlinked dir", func() error {
			if _, err := tr.Mkdir(ctx, "m", 0o755); err != nil {
				return nil
			}
			return tr.Rename(ctx, "m", "abs/moved", 0)
		}},
		{"rename out of symlinked dir", func() error { return tr.Rename(ctx, "abs/secret", "stolen", 0) }},
		{"hard link through symlink", func() error { _, err := tr.Link(ctx, "abs/secret", "hard"); return err }},
		{"symlink created beyond the root", func() error { _, err := tr.Symlink(ctx, "x", "abs/evil-link"); return err }},
		{"setattr through symlink", func() error {
			_, err := tr.SetAttr(ctx, "abs/secret", 0, session.SetAttrIn{Valid: session.SetMode, Mode: 0o777})
			return err
		}},
		{"truncate via setattr on absolute symlink", func() error {
			_, err := tr.SetAttr(ctx, "abs-file", 0, session.SetAttrIn{Valid: session.SetSize, Size: 0})
			return err
		}},
		{"readlink ..", func() error { _, err := tr.Readlink(ctx, "../x"); return err }},
		{"getxattr through symlink", func() error { _, err := tr.GetXattr(ctx, "abs/secret", "user.x"); return err }},
		{"mknod a FIFO through symlink", func() error { _, err := tr.Mknod(ctx, "abs/fifo", syscall.S_IFIFO|0o644, 0); return err }},
		{"mknod a socket through relative symlink", func() error { _, err := tr.Mknod(ctx, "rel/sock", syscall.S_IFSOCK|0o644, 0); return err }},
		{"mknod ../", func() error {
			_, err := tr.Mknod(ctx, "../"+filepath.Base(outside)+"/fifo", syscall.S_IFIFO|0o644, 0)
			return err
		}},
	}
	refused := 0
	for _, a := range attempts {
		err := a.do()
		if err == nil {
			t.Errorf("%s: succeeded, want refused", a.name)
			continue
		}
		e := session.ToErrno(err)
		t.Logf("%-42s refused: %v", a.name, e)
		switch e {
		case syscall.EACCES, syscall.ELOOP, syscall.EINVAL:
		default:
			t.Errorf("%s: refused with %v (%v), want EACCES (or ELOOP, EINVAL)", a.name, err, e)
		}
		refused++
	}
	got, err := os.ReadFile(secret)
	if err != nil || string(got) != "outside the share" {
		t.Errorf("the file outside the share changed: %q %v", got, err)
	}
	if fi, err := os.Stat(secret); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the file outside the share changed mode: %v %v", fi, err)
	}
	entries, _ := os.ReadDir(outside)
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("something was created outside the share: %v", names)
	}
	s.Check(t)
	figures.Add(t, "%d path escapes through the client API (.., absolute, absolute/relative/nested symlinks, /proc magic link, create/rename/link/unlink/setattr through them): %d refused, outside directory unchanged",
		len(attempts), refused)
}

// call sends a signed request and reads its answer (the raw session has
// nothing else in flight).
func (r *rawSession) call(cmd session.Command, tree uint32, body []byte) session.Frame {
	r.t.Helper()
	id := r.nextID()
	r.write(frame(session.Header{MessageID: id, Command: cmd, SessionID: r.id, TreeID: tree}, body, r.key))
	f := r.read(cmd.String())
	if f.MessageID != id {
		r.t.Fatalf("%v: answer to message %d, want %d", cmd, f.MessageID, id)
	}
	return f
}

func str16(s string) []byte {
	return append(binary.LittleEndian.AppendUint16(nil, uint16(len(s))), s...)
}

// TestSessionNonReader: an authenticated session pipelines 1 MiB READs
// and never reads the answers. The server may not block on it for more
// than its WriteTimeout (1 s here), nor hold more than MaxInFlight
// requests: it drops the connection and serves everyone else meanwhile.
func TestSessionNonReader(t *testing.T) {
	writeTimeout := time.Second
	if d, err := time.ParseDuration(os.Getenv("LWIO_HOSTILE_WRITE_TIMEOUT")); err == nil {
		writeTimeout = d
	}
	s := newServer(t, rig.Options{Session: session.ServerConfig{WriteTimeout: writeTimeout}})
	if err := os.WriteFile(filepath.Join(s.Dir, "big"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	r, st := dialRaw(t, s, rig.Password)
	if st != protocol.StatusSuccess {
		t.Fatal(st)
	}
	f := r.call(session.CmdTreeConnect, 0, str16(rig.Share))
	if f.Status != protocol.StatusSuccess || len(f.Body) < 4 {
		t.Fatalf("TREE_CONNECT: %v", f.Status)
	}
	tree := binary.LittleEndian.Uint32(f.Body)
	// OPEN: path, Flags, Mode, DurableID (none); no lease or
	// registration fields.
	open := append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(str16("big"), uint32(os.O_RDONLY)), 0), make([]byte, 16)...)
	f = r.call(session.CmdOpen, tree, open)
	if f.Status != protocol.StatusSuccess || len(f.Body) < 8 {
		t.Fatalf("OPEN: %v", f.Status)
	}
	handle := binary.LittleEndian.Uint64(f.Body)
	base := s.Check(t)
	goroutinesBefore := runtime.NumGoroutine()
	// 200 READs of 1 MiB, written without reading a byte back.
	const reads = 200
	start := time.Now()
	sent := 0
	r.nc.SetWriteDeadline(time.Now().Add(15 * time.Second))
	for i := 0; i < reads; i++ {
		body := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, handle), 0), 1<<20)
		if _, err := r.nc.Write(frame(session.Header{MessageID: r.nextID(), Command: session.CmdRead, SessionID: r.id, TreeID: tree}, body, r.key)); err != nil {
			break // the server stopped reading, or dropped us
		}
		sent++
	}
	during := s.Check(t)
	// Still not reading, for longer than the server's WriteTimeout.
	time.Sleep(writeTimeout + 2*time.Second)
	// By now the server must have given up on us: what it had sent
	// drains, then the stream ends (EOF or reset); it does not go on.
	r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.Copy(io.Discard, r.nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open %v after %d unread 1 MiB READs", time.Since(start), sent)
	}
	if got > 80<<20 {
		t.Errorf("the server sent %d MiB to a client that read nothing for %v", got>>20, writeTimeout+2*time.Second)
	}
	ended := time.Since(start)
	goroutinesAfter := settled(t, goroutinesBefore, "the non-reader was dropped")
	s.Check(t)
	figures.Add(t, "session pipelining %d of %d 1 MiB READs without reading for %v: connection ended (all read by %v; WriteTimeout %v; %.1f MiB had been buffered toward it); legitimate client served in %v before, %v meanwhile; goroutines %d before, %d after",
		sent, reads, writeTimeout+2*time.Second, ended.Round(time.Millisecond), writeTimeout, float64(got)/(1<<20), base.Round(time.Millisecond), during.Round(time.Millisecond), goroutinesBefore, goroutinesAfter)
}

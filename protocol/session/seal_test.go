package session

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
)

// A sealed GETATTR request written from the layout in seal.go and
// docs/session.md and sealed by an independent AES-GCM (Python's
// pycryptodome): key 00 01 … 0f, AES-128-GCM, sequence 1.
const goldenSealed = "" +
	"45000000" + // Length 69 = 56 + 8 + 5
	"4c575343" + // "LWSC"
	"0500000000000000" + // MessageID 5
	"0500" + // GETATTR
	"0400" + // Flags SEALED
	"00000000" + // Status
	"0807060504030201" + // SessionID
	"07000000" + // TreeID 7
	"00000000" + // Reserved
	"ee3b7877b9aec90de16642bfb9cfc2de" + // Signature = GCM tag
	"0100000000000000" + // Sequence 1
	"4fbdb82aff" // nameMsg "a/b", encrypted

func goldenSealers(t *testing.T) (out, in *sealer) {
	t.Helper()
	key := make([]byte, 16)
	for i := range key {
		key[i] = byte(i)
	}
	out, err := newSealer(smbauth.CipherAES128GCM, key)
	if err != nil {
		t.Fatal(err)
	}
	in, _ = newSealer(smbauth.CipherAES128GCM, key)
	return out, in
}

func goldenPlainRequest() []byte {
	raw := appendHeader(nil, Header{MessageID: 5, Command: CmdGetAttr, SessionID: 0x0102030405060708, TreeID: 7}, true)
	raw = append(raw, marshal(&nameMsg{Name: "a/b"})...)
	putLength(raw)
	return raw
}

func TestSealGolden(t *testing.T) {
	out, in := goldenSealers(t)
	raw := goldenPlainRequest()
	if err := out.seal(raw); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(raw); got != goldenSealed {
		t.Fatalf("sealed frame\n%s\nwant\n%s", got, goldenSealed)
	}
	want, _ := hex.DecodeString(goldenSealed)
	f, err := DecodeFrame(want)
	if err != nil || f.Flags != FlagSealed {
		t.Fatalf("DecodeFrame: %+v %v", f.Header, err)
	}
	body, err := in.open(want)
	if err != nil {
		t.Fatal(err)
	}
	var m nameMsg
	if err := unmarshal(body, &m); err != nil || m.Name != "a/b" {
		t.Errorf("opened body %q: %v", body, err)
	}
}

// Every bit of a sealed frame is covered: header (as associated data),
// sequence, ciphertext and tag. A flipped bit never opens.
func TestSealEveryBitCovered(t *testing.T) {
	good, _ := hex.DecodeString(goldenSealed)
	for i := 4; i < len(good); i++ { // Length is checked by the framer
		for bit := range 8 {
			_, in := goldenSealers(t)
			b := append(make([]byte, 0, len(good)+tagSize), good...)
			b[i] ^= 1 << bit
			if _, err := in.open(b); err == nil {
				t.Fatalf("frame with byte %d bit %d flipped opens", i, bit)
			} else if !errors.Is(err, ErrBadSeal) && !errors.Is(err, ErrSealSequence) {
				t.Fatalf("byte %d bit %d: %v", i, bit, err)
			}
		}
	}
}

// Replayed, reordered and lost frames are refused by sequence.
func TestSealSequence(t *testing.T) {
	out, in := goldenSealers(t)
	var frames [][]byte
	for range 3 {
		raw := goldenPlainRequest()
		if err := out.seal(raw); err != nil {
			t.Fatal(err)
		}
		frames = append(frames, raw)
	}
	cp := func(b []byte) []byte { return append([]byte(nil), b...) }
	if _, err := in.open(cp(frames[0])); err != nil {
		t.Fatal(err)
	}
	if _, err := in.open(cp(frames[0])); !errors.Is(err, ErrSealSequence) {
		t.Errorf("replay: %v, want ErrSealSequence", err)
	}
	if _, err := in.open(cp(frames[2])); !errors.Is(err, ErrSealSequence) {
		t.Errorf("frame 3 before 2: %v, want ErrSealSequence", err)
	}
	if _, err := in.open(cp(frames[1])); err != nil {
		t.Errorf("frame 2 after the refusals: %v", err)
	}
	// A frame sealed under the other direction's key does not open.
	c2s, s2c := smbauth.SessionSealKeys(make([]byte, 16), 1, smbauth.CipherAES128GCM)
	a, _ := newSealer(smbauth.CipherAES128GCM, c2s)
	b, _ := newSealer(smbauth.CipherAES128GCM, s2c)
	raw := goldenPlainRequest()
	a.seal(raw)
	if _, err := b.open(raw); !errors.Is(err, ErrBadSeal) {
		t.Errorf("wrong direction's key: %v", err)
	}
}

func TestDecodeFrameRefusesSignedAndSealed(t *testing.T) {
	raw := AppendFrame(nil, Header{Command: CmdEcho, Flags: FlagSigned | FlagSealed}, nil)
	if _, err := DecodeFrame(raw); !errors.Is(err, ErrBadFlags) {
		t.Errorf("SIGNED|SEALED: %v, want ErrBadFlags", err)
	}
}

func TestSetupBodiesGolden(t *testing.T) {
	req := &setupReq{Token: []byte("NT"), Offer: sealOffer{Flags: sealOfferRequired, Ciphers: []smbauth.Cipher{smbauth.CipherAES256GCM, smbauth.CipherAES128GCM}}}
	want := "02000000" + "4e54" + "0100" + "0200" + "0400" + "0200"
	if got := hex.EncodeToString(marshal(req)); got != want {
		t.Errorf("setupReq = %s, want %s", got, want)
	}
	done := &sessionSetupDone{ServerName: "s", Seal: sealAnswer{Flags: sealAnswerSealed, Cipher: smbauth.CipherAES128GCM, Echo: sealOffer{Ciphers: []smbauth.Cipher{smbauth.CipherAES128GCM}}}}
	want = "0100" + "73" + "0100" + "0200" + "0000" + "0100" + "0200"
	if got := hex.EncodeToString(marshal(done)); got != want {
		t.Errorf("sessionSetupDone = %s, want %s", got, want)
	}
}

func TestParseEncrypt(t *testing.T) {
	for in, want := range map[string]Encrypt{"": EncryptIfRequired, "default": EncryptIfRequired, "off": EncryptOff,
		"if_required": EncryptIfRequired, "Desired": EncryptDesired, "required": EncryptRequired} {
		got, err := ParseEncrypt(in)
		if err != nil || got != want {
			t.Errorf("ParseEncrypt(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "" && in != "default" {
			if back, _ := ParseEncrypt(got.String()); back != got {
				t.Errorf("%v does not parse back", got)
			}
		}
	}
	if _, err := ParseEncrypt("mandatory"); err == nil {
		t.Error("ParseEncrypt accepted mandatory")
	}
}

// The session's enums print their names, and a value without one as
// Type(n).
func TestEnumStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{EncryptDesired.String(), "desired"}, {Encrypt(9).String(), "Encrypt(9)"},
		{SealNever.String(), "never"}, {SealMode(3).String(), "SealMode(3)"},
		{stateEstablished.String(), "ESTABLISHED"}, {connState(4).String(), "connState(4)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// dialSeal dials e with a sealing mode and ciphers (through addr, when not
// empty: a proxy).
func (e *env) dialSeal(addr string, mode SealMode, ciphers ...smbauth.Cipher) (*Client, error) {
	if addr == "" {
		addr = e.addr
	}
	c, err := Dial(ctxT(e.t), addr, ClientConfig{User: testUser, Password: testPassword, Seal: mode, Ciphers: ciphers})
	if err == nil {
		e.t.Cleanup(func() { c.Close() })
	}
	return c, err
}

func withEncrypt(enc Encrypt) func(*ServerConfig) {
	return func(c *ServerConfig) { c.Encrypt = enc }
}

// The session-level policy: server encrypt × client mode.
func TestSealPolicy(t *testing.T) {
	for _, tc := range []struct {
		server   Encrypt
		client   SealMode
		sealed   bool
		cipher   smbauth.Cipher
		refused  bool
		logged   string
		clientOf []smbauth.Cipher
	}{
		{server: EncryptIfRequired, client: SealAuto, cipher: smbauth.CipherAES128GCM},
		{server: EncryptIfRequired, client: SealRequired, sealed: true, cipher: smbauth.CipherAES128GCM},
		{server: EncryptIfRequired, client: SealNever},
		{server: EncryptOff, client: SealAuto},
		{server: EncryptOff, client: SealRequired, refused: true, logged: "encrypt is off"},
		{server: EncryptDesired, client: SealAuto, sealed: true, cipher: smbauth.CipherAES128GCM},
		{server: EncryptDesired, client: SealNever},
		{server: EncryptRequired, client: SealAuto, sealed: true, cipher: smbauth.CipherAES128GCM},
		{server: EncryptRequired, client: SealNever, refused: true, logged: "client cannot seal"},
		{server: EncryptRequired, client: SealAuto, sealed: true, cipher: smbauth.CipherAES256GCM,
			clientOf: []smbauth.Cipher{smbauth.CipherAES256GCM}},
		{server: EncryptRequired, client: SealRequired, refused: true, logged: "no cipher in common",
			clientOf: []smbauth.Cipher{0x0001}}, // AES-128-CCM: not ours
	} {
		t.Run(fmt.Sprintf("%v/%v/%v", tc.server, tc.client, tc.clientOf), func(t *testing.T) {
			e := newEnv(t, withEncrypt(tc.server))
			c, err := e.dialSeal("", tc.client, tc.clientOf...)
			if tc.refused {
				if !errors.Is(err, ErrSealRequired) {
					t.Fatalf("Dial: %v, want ErrSealRequired", err)
				}
				t.Logf("client: %v", err)
				if !e.waitLogged(tc.logged) {
					t.Errorf("server did not log %q", tc.logged)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Sealed() != tc.sealed || c.Cipher() != tc.cipher {
				t.Errorf("Sealed %v cipher %v, want %v %v", c.Sealed(), c.Cipher(), tc.sealed, tc.cipher)
			}
			tr, err := c.TreeConnect(ctxT(t), "data")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tr.GetAttr(ctxT(t), ""); err != nil {
				t.Fatalf("GetAttr on the session: %v", err)
			}
		})
	}
}

// A share that seals: desired and required seal the session from the tree
// connect on; a client that cannot seal is served by the desired share and
// refused by the required one, with a clear message on both sides.
func TestSealedShares(t *testing.T) {
	e := newEnv(t, func(c *ServerConfig) {
		c.Shares = append(c.Shares, share.Config{Name: "want", Path: e0(c)}, share.Config{Name: "must", Path: e0(c)})
		c.ShareEncrypt = map[string]Encrypt{"want": EncryptDesired, "must": EncryptRequired}
	})
	ctx := ctxT(t)
	for _, name := range []string{"want", "must"} {
		c, err := e.dialSeal("", SealAuto)
		if err != nil {
			t.Fatal(err)
		}
		if c.Sealed() {
			t.Fatal("session sealed before any tree connect")
		}
		tr, err := c.TreeConnect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !c.Sealed() {
			t.Errorf("%s: session not sealed after the tree connect", name)
		}
		if _, err := tr.GetAttr(ctx, ""); err != nil {
			t.Fatal(err)
		}
		// The unsealed share on the same session is sealed as well now.
		if _, err := c.TreeConnect(ctx, "data"); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := e.dialSeal("", SealNever)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.TreeConnect(ctx, "want"); err != nil || nc.Sealed() {
		t.Fatalf("desired share, client that cannot seal: %v sealed=%v", err, nc.Sealed())
	}
	_, err = nc.TreeConnect(ctx, "must")
	if !errors.Is(err, ErrSealRequired) {
		t.Fatalf("required share, client that cannot seal: %v", err)
	}
	t.Logf("client: %v", err)
	if !e.logged("tree connect refused: the share requires sealing") {
		t.Error("server did not log the refusal")
	}
	// The session survives the refusal.
	if _, err := nc.TreeConnect(ctx, "data"); err != nil {
		t.Fatal(err)
	}
}

// e0 is the path of the first share of a config under construction.
func e0(c *ServerConfig) string { return c.Shares[0].Path }

// wireProxy relays one client's TCP connection to the server and records
// the bytes both ways; mutate, when set, may change or repeat the frames
// the server sends (n counts them from 1).
type wireProxy struct {
	addr   string
	mu     sync.Mutex
	c2s    bytes.Buffer
	s2c    bytes.Buffer
	mutate func(n int, frame []byte) [][]byte
}

func newWireProxy(t *testing.T, server string) *wireProxy {
	p := &wireProxy{}
	p.addr = testutil.Relay(t, server, func(cc, sc net.Conn) {
		t.Cleanup(func() { cc.Close(); sc.Close() })
		go p.pump(cc, sc, &p.c2s, nil)
		go p.pump(sc, cc, &p.s2c, p.mutate)
	})
	return p
}

// pump copies frames from src to dst, recording them.
func (p *wireProxy) pump(src, dst net.Conn, rec *bytes.Buffer, mutate func(int, []byte) [][]byte) {
	defer dst.Close()
	for n := 1; ; n++ {
		var lb [4]byte
		if _, err := io.ReadFull(src, lb[:]); err != nil {
			return
		}
		frame := make([]byte, binary.LittleEndian.Uint32(lb[:]))
		copy(frame, lb[:])
		if _, err := io.ReadFull(src, frame[4:]); err != nil {
			return
		}
		out := [][]byte{frame}
		if mutate != nil {
			out = mutate(n, frame)
		}
		for _, f := range out {
			p.mu.Lock()
			rec.Write(f)
			p.mu.Unlock()
			if _, err := dst.Write(f); err != nil {
				return
			}
		}
	}
}

func (p *wireProxy) seen(marker []byte) (c2s, s2c bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.c2s.Bytes(), marker), bytes.Contains(p.s2c.Bytes(), marker)
}

// useMarker creates a file whose name holds marker, writes marker into it,
// reads it back, lists the directory and stats the file, all over the
// session channel.
func useMarker(t *testing.T, tr *Tree, marker string) {
	ctx := ctxT(t)
	name := "file-" + marker
	h, _, err := tr.Open(ctx, name, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte(marker), 100)
	if _, err := tr.WriteAt(ctx, h, data, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := tr.ReadAt(ctx, h, got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadAt: %v", err)
	}
	if err := tr.CloseHandle(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.GetAttr(ctx, name); err != nil {
		t.Fatal(err)
	}
	ents, err := tr.ReadDir(ctx, "")
	if err != nil || len(ents) == 0 {
		t.Fatalf("ReadDir: %v %v", ents, err)
	}
}

// With sealing, a marker in a file name and in file data never appears on
// the wire, either way; without it, it does (so the capture is real).
func TestSealHidesNamesAndData(t *testing.T) {
	for _, tc := range []struct {
		name   string
		server Encrypt
		client SealMode
		share  string
		hidden bool
	}{
		{"unsealed", EncryptIfRequired, SealAuto, "data", false},
		{"client requires", EncryptIfRequired, SealRequired, "data", true},
		{"server desires", EncryptDesired, SealAuto, "data", true},
		{"share requires", EncryptIfRequired, SealAuto, "must", true},
		{"AES-256", EncryptRequired, SealAuto, "data", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, withEncrypt(tc.server), func(c *ServerConfig) {
				c.Shares = append(c.Shares, share.Config{Name: "must", Path: e0(c)})
				c.ShareEncrypt = map[string]Encrypt{"must": EncryptRequired}
			})
			p := newWireProxy(t, e.addr)
			var ciphers []smbauth.Cipher
			if tc.name == "AES-256" {
				ciphers = []smbauth.Cipher{smbauth.CipherAES256GCM}
			}
			c, err := e.dialSeal(p.addr, tc.client, ciphers...)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := c.TreeConnect(ctxT(t), tc.share)
			if err != nil {
				t.Fatal(err)
			}
			marker := "MARKER-7f3a9c-" + tc.share
			useMarker(t, tr, marker)
			if _, err := os.Stat(filepath.Join(e.share, "file-"+marker)); err != nil {
				t.Fatalf("the file is not on the server: %v", err)
			}
			c2s, s2c := p.seen([]byte(marker))
			if tc.hidden && (c2s || s2c) {
				t.Errorf("marker on the wire: client→server %v, server→client %v", c2s, s2c)
			}
			if !tc.hidden && !(c2s && s2c) {
				t.Errorf("unsealed, yet the marker is not on the wire both ways (c2s %v, s2c %v): the capture is broken", c2s, s2c)
			}
		})
	}
}

// A flipped bit in a sealed frame, or a sealed frame delivered twice, ends
// the connection with a log line: on the client for frames from the server
// (through a proxy), on the server for frames from the client.
func TestSealedTamperEndsConnection(t *testing.T) {
	const setupFrames = 2 // CHALLENGE and the final SESSION_SETUP response
	for _, tc := range []struct {
		name   string
		mutate func(frame []byte) [][]byte
		want   error
	}{
		{"flipped bit", func(f []byte) [][]byte { f[len(f)-1] ^= 0x10; return [][]byte{f} }, ErrBadSeal},
		{"flipped header bit", func(f []byte) [][]byte { f[32] ^= 0x01; return [][]byte{f} }, ErrBadSeal},
		{"replayed", func(f []byte) [][]byte { return [][]byte{f, append([]byte(nil), f...)} }, ErrSealSequence},
	} {
		t.Run("server→client "+tc.name, func(t *testing.T) {
			e := newEnv(t, withEncrypt(EncryptRequired))
			p := newWireProxy(t, e.addr)
			p.mutate = func(n int, f []byte) [][]byte {
				if n == setupFrames+2 { // the second sealed response
					return tc.mutate(f)
				}
				return [][]byte{f}
			}
			c, err := e.dialSeal(p.addr, SealAuto)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := c.TreeConnect(ctxT(t), "data")
			if err != nil {
				t.Fatal(err)
			}
			_, err = tr.GetAttr(ctxT(t), "")
			if tc.name == "replayed" && err == nil {
				// The original arrived; its copy kills the connection.
				waitDone(t, c)
				err = c.Err()
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("GetAttr after tampering: %v, want %v", err, tc.want)
			}
			waitDone(t, c)
		})
	}
	t.Run("client→server flipped bit", func(t *testing.T) {
		e := newEnv(t, withEncrypt(EncryptRequired))
		c, err := e.dialSeal("", SealAuto)
		if err != nil {
			t.Fatal(err)
		}
		raw := appendHeader(nil, Header{Command: CmdEcho, SessionID: c.SessionID()}, true)
		putLength(raw)
		c.writeMu.Lock()
		c.nextID++
		putMessageID(raw, c.nextID)
		c.seal.Load().out.seal(raw)
		raw[sigOffset+3] ^= 0x01 // a bit of the tag
		c.nc.Write(raw)
		c.writeMu.Unlock()
		waitDone(t, c)
		if !e.waitLogged("bad sealed frame") {
			t.Error("server did not log the bad frame")
		}
	})
	t.Run("client→server unsealed after sealing", func(t *testing.T) {
		e := newEnv(t, withEncrypt(EncryptRequired))
		c, err := e.dialSeal("", SealAuto)
		if err != nil {
			t.Fatal(err)
		}
		c.sealing.Store(false) // a client that stops sealing: signed frames only
		c.firstSealed.Store(0)
		if err := c.call(ctxT(t), CmdEcho, 0, &empty{}, &empty{}); err == nil {
			t.Fatal("unsealed ECHO answered on a sealed session")
		}
		waitDone(t, c)
		if !e.waitLogged("unsealed frame where sealing is in force") {
			t.Error("server did not log the unsealed frame")
		}
	})
}

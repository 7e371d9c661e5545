package session

import (
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/enum"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/smbauth"
)

// Encrypt is a server's or a share's sealing policy, with Samba's names and
// meanings ("server smb encrypt", smb.conf(5)). The zero value is Samba's
// default, if_required.
type Encrypt uint8

const (
	// EncryptIfRequired offers sealing and seals a session whose client
	// requires it (lwio-mount -o seal); nobody else is asked to. On a
	// share it has no effect.
	EncryptIfRequired Encrypt = iota
	// EncryptOff never seals: NTLMSSP_NEGOTIATE_SEAL is not granted, a
	// client that requires sealing is refused at session setup, and a
	// share that requires sealing refuses every tree connect. On a share
	// it has no effect.
	EncryptOff
	// EncryptDesired seals every session (server-wide) or every tree
	// connect to the share whose client can seal; a client that cannot is
	// served unsealed.
	EncryptDesired
	// EncryptRequired is EncryptDesired that refuses a client that cannot
	// seal, at session setup (server-wide) or tree connect (share), with
	// StatusSealRequired.
	EncryptRequired
)

var encryptNames = [...]string{"if_required", "off", "desired", "required"}

// String is the setting's name, as ParseEncrypt accepts it.
func (e Encrypt) String() string { return enum.Name(encryptNames[:], e, "Encrypt") }

// ParseEncrypt parses an encrypt setting: off, if_required, desired or
// required; "" and "default" are if_required.
func ParseEncrypt(s string) (Encrypt, error) {
	switch strings.ToLower(s) {
	case "", "default":
		return EncryptIfRequired, nil
	}
	for i, n := range encryptNames {
		if strings.EqualFold(s, n) {
			return Encrypt(i), nil
		}
	}
	return 0, fmt.Errorf("encrypt %q: want off, if_required, desired or required", s)
}

// SealMode is what a client does about sealing (ClientConfig.Seal).
type SealMode uint8

const (
	// SealAuto seals when the server asks: its encrypt setting is desired
	// or required, or the share's is. mount.cifs does the same without
	// "seal". The zero value.
	SealAuto SealMode = iota
	// SealRequired seals every frame after session setup and refuses a
	// server that will not (lwio-mount -o seal).
	SealRequired
	// SealNever is a client that cannot seal: it offers no cipher and does
	// not ask NTLM for SEAL. For tests of the refusal, and for comparing
	// costs.
	SealNever
)

var sealModeNames = [...]string{"auto", "required", "never"}

// String is the mode's name: auto, required or never.
func (m SealMode) String() string { return enum.Name(sealModeNames[:], m, "SealMode") }

// StatusSealRequired refuses a SESSION_SETUP or TREE_CONNECT on sealing
// grounds: the server or share requires sealing and the session is not
// sealed, or the client requires it and the server's encrypt is off.
// Windows answers ACCESS_DENIED there; this code (customer bit set, as
// MS-ERREF §2.3 allows for non-Microsoft codes) lets the client say why.
const StatusSealRequired = protocol.Status(0xE0A10001)

// Errors of sealing. ErrSealRequired is a refusal at setup or tree connect
// (the connection is not broken); the others end the connection.
var (
	ErrSealRequired = errors.New("sealing required")
	ErrBadSeal      = errors.New("session: sealed frame does not authenticate (tampered, or not for this session)")
	ErrSealSequence = errors.New("session: sealed frame out of sequence (replayed, reordered or lost)")
	ErrUnsealed     = errors.New("session: unsealed frame where sealing is in force")
)

// Sealed frame layout (docs/session.md, "Sealing"): the 56-byte header in
// clear with FlagSealed set and the AES-GCM tag in Signature, then
//
//	@56 Sequence   u64   1, 2, 3, … per direction; the nonce
//	@64 ciphertext       the body, encrypted
//
// The associated data is the header (Signature zeroed) and Sequence. The
// 12-byte nonce is Sequence (little-endian) followed by four zero bytes;
// each direction has its own key, so no (key, nonce) pair is ever used
// twice.
const (
	seqSize          = 8
	tagSize          = 16
	sealedBodyOffset = HeaderSize + seqSize
	// sealOverhead is what sealing adds to a frame: the sequence on the
	// wire, and room for the tag that AEAD.Seal appends before it moves
	// into the header.
	sealOverhead = seqSize + tagSize
)

// sealer seals or opens the frames of one direction of a session. Its
// sequence is owned by one goroutine at a time: the writer holding the
// connection's write lock, or the connection's reader.
type sealer struct {
	aead cipher.AEAD
	seq  uint64 // the last sequence sealed or opened
}

func newSealer(c smbauth.Cipher, key []byte) (*sealer, error) {
	a, err := c.NewAEAD(key)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: a}, nil
}

func nonceFor(seq uint64) [12]byte {
	var n [12]byte
	binary.LittleEndian.PutUint64(n[:], seq)
	return n
}

// seal encrypts raw in place: a whole frame with Length set and seqSize
// bytes reserved after the header (appendHeader). Capacity for the tag
// beyond len(raw) saves a copy. It must run in wire order: the caller
// holds the write lock until raw is written.
func (s *sealer) seal(raw []byte) error {
	if s.seq == ^uint64(0) {
		return errors.New("session: sealing sequence exhausted")
	}
	s.seq++
	flags := binary.LittleEndian.Uint16(raw[18:])&^FlagSigned | FlagSealed
	binary.LittleEndian.PutUint16(raw[18:], flags)
	binary.LittleEndian.PutUint64(raw[HeaderSize:], s.seq)
	clear(raw[sigOffset : sigOffset+sigSize])
	nonce := nonceFor(s.seq)
	body := raw[sealedBodyOffset:]
	out := s.aead.Seal(body[:0], nonce[:], body, raw[:sealedBodyOffset])
	if len(body) > 0 && &out[0] != &body[0] {
		copy(body, out) // raw had no room for the tag: Seal allocated
	}
	copy(raw[sigOffset:], out[len(body):])
	return nil
}

// open checks the sequence and the tag of a sealed frame and decrypts its
// body in place, returning it. Any failure ends the connection.
func (s *sealer) open(raw []byte) ([]byte, error) {
	if len(raw) < sealedBodyOffset {
		return nil, fmt.Errorf("%w: %d bytes", ErrShortFrame, len(raw))
	}
	seq := binary.LittleEndian.Uint64(raw[HeaderSize:])
	if seq != s.seq+1 {
		return nil, fmt.Errorf("%w: sequence %d, expected %d", ErrSealSequence, seq, s.seq+1)
	}
	var tag [tagSize]byte
	copy(tag[:], raw[sigOffset:])
	clear(raw[sigOffset : sigOffset+sigSize])
	ct := append(raw[sealedBodyOffset:], tag[:]...) // in place when readFrame left room
	nonce := nonceFor(seq)
	body, err := s.aead.Open(ct[:0], nonce[:], ct, raw[:sealedBodyOffset])
	if err != nil {
		return nil, ErrBadSeal
	}
	s.seq = seq
	return body, nil
}

// sessionSeal is a session's sealing state: the cipher, one sealer per
// direction, and whether every frame after setup is sealed (else only
// those of sealed trees, and everything after the first sealed frame).
type sessionSeal struct {
	cipher  smbauth.Cipher
	out, in *sealer
	always  bool
}

// newSessionSeal derives the session's keys (smbauth.SessionSealKeys) and
// builds both directions; server says which end this is.
func newSessionSeal(sessionKey []byte, sessionID uint64, c smbauth.Cipher, always, server bool) (*sessionSeal, error) {
	c2s, s2c := smbauth.SessionSealKeys(sessionKey, sessionID, c)
	outKey, inKey := c2s, s2c
	if server {
		outKey, inKey = s2c, c2s
	}
	out, err := newSealer(c, outKey)
	if err != nil {
		return nil, err
	}
	in, err := newSealer(c, inKey)
	if err != nil {
		return nil, err
	}
	return &sessionSeal{cipher: c, out: out, in: in, always: always}, nil
}

// Sealing offer and answer in SESSION_SETUP.

// sealOfferRequired: the client refuses an unsealed session.
const sealOfferRequired uint16 = 1

// sealOffer is what a client says about sealing in both SESSION_SETUP
// requests: Flags u16 (sealOfferRequired), Count u16, Count × Cipher u16
// in the client's order of preference. A client that cannot seal sends
// zero flags and no cipher.
type sealOffer struct {
	Flags   uint16
	Ciphers []smbauth.Cipher
}

func (o *sealOffer) code(c coder) {
	c.u16(&o.Flags)
	list16(c, &o.Ciphers, 2, func(ci *smbauth.Cipher) { c.u16((*uint16)(ci)) })
}

func (o *sealOffer) equal(p *sealOffer) bool {
	return o.Flags == p.Flags && slices.Equal(o.Ciphers, p.Ciphers)
}

// setupReq is a SESSION_SETUP request: the NTLMSSP token, then the offer.
type setupReq struct {
	Token []byte
	Offer sealOffer
}

func (m *setupReq) code(c coder) { c.blob(&m.Token); m.Offer.code(c) }

// sealAnswerSealed: every frame after the final SESSION_SETUP response is
// sealed, both ways.
const sealAnswerSealed uint16 = 1

// sealAnswer closes the final SESSION_SETUP response: Flags u16
// (sealAnswerSealed), Cipher u16 (CipherNone: no keys, the session can
// never seal), and the offer as the server read it. The response is signed,
// so a client whose offer was altered on the way sees it.
type sealAnswer struct {
	Flags  uint16
	Cipher smbauth.Cipher
	Echo   sealOffer
}

func (a *sealAnswer) code(c coder) {
	c.u16(&a.Flags)
	c.u16((*uint16)(&a.Cipher))
	a.Echo.code(c)
}

// sealPolicy decides a new session's sealing on the server: the cipher
// (CipherNone: no keys), whether every frame is sealed, or why the session
// is refused. ntlmSeal says NTLM negotiated SEAL.
func (s *Server) sealPolicy(offer sealOffer, ntlmSeal bool) (c smbauth.Cipher, always bool, refuse string) {
	required := offer.Flags&sealOfferRequired != 0
	if s.cfg.Encrypt == EncryptOff {
		if required {
			return smbauth.CipherNone, false, "client requires sealing and this server's encrypt is off"
		}
		return smbauth.CipherNone, false, ""
	}
	if ntlmSeal {
		c = smbauth.ChooseCipher(s.ciphers(), offer.Ciphers)
	}
	wanted := required || s.cfg.Encrypt == EncryptDesired || s.cfg.Encrypt == EncryptRequired
	switch {
	case c != smbauth.CipherNone:
		return c, wanted, ""
	case required:
		return c, false, fmt.Sprintf("client requires sealing but offers no cipher in common (offered %v, server has %v)", offer.Ciphers, s.ciphers())
	case s.cfg.Encrypt == EncryptRequired:
		return c, false, "encrypt = required and the client cannot seal"
	}
	return c, false, ""
}

func (s *Server) ciphers() []smbauth.Cipher {
	if len(s.cfg.Ciphers) > 0 {
		return s.cfg.Ciphers
	}
	return smbauth.DefaultCiphers
}

// offer is what this client sends about sealing.
func (c *Client) offer() sealOffer {
	switch c.cfg.Seal {
	case SealNever:
		return sealOffer{}
	case SealRequired:
		return sealOffer{Flags: sealOfferRequired, Ciphers: c.ciphers()}
	}
	return sealOffer{Ciphers: c.ciphers()}
}

func (c *Client) ciphers() []smbauth.Cipher {
	if len(c.cfg.Ciphers) > 0 {
		return c.cfg.Ciphers
	}
	return smbauth.DefaultCiphers
}

// acceptSeal checks the server's answer against what this client offered
// and NTLM negotiated, and installs the keys.
func (c *Client) acceptSeal(a sealAnswer, offer sealOffer, ntlmSeal bool, key []byte, sessionID uint64) error {
	if !a.Echo.equal(&offer) {
		return fmt.Errorf("session setup: the server read sealing offer %+v, this client sent %+v (altered on the way?)", a.Echo, offer)
	}
	always := a.Flags&sealAnswerSealed != 0
	if a.Cipher == smbauth.CipherNone {
		if always {
			return errors.New("session setup: server says sealed but chose no cipher")
		}
		if c.cfg.Seal == SealRequired {
			return fmt.Errorf("%w: the server did not agree to seal", ErrSealRequired)
		}
		return nil
	}
	if !slices.Contains(offer.Ciphers, a.Cipher) || !ntlmSeal {
		return fmt.Errorf("session setup: server chose cipher %v, which this client did not offer (or NTLM SEAL not negotiated)", a.Cipher)
	}
	if c.cfg.Seal == SealRequired && !always {
		return fmt.Errorf("%w: the server did not seal the session", ErrSealRequired)
	}
	sl, err := newSessionSeal(key, sessionID, a.Cipher, always, false)
	if err != nil {
		return err
	}
	c.seal.Store(sl)
	if always {
		c.startSealing("session setup")
	}
	return nil
}

// startSealing makes every request from now on sealed, and says so.
func (c *Client) startSealing(why string) {
	if !c.sealing.Swap(true) {
		c.log.WithFields(logrus.Fields{"cipher": c.Cipher(), "since": why}).Info("session channel sealed")
	}
}

// Sealed reports whether this session's frames are sealed now (from
// session setup, or since a tree connect to a share that seals).
func (c *Client) Sealed() bool { return c.sealing.Load() }

// Cipher is the cipher the session seals with, CipherNone when it cannot.
func (c *Client) Cipher() smbauth.Cipher {
	if sl := c.seal.Load(); sl != nil {
		return sl.cipher
	}
	return smbauth.CipherNone
}

// setupSealError explains a StatusSealRequired answer to SESSION_SETUP.
func (c *Client) setupSealError() error {
	if c.cfg.Seal == SealRequired {
		return fmt.Errorf("%w: this client requires sealing (-o seal) and the server will not seal with it (its encrypt setting is off, or it has none of the ciphers offered: %v)", ErrSealRequired, c.ciphers())
	}
	return fmt.Errorf("%w: the server requires sealing (encrypt = required) and this client does not seal", ErrSealRequired)
}

// appendHeader starts an encoded frame: the header, and room for the
// sequence when the frame will be sealed.
func appendHeader(b []byte, h Header, sealed bool) []byte {
	b = AppendFrame(b, h, nil)
	if sealed {
		b = append(b, make([]byte, seqSize)...)
	}
	return b
}

// withSeqRoom returns raw (an unsealed encoding) re-laid with room for the
// sequence, for a request encoded just before sealing started.
func withSeqRoom(raw []byte) []byte {
	b := make([]byte, 0, len(raw)+sealOverhead)
	b = append(b, raw[:HeaderSize]...)
	b = append(b, make([]byte, seqSize)...)
	b = append(b, raw[HeaderSize:]...)
	putLength(b)
	return b
}

// checkIn authenticates a frame read on an established session: a sealed
// frame is opened (its body replaced by the plaintext), an unsealed one
// must be signed and must not be where sealing is in force — the session
// was sealed at setup, a sealed frame came before, or it names a tree of a
// share that seals. It runs on the connection's reader, in arrival order.
func (c *serverConn) checkIn(ss *serverSession, f *Frame, raw []byte) error {
	if f.Flags&FlagSealed != 0 {
		if ss.seal == nil {
			return fmt.Errorf("%w: sealed frame on a session without sealing keys", ErrBadSeal)
		}
		body, err := ss.seal.in.open(raw)
		if err != nil {
			c.log.WithError(err).WithFields(logrus.Fields{"msgid": f.MessageID, "cmd": f.Command}).Warn("bad sealed frame")
			return err
		}
		f.Body = body
		c.sealedIn = true
		return nil
	}
	if ss.seal != nil && (ss.seal.always || c.sealedIn || f.TreeID != 0 && ss.treeSeals(f.TreeID)) {
		c.log.WithFields(logrus.Fields{"msgid": f.MessageID, "cmd": f.Command, "tree": f.TreeID}).Warn("unsealed frame where sealing is in force")
		return ErrUnsealed
	}
	if f.Flags&FlagSigned == 0 {
		return ErrUnsigned
	}
	if !ss.macs.verifyFrame(raw) {
		c.log.WithFields(logrus.Fields{"msgid": f.MessageID, "cmd": f.Command}).Warn("bad signature")
		return ErrBadSignature
	}
	return nil
}

package smbauth

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"time"
)

// ClientConfig configures the initiator side of NTLMv2.
type ClientConfig struct {
	User, Domain, Workstation string
	// Password is the plaintext password; when empty, NTHash is used.
	Password string
	// NTHash is the password's NT hash (see NTHash), used when Password is
	// empty. One of the two must be set.
	NTHash *[16]byte
	// Now is the clock for the NTLMv2 TimeStamp when the server sends no
	// MsvAvTimestamp; nil means time.Now.
	Now func() time.Time
	// Rand supplies the client challenge and the random session key; nil
	// means crypto/rand.
	Rand io.Reader
	// DisableKeyExchange leaves NTLMSSP_NEGOTIATE_KEY_EXCH out of the
	// NEGOTIATE, so the exported session key is the session base key itself.
	// The zero value asks for key exchange, as Windows does.
	DisableKeyExchange bool
	// RequestSeal sets NTLMSSP_NEGOTIATE_SEAL in the NEGOTIATE: the caller
	// means to encrypt the session (SMB 3 style; NTLM's own RC4 sealing is
	// never used). Whether the server granted it is in Negotiated. The zero
	// value does not ask.
	RequestSeal bool
}

// clientFlags is what the NEGOTIATE asks for (MS-NLMP §3.1.5.1.1).
const clientFlags = FlagUnicode | FlagRequestTarget | FlagSign | FlagNTLM | FlagAlwaysSign |
	FlagExtendedSessionSecurity | Flag128 | FlagKeyExch | Flag56 | FlagVersion

// Client runs one NTLM exchange as the initiator: Negotiate, then
// Authenticate with the server's challenge. Not safe for concurrent use.
type Client struct {
	cfg        ClientConfig
	negotiate  []byte
	done       bool
	negotiated NegotiateFlags
}

// NewClient returns a client for cfg.
func NewClient(cfg ClientConfig) *Client {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	return &Client{cfg: cfg}
}

// Negotiate returns the NEGOTIATE_MESSAGE that opens the exchange.
func (c *Client) Negotiate() ([]byte, error) {
	if c.cfg.User == "" {
		return nil, errors.New("smbauth: ClientConfig.User is empty (anonymous logon is not supported)")
	}
	if c.cfg.Password == "" && c.cfg.NTHash == nil {
		return nil, errors.New("smbauth: ClientConfig has neither Password nor NTHash")
	}
	m := NegotiateMessage{Flags: c.flags(), Version: &defaultVersion}
	c.negotiate = m.Marshal()
	return clone(c.negotiate), nil
}

// flags is what this client's NEGOTIATE asks for.
func (c *Client) flags() NegotiateFlags {
	flags := clientFlags
	if c.cfg.DisableKeyExchange {
		flags &^= FlagKeyExch
	}
	if c.cfg.RequestSeal {
		flags |= FlagSeal
	}
	return flags
}

// Negotiated returns the flags of the AUTHENTICATE that Authenticate built:
// what the client asked for and the server's CHALLENGE granted (FlagSeal
// among them when both wanted sealing). Zero before Authenticate.
func (c *Client) Negotiated() NegotiateFlags { return c.negotiated }

// Authenticate answers the server's CHALLENGE_MESSAGE with an
// AUTHENTICATE_MESSAGE (MS-NLMP §3.1.5.1.2) and returns the exported session
// key, 16 bytes. When the challenge carries MsvAvTimestamp the response uses
// that time, sends a zero LmChallengeResponse, sets MsvAvFlags MIC-present
// and carries the MIC.
func (c *Client) Authenticate(challenge []byte) (authenticate []byte, sessionKey []byte, err error) {
	if c.negotiate == nil {
		return nil, nil, errors.New("smbauth: Authenticate before Negotiate")
	}
	if c.done {
		return nil, nil, errors.New("smbauth: Client already authenticated; use a new Client per exchange")
	}
	ch, err := ParseChallenge(challenge)
	if err != nil {
		return nil, nil, err
	}
	if ch.Flags&FlagNTLM == 0 || ch.Flags&FlagUnicode == 0 {
		return nil, nil, fmt.Errorf("smbauth: server did not negotiate NTLM with Unicode (flags %v)", ch.Flags)
	}
	c.done = true

	var ntHash [16]byte
	if c.cfg.Password != "" {
		ntHash = NTHash(c.cfg.Password)
	} else {
		ntHash = *c.cfg.NTHash
	}
	key := NTOWFv2(ntHash, c.cfg.User, c.cfg.Domain)

	var clientChallenge [8]byte
	if _, err := io.ReadFull(c.cfg.Rand, clientChallenge[:]); err != nil {
		return nil, nil, fmt.Errorf("smbauth: client challenge: %w", err)
	}
	ts, serverTime := ch.TargetInfo.Timestamp()
	if !serverTime {
		ts = Filetime(c.cfg.Now())
	}
	// The server's AV pairs go back with MsvAvFlags added when a MIC is sent.
	pairs := make(AVPairs, 0, len(ch.TargetInfo)+1)
	avFlags := ch.TargetInfo.Flags()
	if serverTime {
		avFlags |= AvFlagMICPresent
	}
	for _, p := range ch.TargetInfo {
		if p.ID != AvFlags {
			pairs = append(pairs, p)
		}
	}
	if avFlags != 0 {
		pairs = append(pairs, AVPair{AvFlags, le.AppendUint32(nil, avFlags)})
	}
	temp := ntlmv2Temp(ts, clientChallenge, pairs.Marshal())
	proof := ntProofStr(key, ch.ServerChallenge, temp)
	base := sessionBaseKey(key, proof)

	flags := ch.Flags & (c.flags() | FlagTargetInfo | FlagTargetTypeDomain | FlagTargetTypeServer)
	c.negotiated = flags
	m := AuthenticateMessage{
		Flags:               flags,
		NtChallengeResponse: append(proof[:], temp...),
		DomainName:          c.cfg.Domain,
		UserName:            c.cfg.User,
		Workstation:         c.cfg.Workstation,
		Version:             &defaultVersion,
	}
	if serverTime {
		m.LmChallengeResponse = make([]byte, 24) // Z(24), §3.1.5.1.2
		m.MIC = make([]byte, authMICSize)
	} else {
		m.LmChallengeResponse = lmv2Response(key, ch.ServerChallenge, clientChallenge)
	}
	exported := base[:]
	if flags&FlagKeyExch != 0 {
		exported = make([]byte, 16)
		if _, err := io.ReadFull(c.cfg.Rand, exported); err != nil {
			return nil, nil, fmt.Errorf("smbauth: random session key: %w", err)
		}
		m.EncryptedRandomSessionKey = rc4K(base[:], exported)
	}
	out := m.Marshal()
	if serverTime {
		mic := computeMIC(exported, c.negotiate, challenge, out)
		copy(out[authMICOffset:], mic[:])
	}
	return out, clone(exported), nil
}

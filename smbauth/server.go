package smbauth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// ServerConfig configures the acceptor side of NTLMv2.
type ServerConfig struct {
	// TargetName is the CHALLENGE TargetName and MsvAvNbDomainName, usually
	// the NetBIOS domain (or workgroup) name. Empty means NetbiosComputer,
	// and the target type becomes "server".
	TargetName string
	// NetbiosComputer is MsvAvNbComputerName. Empty means "LWIO".
	NetbiosComputer string
	// DNSDomain is MsvAvDnsDomainName. Empty means the lower-cased TargetName.
	DNSDomain string
	// DNSComputer is MsvAvDnsComputerName. Empty means the lower-cased
	// NetbiosComputer.
	DNSComputer string
	// Lookup returns the NT hash (see NTHash) of a user, given the user and
	// domain names exactly as the client sent them; it decides itself
	// whether names are case-sensitive and whether the domain matters.
	// It should take as long for an unknown user as for a known one (a map
	// lookup does); everything after it does. It must not be nil.
	Lookup func(user, domain string) (ntHash [16]byte, ok bool)
	// Now is the clock for MsvAvTimestamp and the timestamp check; nil means
	// time.Now.
	Now func() time.Time
	// Rand supplies server challenges; nil means crypto/rand.
	Rand io.Reader
	// RequireMIC refuses an AUTHENTICATE without a MIC. The zero value
	// follows MS-NLMP §3.2.5.1.2: a MIC is verified when the client's
	// MsvAvFlags announce one, and clients that never send one (impacket,
	// curl, older Samba) may still log on. Stripping a MIC the client did
	// announce is impossible either way: MsvAvFlags is under NTProofStr.
	RequireMIC bool
	// MaxClockSkew bounds how far the NTLMv2 response's TimeStamp may be from
	// Now when the Authenticate is checked. A client echoing our
	// MsvAvTimestamp (as MS-NLMP §3.1.5.1.2 asks) sends the challenge's own
	// time, so this also bounds how long a challenge stays answerable. Zero
	// means DefaultMaxClockSkew; negative disables the check.
	MaxClockSkew time.Duration
	// DisableSeal leaves NTLMSSP_NEGOTIATE_SEAL out of the CHALLENGE even
	// when the client asks for it, for a server that will not encrypt. The
	// zero value grants it, as MS-NLMP §3.2.5.1.1 requires of a server
	// whose client sets it.
	DisableSeal bool
}

// DefaultMaxClockSkew is the MaxClockSkew used when the configuration leaves
// it zero: the customary Kerberos-style five minutes.
const DefaultMaxClockSkew = 5 * time.Minute

// serverFlags are the flags this server is willing to negotiate; the
// CHALLENGE carries their intersection with the client's request plus the
// flags the server always sets (MS-NLMP §3.2.5.1.1).
const serverFlags = FlagUnicode | FlagRequestTarget | FlagSign | FlagSeal | FlagNTLM | FlagAlwaysSign |
	FlagExtendedSessionSecurity | Flag128 | FlagKeyExch | Flag56

// Server issues challenges and checks answers. It is safe for concurrent use;
// each exchange gets its own ServerState.
type Server struct {
	cfg ServerConfig
	// dummy is the NT hash unknown users are checked against, so that they
	// cost the same work as a wrong password.
	dummy [16]byte
}

// NewServer returns a server for cfg.
func NewServer(cfg ServerConfig) *Server {
	if cfg.NetbiosComputer == "" {
		cfg.NetbiosComputer = "LWIO"
	}
	if cfg.TargetName == "" {
		cfg.TargetName = cfg.NetbiosComputer
	}
	if cfg.DNSDomain == "" {
		cfg.DNSDomain = strings.ToLower(cfg.TargetName)
	}
	if cfg.DNSComputer == "" {
		cfg.DNSComputer = strings.ToLower(cfg.NetbiosComputer)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	if cfg.MaxClockSkew == 0 {
		cfg.MaxClockSkew = DefaultMaxClockSkew
	}
	s := &Server{cfg: cfg}
	_, _ = rand.Read(s.dummy[:]) // crypto/rand.Read never fails (Go 1.24+)
	return s
}

// ServerState is one NTLM exchange on the server: the NEGOTIATE and
// CHALLENGE it saw and sent, for the MIC, and whether its single Authenticate
// has happened. Single use: a second Authenticate fails with ErrLogonFailure.
type ServerState struct {
	s         *Server
	negotiate []byte
	challenge []byte
	msg       ChallengeMessage

	mu   sync.Mutex
	used bool
}

// Result is a successful authentication.
type Result struct {
	User, Domain, Workstation string
	// SessionKey is the 16-byte ExportedSessionKey (MS-NLMP §3.2.5.1.2), the
	// key the session signs with.
	SessionKey []byte
	// Flags are the AUTHENTICATE's negotiate flags that the CHALLENGE also
	// offered: FlagSeal is set when both ends agreed to seal. Without a MIC
	// (RequireMIC) they are not integrity-protected.
	Flags NegotiateFlags
}

// Challenge answers a NEGOTIATE_MESSAGE with a CHALLENGE_MESSAGE
// (MS-NLMP §3.2.5.1.1) and the state that will check the client's answer.
// It fails on a malformed message, or a client that offers neither NTLM nor
// Unicode.
func (s *Server) Challenge(negotiate []byte) (challenge []byte, st *ServerState, err error) {
	if s.cfg.Lookup == nil {
		return nil, nil, errors.New("smbauth: ServerConfig.Lookup is nil")
	}
	neg, err := ParseNegotiate(negotiate)
	if err != nil {
		return nil, nil, err
	}
	if neg.Flags&FlagNTLM == 0 {
		return nil, nil, fmt.Errorf("smbauth: client does not offer NTLM (flags %v)", neg.Flags)
	}
	if neg.Flags&FlagUnicode == 0 {
		return nil, nil, fmt.Errorf("smbauth: client does not offer Unicode (flags %v)", neg.Flags)
	}
	flags := neg.Flags&serverFlags | FlagUnicode | FlagNTLM | FlagAlwaysSign |
		FlagExtendedSessionSecurity | FlagTargetInfo | FlagVersion
	if s.cfg.DisableSeal {
		flags &^= FlagSeal
	}
	if s.cfg.TargetName == s.cfg.NetbiosComputer {
		flags |= FlagTargetTypeServer
	} else {
		flags |= FlagTargetTypeDomain
	}
	m := ChallengeMessage{
		Flags:      flags,
		TargetName: s.cfg.TargetName,
		TargetInfo: AVPairs{
			{AvNbDomainName, utf16le(s.cfg.TargetName)},
			{AvNbComputerName, utf16le(s.cfg.NetbiosComputer)},
			{AvDNSDomainName, utf16le(s.cfg.DNSDomain)},
			{AvDNSComputerName, utf16le(s.cfg.DNSComputer)},
			{AvTimestamp, le.AppendUint64(nil, Filetime(s.cfg.Now()))},
		},
		Version: &defaultVersion,
	}
	if _, err := io.ReadFull(s.cfg.Rand, m.ServerChallenge[:]); err != nil {
		return nil, nil, fmt.Errorf("smbauth: server challenge: %w", err)
	}
	challenge = m.Marshal()
	st = &ServerState{s: s, negotiate: clone(negotiate), challenge: challenge, msg: m}
	return clone(challenge), st, nil
}

// Authenticate checks an AUTHENTICATE_MESSAGE against this exchange's
// challenge (MS-NLMP §3.2.5.1.2) and returns who it is and the exported
// session key. Malformed input yields an error wrapping ErrMalformed; every
// authentication failure (unknown user, wrong password, replay, anonymous,
// NTLMv1, bad or (with RequireMIC) missing MIC, stale timestamp) yields
// ErrLogonFailure. The state is spent by the first call whatever its outcome.
func (st *ServerState) Authenticate(authenticate []byte) (Result, error) {
	st.mu.Lock()
	used := st.used
	st.used = true
	st.mu.Unlock()
	if used {
		return Result{}, ErrLogonFailure
	}
	m, err := ParseAuthenticate(authenticate)
	if err != nil {
		return Result{}, err
	}
	// Anonymous (§3.2.5.1.2: empty user and responses) and NTLMv1 (24-byte
	// NtChallengeResponse) are refused outright: neither proves a password.
	if m.UserName == "" || len(m.NtChallengeResponse) <= 24 || m.Flags&FlagAnonymous != 0 {
		return Result{}, ErrLogonFailure
	}
	v2, err := parseNTLMv2Response(m.NtChallengeResponse)
	if err != nil {
		return Result{}, err
	}
	cfg := &st.s.cfg

	// Same work for known and unknown users: an unknown user is checked
	// against a random hash no response can match.
	hash, known := cfg.Lookup(m.UserName, m.DomainName)
	if !known {
		hash = st.s.dummy
	}
	key := NTOWFv2(hash, m.UserName, m.DomainName)
	proof := ntProofStr(key, st.msg.ServerChallenge, v2.temp)
	ok := hmac.Equal(proof[:], v2.proof[:])

	base := sessionBaseKey(key, v2.proof)
	exported := base[:] // KeyExchangeKey = SessionBaseKey for NTLMv2 (§3.4.5.1)
	if m.Flags&FlagKeyExch != 0 {
		if st.msg.Flags&FlagKeyExch == 0 || len(m.EncryptedRandomSessionKey) != 16 {
			ok = false
		} else {
			exported = rc4K(base[:], m.EncryptedRandomSessionKey)
		}
	}

	// The MIC is computed whether or not one was sent, so that its absence
	// costs the same work as its presence.
	hasMIC := v2.avPairs.Flags()&AvFlagMICPresent != 0 && len(m.MIC) == authMICSize
	mic := computeMIC(exported, st.negotiate, st.challenge, micSource(authenticate, hasMIC))
	if hasMIC && subtle.ConstantTimeCompare(mic[:], m.MIC) != 1 {
		ok = false
	}
	if !hasMIC && cfg.RequireMIC {
		ok = false
	}

	if cfg.MaxClockSkew > 0 {
		d := FiletimeTime(v2.timestamp).Sub(cfg.Now())
		if d > cfg.MaxClockSkew || d < -cfg.MaxClockSkew {
			ok = false
		}
	}
	if !ok || !known {
		return Result{}, ErrLogonFailure
	}
	return Result{
		User:        m.UserName,
		Domain:      m.DomainName,
		Workstation: m.Workstation,
		SessionKey:  clone(exported),
		Flags:       m.Flags & st.msg.Flags,
	}, nil
}

// micSource returns the message the MIC is computed over. Without a MIC the
// computation still runs, so a missing MIC costs what a wrong one does; a
// message too short to hold the MIC field is replaced by zeros of the
// minimum length, which computeMIC can clear the field of.
func micSource(authenticate []byte, hasMIC bool) []byte {
	if hasMIC {
		return authenticate
	}
	if len(authenticate) < authMICOffset+authMICSize {
		return make([]byte, authMICOffset+authMICSize)
	}
	return authenticate
}

package transport

import (
	"crypto/cipher"
	"errors"
)

// SealConfig keys the framing of a connection that can encrypt what it
// carries (Sealable). The transport knows nothing of where the keys come
// from: the layer above derives them (protocol: from the session key and
// the connection's authentication) and hands them over.
type SealConfig struct {
	// Send seals what this end sends, Recv opens what the peer sends.
	// Both use 12-byte nonces; each direction needs its own key, since
	// both ends count their frames from 1.
	Send, Recv cipher.AEAD
	// Lead: every frame this end sends from the call on is sealed. The
	// other end (not Lead) keeps sending in clear until the first sealed
	// frame from its peer arrives, which proves the peer holds the keys;
	// from then on it seals too. An end that calls Seal before any frame
	// has crossed may lead on both sides.
	Lead bool
}

// Sealable is a Conn whose provider can encrypt and authenticate every
// frame it puts on the wire (softrdma). Once Seal returns, a frame from
// the peer that does not authenticate, arrives out of order or in clear
// after the first sealed one ends the connection with a log line; in
// clear the peer may send only acknowledgements, and only until its first
// sealed frame.
type Sealable interface {
	Conn
	Seal(cfg SealConfig) error
}

// ErrNotSealable is returned when a connection was asked to seal and its
// provider cannot (verbs: the NIC places data in memory itself).
var ErrNotSealable = errors.New("transport: the provider cannot seal its connections")

// Seal seals c, or returns ErrNotSealable when its provider cannot.
func Seal(c Conn, cfg SealConfig) error {
	s, ok := c.(Sealable)
	if !ok {
		return ErrNotSealable
	}
	return s.Seal(cfg)
}

// CanSeal reports whether c's provider can seal its frames.
func CanSeal(c Conn) bool {
	_, ok := c.(Sealable)
	return ok
}

// SealingProvider is a Provider that says whether its connections are
// Sealable, so a server can offer a sealed session only the providers
// that will not carry its data in clear.
type SealingProvider interface {
	SealsConnections() bool
}

// ProviderSeals reports whether p's connections can seal.
func ProviderSeals(p Provider) bool {
	s, ok := p.(SealingProvider)
	return ok && s.SealsConnections()
}

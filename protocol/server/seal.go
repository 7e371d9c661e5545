package server

import (
	"crypto/rand"
	"fmt"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
)

// dataSeal is how an authenticating connection of a sealed session will
// seal: the keys to hand the transport once the server's parameters are
// built, and the server's nonce they carry. The zero value: not sealed.
type dataSeal struct {
	cipher smbauth.Cipher
	nonce  [protocol.AuthOptionNonceLength]byte
}

// sealDecision decides an AUTH's sealing (docs/security.md, "Data
// connections"): a sealed session's connection seals its frames when the
// provider can (softrdma); one that cannot (verbs) is refused unless
// Config.TrustedFabric says its data may cross the fabric in clear. A
// refusal returns why.
func (c *conn) sealDecision(id uint64, p *protocol.AuthParams) (dataSeal, string) {
	cph := c.s.cfg.Authority.DataCipher(id)
	if cph == smbauth.CipherNone {
		return dataSeal{}, ""
	}
	if !transport.CanSeal(c.tc) {
		if !c.s.cfg.TrustedFabric {
			return dataSeal{}, fmt.Sprintf("the session is sealed and %s connections cannot seal; the server does not trust the fabric (trusted_fabric = false)", c.tc.Provider())
		}
		c.log.WithField("session", id).Warn("lwio: sealed session's data in clear on a trusted fabric (trusted_fabric = true)")
		return dataSeal{}, ""
	}
	if !p.HasNonce {
		return dataSeal{}, "the session is sealed and the client's AUTH has no Nonce (a client that cannot seal its data connections)"
	}
	ds := dataSeal{cipher: cph}
	if _, err := rand.Read(ds.nonce[:]); err != nil {
		return dataSeal{}, fmt.Sprintf("server nonce: %v", err)
	}
	return ds, ""
}

// startSeal keys the connection's framing from the session key, the
// negotiate Key and both AUTH nonces (smbauth.DataSealKeys), the server's
// being the one its parameters will carry. The server follows: its frames
// stay clear (the AUTH response among them) until the client's first
// sealed frame shows the client has the keys too.
func (c *conn) startSeal(ds dataSeal, sessionKey []byte, key, clientNonce [16]byte) error {
	recv, send, err := smbauth.DataSealAEADs(sessionKey, key, clientNonce, ds.nonce, ds.cipher)
	if err != nil {
		return err
	}
	if err := transport.Seal(c.tc, transport.SealConfig{Send: send, Recv: recv}); err != nil {
		return err
	}
	c.inPlace.Store(false)
	c.log.WithField("cipher", ds.cipher).Info("lwio: connection sealed")
	return nil
}

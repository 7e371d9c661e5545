package client

import (
	"fmt"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
)

// startSeal seals an authenticated connection of a sealed session
// (docs/security.md, "Data connections"): keys from the session key, the
// negotiate Key and both nonces (smbauth.DataSealKeys). The client leads:
// every frame it sends from here on is sealed, and the server seals once it
// sees the first. sealing says this end sent a nonce; a connection whose
// provider cannot seal carries the data in clear only because the server
// accepted it, which it does only when told its fabric is trusted.
func (c *conn) startSeal(cp, sp *protocol.AuthParams, sealing bool) error {
	cfg := &c.cl.cfg
	switch {
	case cfg.Cipher == smbauth.CipherNone:
		if sp.HasNonce {
			return fmt.Errorf("%w: server sent a Nonce to a session that is not sealed", errAuth)
		}
		return nil
	case !sealing:
		if sp.HasNonce {
			return fmt.Errorf("%w: server sent a Nonce on a connection that cannot seal", errAuth)
		}
		c.log.Warn("lwio: sealed session's data in clear on a provider that cannot seal (the server trusts its fabric)")
		return nil
	case !sp.HasNonce:
		return fmt.Errorf("%w: the session is sealed and the server did not seal the data connection (no Nonce)", errAuth)
	}
	send, recv, err := smbauth.DataSealAEADs(cfg.SigningKey, cp.Key, cp.Nonce, sp.Nonce, cfg.Cipher)
	if err != nil {
		return err
	}
	if err := transport.Seal(c.tc, transport.SealConfig{Send: send, Recv: recv, Lead: true}); err != nil {
		return err
	}
	c.log.WithField("cipher", cfg.Cipher).Debug("lwio: connection sealed")
	return nil
}

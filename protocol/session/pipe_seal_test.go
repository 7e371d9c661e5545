package session

import (
	"fmt"
	"testing"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
)

// TestNegotiateSealed: a sealed session is offered only the providers
// whose connections seal (softrdma), unless the server trusts its fabric;
// an unsealed session is offered every common provider. DataCipher tells
// the engine the session's cipher, or none.
func TestNegotiateSealed(t *testing.T) {
	verbs, soft := prov("verbs", "10.0.0.1"), prov("softrdma", "127.0.0.1")
	soft.Seals = true
	for _, tc := range []struct {
		name    string
		mode    SealMode
		trusted bool
		want    []transport.ProviderInfo
	}{
		{"unsealed", SealNever, false, []transport.ProviderInfo{verbs, soft}},
		{"sealed", SealRequired, false, []transport.ProviderInfo{soft}},
		{"sealed, trusted fabric", SealRequired, true, []transport.ProviderInfo{verbs, soft}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(c *ServerConfig) {
				c.Providers = []transport.ProviderInfo{verbs, soft}
				c.TrustedFabric = tc.trusted
			})
			c, err := e.dialSeal("", tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := c.TreeConnect(ctxT(t), "data")
			if err != nil {
				t.Fatal(err)
			}
			req := protocol.NewNegotiateRequest("client", [16]byte{1}, []transport.ProviderInfo{prov("verbs", "10.0.0.2"), prov("softrdma", "127.0.0.2")})
			resp, err := tr.Negotiate(ctxT(t), req)
			if err != nil {
				t.Fatal(err)
			}
			// Seals is not on the wire: compare names and instances.
			strip := func(ps []transport.ProviderInfo) string {
				out := make([]transport.ProviderInfo, len(ps))
				for i, p := range ps {
					out[i] = transport.ProviderInfo{Name: p.Name, Instances: p.Instances}
				}
				return fmt.Sprint(out)
			}
			if got, want := strip(resp.Providers), strip(tc.want); got != want {
				t.Errorf("offered %s, want %s", got, want)
			}
			wantCipher := smbauth.CipherNone
			if tc.mode == SealRequired {
				wantCipher = c.Cipher()
			}
			if got := e.srv.DataCipher(c.SessionID()); got != wantCipher || (tc.mode == SealRequired && got == smbauth.CipherNone) {
				t.Errorf("DataCipher = %v, want %v", got, wantCipher)
			}
		})
	}
}

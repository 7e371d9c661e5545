package session

import (
	"context"
	"fmt"
	"testing"

	"github.com/lwiofs/lwiofs/smbauth"
)

// BenchmarkSealFrame is the cost of sealing a frame and opening it again
// (both ends' work for one frame), against signing and verifying it as an
// unsealed session does, for a GETATTR-sized body (128 bytes) and a 1 MiB
// WRITE.
func BenchmarkSealFrame(b *testing.B) {
	for _, body := range []int{128, 1 << 20} {
		for _, c := range []smbauth.Cipher{smbauth.CipherAES128GCM, smbauth.CipherAES256GCM} {
			b.Run(fmt.Sprintf("%s/%d", c, body), func(b *testing.B) {
				c2s, _ := smbauth.SessionSealKeys(make([]byte, 16), 1, c)
				out, _ := newSealer(c, c2s)
				in, _ := newSealer(c, c2s)
				raw := make([]byte, sealedBodyOffset+body, sealedBodyOffset+body+tagSize)
				copy(raw, appendHeader(nil, Header{Command: CmdWrite}, true))
				putLength(raw)
				b.SetBytes(int64(body))
				for b.Loop() {
					if err := out.seal(raw); err != nil {
						b.Fatal(err)
					}
					if _, err := in.open(raw); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(fmt.Sprintf("HMAC-SHA256/%d", body), func(b *testing.B) {
			m := newMACs(make([]byte, 16))
			raw := make([]byte, HeaderSize+body)
			copy(raw, AppendFrame(nil, Header{Command: CmdWrite}, nil))
			putLength(raw)
			b.SetBytes(int64(body))
			for b.Loop() {
				m.signFrame(raw)
				if !m.verifyFrame(raw) {
					b.Fatal("does not verify")
				}
			}
		})
	}
}

// BenchmarkGetAttrSealed is BenchmarkGetAttr on a session sealed with
// AES-128-GCM: the per-request cost of sealing at queue depth 1.
func BenchmarkGetAttrSealed(b *testing.B) {
	e := newEnv(b)
	e.writeFile("f", "x")
	c, err := e.dialSeal("", SealRequired)
	if err != nil {
		b.Fatal(err)
	}
	tr, err := c.TreeConnect(context.Background(), "data")
	if err != nil || !c.Sealed() {
		b.Fatalf("tree connect: %v (sealed %v)", err, c.Sealed())
	}
	getAttrLoop(b, tr)
}

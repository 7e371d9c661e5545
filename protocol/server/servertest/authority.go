// Package servertest holds what tests of the LWIO server and of its
// clients need alike: an Authority over maps, standing in for the session
// layer that issues negotiate Keys and resume keys; a GatedFile that holds
// the server's reads and writes until the test lets them go; ServeOn, a
// server serving on a loopback port; and Peer, a hand-driven LWIO client
// for transcript tests. It is for _test.go files only.
package servertest

import (
	"crypto/rand"
	"encoding/binary"
	"sync"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
)

// Authority is a server.Authority (protocol/server) over maps: the
// sessions negotiate Keys were issued to, and the files resume keys name.
// The zero value is not ready: use NewAuthority.
type Authority struct {
	mu       sync.Mutex
	sessions map[[16]byte]session
	files    map[uint64]map[protocol.ResumeKey]share.File
	nextKey  uint64
	cipher   smbauth.Cipher // sessions keyed from now on are sealed with it
}

type session struct {
	id     uint64
	key    []byte
	cipher smbauth.Cipher // the session is sealed with it
}

// NewAuthority returns an Authority with no sessions and no files.
func NewAuthority() *Authority {
	return &Authority{sessions: map[[16]byte]session{}, files: map[uint64]map[protocol.ResumeKey]share.File{}}
}

// SealWith makes the sessions NegotiateKey keys from now on sealed with c
// (smbauth.CipherNone: not sealed, as at first).
func (a *Authority) SealWith(c smbauth.Cipher) {
	a.mu.Lock()
	a.cipher = c
	a.mu.Unlock()
}

// NegotiateKey issues a negotiate Key for session id with its signing key,
// as \PIPE\LWIO does.
func (a *Authority) NegotiateKey(id uint64, signingKey []byte) [16]byte {
	var k [16]byte
	rand.Read(k[:])
	a.mu.Lock()
	a.sessions[k] = session{id: id, key: signingKey, cipher: a.cipher}
	a.mu.Unlock()
	return k
}

// AnotherKey issues one more negotiate Key for the session that key
// belongs to, as a second \PIPE\LWIO negotiate would: a Key authenticates
// one connection only.
func (a *Authority) AnotherKey(key [16]byte) [16]byte {
	var k [16]byte
	rand.Read(k[:])
	a.mu.Lock()
	a.sessions[k] = a.sessions[key]
	a.mu.Unlock()
	return k
}

// AddFile issues a resume key for f on session id.
func (a *Authority) AddFile(id uint64, f share.File) protocol.ResumeKey {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextKey++
	var k protocol.ResumeKey
	binary.LittleEndian.PutUint64(k[:], a.nextKey)
	rand.Read(k[8:])
	if a.files[id] == nil {
		a.files[id] = map[protocol.ResumeKey]share.File{}
	}
	a.files[id][k] = f
	return k
}

// SessionByKey is server.Authority's.
func (a *Authority) SessionByKey(key [16]byte) (uint64, []byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sessions[key]
	return s.id, s.key, ok
}

// OpenByResumeKey is server.Authority's: StatusInvalidHandle for a key
// AddFile did not issue on session id.
func (a *Authority) OpenByResumeKey(id uint64, key [24]byte) (share.File, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f, ok := a.files[id][key]
	if !ok {
		return nil, protocol.StatusInvalidHandle
	}
	return f, nil
}

// DataCipher is server.Authority's: the cipher session id was keyed with.
func (a *Authority) DataCipher(id uint64) smbauth.Cipher {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.sessions {
		if s.id == id {
			return s.cipher
		}
	}
	return smbauth.CipherNone
}

package session

import (
	"crypto/rand"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// StatusNetworkNameDeleted answers a request naming a TreeID the session
// does not have (MS-SMB2 3.3.5.2.11).
const StatusNetworkNameDeleted = protocol.Status(0xC00000C9)

// serverSession is an authenticated session: its key, trees, open files
// and the LWIO keys issued to it. It lives as long as its connection.
type serverSession struct {
	id   uint64
	key  []byte
	macs *macs        // signs and verifies with key
	seal *sessionSeal // sealing keys; nil: the session cannot seal
	user string       // lower-cased

	mu       sync.Mutex
	trees    map[uint32]*share
	nextTree uint32
	handles  map[Handle]*openFile
	nextH    uint64
	lwioKeys [][16]byte // guarded by Server.mu
	listing  dirListing // READDIR continuation cache

	sealTrees map[uint32]bool // guarded by mu: trees whose every frame must be sealed
}

// openFile is an open handle: a file, a directory or the \PIPE\LWIO pipe.
// It is also the File the LWIO engine reaches through a resume key.
type openFile struct {
	sess     *serverSession
	share    *share // nil for a pipe
	f        *os.File
	pipe     bool
	readOnly bool // opened O_RDONLY or on a read-only share

	resumeKey *[24]byte // guarded by Server.mu
	closed    atomic.Bool
}

var _ File = (*openFile)(nil)

// ReadAt reads from the open file (pread).
func (of *openFile) ReadAt(p []byte, off int64) (int, error) {
	if of.f == nil {
		return 0, protocol.StatusInvalidDeviceRequest
	}
	return of.f.ReadAt(p, off)
}

// WriteAt writes to the open file (pwrite); a read-only open refuses.
func (of *openFile) WriteAt(p []byte, off int64) (int, error) {
	if of.f == nil {
		return 0, protocol.StatusInvalidDeviceRequest
	}
	if of.readOnly {
		if of.share != nil && of.share.ReadOnly {
			return 0, protocol.StatusMediaWriteProtected
		}
		return 0, protocol.StatusAccessDenied
	}
	// Not os.File.WriteAt, which refuses files opened with O_APPEND; on
	// Linux pwrite(2) to such a file appends, which is what the opener
	// asked for.
	n := 0
	err := withFd(of.f, func(fd int) error {
		for n < len(p) {
			k, err := unix.Pwrite(fd, p[n:], off+int64(n))
			if err != nil {
				return err
			}
			if k == 0 {
				return io.ErrShortWrite
			}
			n += k
		}
		return nil
	})
	return n, err
}

// Sync flushes the file to stable storage (fsync).
func (of *openFile) Sync() error {
	if of.f == nil {
		return protocol.StatusInvalidDeviceRequest
	}
	return of.f.Sync()
}

// ReadOnly reports whether writes through this open are refused.
func (of *openFile) ReadOnly() bool { return of.readOnly }

// addHandle registers an open on the session and returns its handle, or
// STATUS_INSUFFICIENT_RESOURCES when the session already holds max.
func (ss *serverSession) addHandle(of *openFile, max int) (Handle, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.handles) >= max {
		return 0, protocol.StatusInsufficientResources
	}
	ss.nextH++
	h := Handle(ss.nextH)
	ss.handles[h] = of
	return h, nil
}

func (ss *serverSession) handle(h Handle) (*openFile, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	of, ok := ss.handles[h]
	return of, ok
}

func (ss *serverSession) removeHandle(h Handle) (*openFile, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	of, ok := ss.handles[h]
	delete(ss.handles, h)
	return of, ok
}

func (ss *serverSession) tree(id uint32) (*share, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sh, ok := ss.trees[id]
	return sh, ok
}

// treeConnect checks the share and the user's right to it.
func (s *Server) treeConnect(ss *serverSession, name string) (uint32, *share, error) {
	name = strings.TrimPrefix(name, `\\`)
	if i := strings.LastIndexAny(name, `\/`); i >= 0 {
		name = name[i+1:] // accept \\server\share as well as share
	}
	sh, ok := s.shares[strings.ToLower(name)]
	if !ok {
		return 0, nil, protocol.StatusBadNetworkName
	}
	if sh.users != nil && !sh.users[ss.user] {
		return 0, nil, protocol.StatusAccessDenied
	}
	seals := ss.seal != nil && (sh.Encrypt == EncryptDesired || sh.Encrypt == EncryptRequired)
	if sh.Encrypt == EncryptRequired && ss.seal == nil {
		s.log.WithFields(logrus.Fields{"session": ss.id, "user": ss.user, "share": sh.Name}).
			Warn("tree connect refused: the share requires sealing (encrypt = required) and this session cannot seal (the client does not, or the server's encrypt is off)")
		return 0, nil, StatusSealRequired
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.nextTree++
	ss.trees[ss.nextTree] = sh
	if seals {
		if ss.sealTrees == nil {
			ss.sealTrees = map[uint32]bool{}
		}
		ss.sealTrees[ss.nextTree] = true
	}
	return ss.nextTree, sh, nil
}

// treeSeals reports whether every frame naming tree id must be sealed.
func (ss *serverSession) treeSeals(id uint32) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.sealTrees[id]
}

// sealed reports whether any of the session's traffic is sealed.
func (ss *serverSession) sealed() bool {
	if ss.seal == nil {
		return false
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.seal.always || len(ss.sealTrees) > 0
}

// newResumeKey issues a resume key for an open (FSCTL_SRV_REQUEST_RESUME_KEY).
// The key is 24 bytes from crypto/rand (the seed's ResumeKey, Timestamp and
// Pid fields are opaque to the client, so all 24 bytes are random), bound to
// the open and so to its session; one key per open, issued again on request.
func (s *Server) newResumeKey(of *openFile) ([24]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if of.closed.Load() {
		return [24]byte{}, protocol.StatusFileClosed
	}
	if of.resumeKey != nil {
		return *of.resumeKey, nil
	}
	var k [24]byte
	for {
		if _, err := rand.Read(k[:]); err != nil {
			return k, err
		}
		if _, taken := s.resumeKeys[k]; !taken {
			break
		}
	}
	s.resumeKeys[k] = of
	of.resumeKey = &k
	return k, nil
}

// maxLWIOKeys bounds the negotiate keys one session holds; the oldest is
// forgotten first.
const maxLWIOKeys = 64

// newLWIOKey issues a negotiate Key GUID bound to the session.
func (s *Server) newLWIOKey(ss *serverSession) ([16]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, live := s.sessions[ss.id]; !live {
		return [16]byte{}, protocol.StatusAccessDenied
	}
	var k [16]byte
	for {
		if _, err := rand.Read(k[:]); err != nil {
			return k, err
		}
		if _, taken := s.lwioKeys[k]; !taken {
			break
		}
	}
	s.lwioKeys[k] = ss
	ss.lwioKeys = append(ss.lwioKeys, k)
	if len(ss.lwioKeys) > maxLWIOKeys {
		// A client negotiates once per mount or reconnect; a session that
		// keeps asking only ever needs its recent keys.
		delete(s.lwioKeys, ss.lwioKeys[0])
		ss.lwioKeys = append(ss.lwioKeys[:0], ss.lwioKeys[1:]...)
	}
	return k, nil
}

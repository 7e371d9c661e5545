package session

import (
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// StatusNetworkNameDeleted answers a request naming a TreeID the session
// does not have (MS-SMB2 3.3.5.2.11).
const StatusNetworkNameDeleted = protocol.Status(0xC00000C9)

// StatusNoSuchUser (0xC0000064, [MS-ERREF]) ends a session setup whose
// credentials were right but whose user has no Unix account on the server
// (and no guest account is configured). Only a user who proved the
// password learns it; a wrong password is LOGON_FAILURE whatever the
// account database says.
const StatusNoSuchUser = protocol.Status(0xC0000064)

// serverSession is an authenticated session: its key, trees, open files
// and the LWIO keys issued to it. It lives as long as its connection.
type serverSession struct {
	id   uint64
	key  []byte
	macs *macs        // signs and verifies with key
	seal *sessionSeal // sealing keys; nil: the session cannot seal
	user string       // lower-cased
	// ident is who the session's trees act as (its Unix account).
	ident share.Identity
	conn  *serverConn // answers what is answered later (a lock wait)

	loggedOff atomic.Bool // LOGOFF: nothing is kept for a reconnect

	mu       sync.Mutex
	trees    map[uint32]*share.Tree
	nextTree uint32
	handles  map[Handle]*openFile
	nextH    uint64
	locks    *share.LockSpace         // where new opens' lock owners live (server_lock.go)
	waits    map[uint64]*share.Waiter // waiting LOCKs by MessageID
	lwioKeys [][16]byte               // guarded by Server.mu

	sendBreak func(tree uint32, b share.LeaseBreak) // the connection's (lease.go)
	sealTrees map[uint32]bool                       // guarded by mu: trees whose every frame must be sealed

	warnedLimit atomic.Bool // overLimit logged
}

// openFile is an open handle: a file or directory a tree opened, or the
// \PIPE\LWIO pipe. Its file is what the LWIO engine reaches through a
// resume key.
type openFile struct {
	sess  *serverSession   // guarded by Server.mu: a reconnect moves a durable open
	file  *share.OpenFile  // nil for the pipe
	locks *share.LockSpace // where locks taken through it live
	user  string           // who opened it (a durable open is reclaimed by the same user)

	durable   DurableID   // zero: closes with its session; guarded by Server.mu
	parked    *time.Timer // set while kept after its connection ended; guarded by Server.mu
	resumeKey *[24]byte   // guarded by Server.mu
	closed    atomic.Bool
	fid       atomic.Uint32 // the LWIO Fid OPEN registered it as (register.go), or 0
}

// addHandle registers an open on the session and returns its handle, or
// STATUS_TOO_MANY_OPENED_FILES when the session already holds max.
func (ss *serverSession) addHandle(of *openFile, max int) (Handle, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.handles) >= max {
		return 0, ntstatus.TooManyOpenedFiles
	}
	ss.nextH++
	h := Handle(ss.nextH)
	ss.handles[h] = of
	return h, nil
}

// overLimit logs, once per session, that it hit a handle limit.
func (ss *serverSession) overLimit(log logrus.FieldLogger, err error, b *handleBudget) {
	if ss.warnedLimit.Swap(true) {
		return
	}
	user, total := b.held(ss.user)
	log.WithFields(logrus.Fields{"session": ss.id, "user": ss.user, "user_handles": user, "server_handles": total,
		"status": ntstatus.FromError(err)}).Warn("open refused: handle limit reached (max_open_files_per_user, or max_open_files for the server); other users go on")
}

func (ss *serverSession) handle(h Handle) (*openFile, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	of, ok := ss.handles[h]
	return of, ok
}

// fileIn finds a file handle (not the pipe) of the session on tree tr's
// share: a handle is usable only on the session that opened it.
func (ss *serverSession) fileIn(tr *share.Tree, h Handle) (*openFile, error) {
	of, ok := ss.handle(h)
	if !ok || of.file == nil || of.file.Tree().Share() != tr.Share() {
		return nil, protocol.StatusInvalidHandle
	}
	return of, nil
}

func (ss *serverSession) removeHandle(h Handle) (*openFile, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	of, ok := ss.handles[h]
	delete(ss.handles, h)
	return of, ok
}

func (ss *serverSession) tree(id uint32) (*share.Tree, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sh, ok := ss.trees[id]
	return sh, ok
}

// treeConnect finds the share and connects the session's user to it.
func (s *Server) treeConnect(ss *serverSession, name string) (uint32, *share.Tree, error) {
	name = strings.TrimPrefix(name, `\\`)
	if i := strings.LastIndexAny(name, `\/`); i >= 0 {
		name = name[i+1:] // accept \\server\share as well as share
	}
	key := strings.ToLower(name)
	sh, ok := s.shares[key]
	if !ok {
		return 0, nil, protocol.StatusBadNetworkName
	}
	enc := s.shareEncrypt[key]
	seals := ss.seal != nil && (enc == EncryptDesired || enc == EncryptRequired)
	if enc == EncryptRequired && ss.seal == nil {
		s.log.WithFields(logrus.Fields{"session": ss.id, "user": ss.user, "share": sh.Name}).
			Warn("tree connect refused: the share requires sealing (encrypt = required) and this session cannot seal (the client does not, or the server's encrypt is off)")
		return 0, nil, StatusSealRequired
	}
	tr, err := sh.Connect(ss.ident)
	var refused *share.RootRefused
	if errors.As(err, &refused) {
		s.log.WithFields(logrus.Fields{"session": ss.id, "user": ss.user, "share": sh.Name, "account": refused.Account}).
			Warn("tree connect refused: " + refused.Error())
	}
	if err != nil {
		return 0, nil, err
	}
	ss.mu.Lock()
	ss.nextTree++
	id := ss.nextTree
	ss.trees[id] = tr
	if seals {
		if ss.sealTrees == nil {
			ss.sealTrees = map[uint32]bool{}
		}
		ss.sealTrees[id] = true
	}
	ss.mu.Unlock()
	ss.enableLeases(id, tr)
	return id, tr, nil
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
	k, err := issue(s.resumeKeys, of, func(k *[24]byte) []byte { return k[:] })
	if err == nil {
		of.resumeKey = &k
	}
	return k, err
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
	k, err := issue(s.lwioKeys, ss, func(k *[16]byte) []byte { return k[:] })
	if err != nil {
		return k, err
	}
	ss.lwioKeys = append(ss.lwioKeys, k)
	if len(ss.lwioKeys) > maxLWIOKeys {
		// A client negotiates once per mount or reconnect; a session that
		// keeps asking only ever needs its recent keys.
		delete(s.lwioKeys, ss.lwioKeys[0])
		ss.lwioKeys = append(ss.lwioKeys[:0], ss.lwioKeys[1:]...)
	}
	return k, nil
}

// issue binds v to a key from crypto/rand that keys does not hold yet;
// bytes gives a key's bytes to fill.
func issue[K comparable, V any](keys map[K]V, v V, bytes func(*K) []byte) (K, error) {
	var k K
	for {
		if _, err := rand.Read(bytes(&k)); err != nil {
			return k, err
		}
		if _, taken := keys[k]; !taken {
			keys[k] = v
			return k, nil
		}
	}
}

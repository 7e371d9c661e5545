package fs

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// Defaults of a multiuser mount.
const (
	// DefaultIdleTimeout is how long a local user's session stays after
	// its last operation with no file open (mount.cifs's multiuser
	// sessions go after about as long).
	DefaultIdleTimeout = 10 * time.Minute
	// failedRetry is how long a failed logon is answered from memory
	// (EACCES at once, no new logon attempt) unless the user's
	// credentials change: the server throttles failed logons, and an
	// `ls` loop must not lock the account out.
	failedRetry = 30 * time.Second
)

// ErrNoCredentials is what Credentials returns for a local user who has
// none: the user gets EACCES.
var ErrNoCredentials = errors.New("no credentials for this local user")

// MultiUserConfig configures a multiuser mount (mount.cifs's multiuser):
// each local user who touches the mount gets a session of their own.
type MultiUserConfig struct {
	// Credentials returns how to dial a session for local user uid, and a
	// version of those credentials (a file's identity and mtime, say): a
	// logon that failed is tried again at once when the version changes.
	// ErrNoCredentials (or any error) fails the user's operations with
	// EACCES. Required.
	Credentials func(ctx context.Context, uid uint32) (dial Dialer, version string, err error)
	// IdleTimeout closes a user's session (its TCP connection and its
	// RDMA connections) once it has had no operation for that long and
	// holds no open file; 0 means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// ReconnectWait bounds how long a call waits for a lost server, per
	// session (0: DefaultWaitTimeout).
	ReconnectWait time.Duration
	// Owners learns each session's account (Bind): the user's own files
	// show as theirs. Nil: no mapping.
	Owners *IDMap
	// Logger; nil is quiet.
	Logger logrus.FieldLogger
}

// MultiUser is the Tree, HandleIO and DataPath of a multiuser mount. Each
// request goes to the session of the local user who made it (the FUSE
// caller's uid), dialed on first use with that user's credentials, so the
// server decides it as that user's account. An open file stays with the
// session that opened it — its handle, resume key and LWIO Fid are bound
// to that session — so reads, writes, fsync and fchmod through an open
// descriptor act as whoever opened it, as with a local file descriptor.
// Each session has its own reconnecting state and its own LWIO client: an
// RDMA connection is authenticated for one session, and the server only
// accepts a Fid on the session that registered it.
type MultiUser struct {
	cfg MultiUserConfig
	log logrus.FieldLogger

	mu      sync.Mutex
	users   map[uint32]*userSession
	handles map[session.Handle]muHandle
	next    session.Handle
	closed  bool
	stop    chan struct{}
	reaped  sync.WaitGroup
}

// userSession is one local user's session, or the failure to make it.
type userSession struct {
	uid    uint32
	pinned bool          // the mounting user's: never closed for idleness
	ready  chan struct{} // closed when r or err is set
	r      *Reconnector
	err    error

	// Guarded by MultiUser.mu.
	version string
	failed  time.Time
	busy    int // operations in flight
	open    int // handles open
	last    time.Time
}

// muHandle is a handle of the mount: the session that opened it and that
// session's handle.
type muHandle struct {
	us *userSession
	h  session.Handle
}

// NewMultiUser returns the router of a multiuser mount. Pin the mounting
// user's session before mounting.
func NewMultiUser(cfg MultiUserConfig) *MultiUser {
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = Options{}.logger()
	}
	m := &MultiUser{cfg: cfg, log: log, users: map[uint32]*userSession{}, handles: map[session.Handle]muHandle{}, stop: make(chan struct{})}
	m.reaped.Add(1)
	go m.reap()
	return m
}

// Pin makes r the session of local user uid (primary group gid) for the
// life of the mount: the mounting user's, made with the mount's own
// credentials.
func (m *MultiUser) Pin(uid, gid uint32, r *Reconnector) {
	ready := make(chan struct{})
	close(ready)
	m.mu.Lock()
	m.users[uid] = &userSession{uid: uid, pinned: true, ready: ready, r: r, last: time.Now()}
	m.mu.Unlock()
	if a, ok := r.Account(); ok {
		m.cfg.Owners.Bind(uid, gid, a)
	}
}

// Forget drops what the mount remembers of user uid's session when that
// can go at once — a failed logon, or a session with no open file — so
// the next operation logs on afresh (new credentials from `lwio login`).
func (m *MultiUser) Forget(uid uint32) {
	m.mu.Lock()
	us, ok := m.users[uid]
	if !ok || us.pinned || !us.done() || us.open > 0 || us.busy > 0 {
		m.mu.Unlock()
		return
	}
	delete(m.users, uid)
	m.mu.Unlock()
	us.close()
}

// Sessions is how many local users have a session (or a remembered
// failure) now.
func (m *MultiUser) Sessions() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.users)
}

// Close ends every session.
func (m *MultiUser) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	users := m.users
	m.users = map[uint32]*userSession{}
	m.mu.Unlock()
	close(m.stop)
	m.reaped.Wait()
	for _, us := range users {
		<-us.ready
		us.close()
	}
	return nil
}

func (us *userSession) done() bool {
	select {
	case <-us.ready:
		return true
	default:
		return false
	}
}

func (us *userSession) close() {
	if us.r != nil {
		us.r.Close()
	}
}

// acquire returns the caller's session, logging on first; release it
// after the operation.
func (m *MultiUser) acquire(ctx context.Context) (*userSession, error) {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return nil, syscall.EACCES
	}
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, errNotConnected
		}
		us, ok := m.users[c.Uid]
		if ok && us.done() && us.err != nil {
			failed, version := us.failed, us.version
			m.mu.Unlock()
			if m.failureStands(ctx, c.Uid, failed, version) {
				return nil, us.err
			}
			m.mu.Lock()
			if m.users[c.Uid] == us {
				delete(m.users, c.Uid)
			}
			m.mu.Unlock()
			continue
		}
		mine := !ok
		if mine {
			us = &userSession{uid: c.Uid, ready: make(chan struct{})}
			m.users[c.Uid] = us
		}
		us.busy++
		us.last = time.Now()
		m.mu.Unlock()
		if mine {
			m.logon(ctx, us, c)
		}
		select {
		case <-us.ready:
		case <-ctx.Done():
			m.release(us)
			return nil, ctx.Err()
		}
		if us.err != nil {
			m.release(us)
			return nil, us.err
		}
		return us, nil
	}
}

// failureStands decides whether a logon of user uid that failed at
// failed, with credentials of version, still stands: for failedRetry,
// unless the user's credentials changed since.
func (m *MultiUser) failureStands(ctx context.Context, uid uint32, failed time.Time, version string) bool {
	if time.Since(failed) >= failedRetry {
		return false
	}
	_, now, err := m.cfg.Credentials(ctx, uid)
	if err != nil {
		now = ""
	}
	return now == version
}

func (m *MultiUser) release(us *userSession) {
	m.mu.Lock()
	us.busy--
	us.last = time.Now()
	m.mu.Unlock()
}

// logon dials the session of caller c's user and binds its account.
func (m *MultiUser) logon(ctx context.Context, us *userSession, c *fuse.Caller) {
	log := m.log.WithField("uid", c.Uid)
	dial, version, err := m.cfg.Credentials(ctx, c.Uid)
	var r *Reconnector
	if err != nil {
		log.WithError(err).Info("multiuser: local user has no usable credentials: EACCES")
		err, version = syscall.EACCES, ""
	} else {
		r, err = NewReconnector(ctx, dial, m.cfg.ReconnectWait, log)
	}
	var acct Account
	known := false
	if err == nil {
		if acct, known = r.Account(); known {
			m.cfg.Owners.Bind(c.Uid, c.Gid, acct)
		}
	}
	m.mu.Lock()
	us.version = version
	if err != nil {
		us.failed = time.Now()
	}
	us.r, us.err = r, err
	close(us.ready)
	m.mu.Unlock()
	switch {
	case err == syscall.EACCES:
	case err != nil:
		log.WithError(err).Warn("multiuser: logon for local user failed")
	case acct.Shared:
		log.WithField("account", acct.Name).Warn("multiuser: the server acts as one account for every user (it does not run as root): users are not kept apart on the server")
	default:
		log.WithFields(logrus.Fields{"account": acct.Name, "account_uid": acct.Uid, "known": known, "data_path": r.Name()}).
			Info("multiuser: session for local user")
	}
}

// reap closes sessions idle for IdleTimeout and forgets old failures.
func (m *MultiUser) reap() {
	defer m.reaped.Done()
	t := time.NewTicker(min(m.cfg.IdleTimeout/4, 30*time.Second))
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		var idle []*userSession
		m.mu.Lock()
		for uid, us := range m.users {
			if us.pinned || !us.done() || us.busy > 0 || us.open > 0 {
				continue
			}
			if us.err == nil && time.Since(us.last) >= m.cfg.IdleTimeout || us.err != nil && time.Since(us.failed) >= failedRetry {
				delete(m.users, uid)
				idle = append(idle, us)
			}
		}
		m.mu.Unlock()
		for _, us := range idle {
			if us.err == nil {
				m.log.WithField("uid", us.uid).Info("multiuser: idle session closed")
			}
			us.close()
		}
	}
}

// asUser runs op on the caller's session.
func asUser[T any](m *MultiUser, ctx context.Context, op func(r *Reconnector) (T, error)) (T, error) {
	us, err := m.acquire(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	defer m.release(us)
	return op(us.r)
}

// asCaller is asUser for operations that return only an error.
func (m *MultiUser) asCaller(ctx context.Context, op func(r *Reconnector) error) error {
	_, err := asUser(m, ctx, func(r *Reconnector) (struct{}, error) { return struct{}{}, op(r) })
	return err
}

// byHandle runs op on the session that opened h, with that session's
// handle.
func (m *MultiUser) byHandle(h session.Handle, op func(r *Reconnector, h session.Handle) error) error {
	m.mu.Lock()
	mh, ok := m.handles[h]
	if ok {
		mh.us.busy++
	}
	m.mu.Unlock()
	if !ok {
		return syscall.EBADF
	}
	defer m.release(mh.us)
	return op(mh.us.r, mh.h)
}

var (
	_ Tree       = (*MultiUser)(nil)
	_ HandleIO   = (*MultiUser)(nil)
	_ DataPath   = (*MultiUser)(nil)
	_ Mknoder    = (*MultiUser)(nil)
	_ ServerSide = (*MultiUser)(nil)
	_ Locker     = (*MultiUser)(nil)
	_ Appender   = (*MultiUser)(nil)
)

func (m *MultiUser) GetAttr(ctx context.Context, p string) (session.Attr, error) {
	return asUser(m, ctx, func(r *Reconnector) (session.Attr, error) { return r.GetAttr(ctx, p) })
}

func (m *MultiUser) SetAttr(ctx context.Context, p string, h session.Handle, in session.SetAttrIn) (a session.Attr, err error) {
	if h != 0 {
		err = m.byHandle(h, func(r *Reconnector, h session.Handle) error { a, err = r.SetAttr(ctx, p, h, in); return err })
		return a, err
	}
	return asUser(m, ctx, func(r *Reconnector) (session.Attr, error) { return r.SetAttr(ctx, p, 0, in) })
}

func (m *MultiUser) ReadDir(ctx context.Context, p string) ([]session.DirEntry, error) {
	return asUser(m, ctx, func(r *Reconnector) ([]session.DirEntry, error) { return r.ReadDir(ctx, p) })
}

func (m *MultiUser) Mkdir(ctx context.Context, p string, mode uint32) (session.Attr, error) {
	return asUser(m, ctx, func(r *Reconnector) (session.Attr, error) { return r.Mkdir(ctx, p, mode) })
}

func (m *MultiUser) Rmdir(ctx context.Context, p string) error {
	return m.asCaller(ctx, func(r *Reconnector) error { return r.Rmdir(ctx, p) })
}

func (m *MultiUser) Mknod(ctx context.Context, p string, mode, rdev uint32) (session.Attr, error) {
	return asUser(m, ctx, func(r *Reconnector) (session.Attr, error) { return r.Mknod(ctx, p, mode, rdev) })
}

func (m *MultiUser) Open(ctx context.Context, p string, flags int, mode uint32) (session.Handle, session.Attr, error) {
	return m.openAs(ctx, func(r *Reconnector) (session.Handle, session.Attr, error) { return r.Open(ctx, p, flags, mode) })
}

// openAs opens a file on the caller's session and numbers its handle as
// one of the mount's.
func (m *MultiUser) openAs(ctx context.Context, open func(r *Reconnector) (session.Handle, session.Attr, error)) (session.Handle, session.Attr, error) {
	us, err := m.acquire(ctx)
	if err != nil {
		return 0, session.Attr{}, err
	}
	defer m.release(us)
	h, a, err := open(us.r)
	if err != nil {
		return 0, a, err
	}
	return m.addHandle(us, h), a, nil
}

// addHandle numbers h, a handle of us's session, as a handle of the mount.
func (m *MultiUser) addHandle(us *userSession, h session.Handle) session.Handle {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next++
	m.handles[m.next] = muHandle{us: us, h: h}
	us.open++
	return m.next
}

func (m *MultiUser) CloseHandle(ctx context.Context, h session.Handle) error {
	m.mu.Lock()
	mh, ok := m.handles[h]
	delete(m.handles, h)
	if ok {
		mh.us.open--
		mh.us.last = time.Now()
	}
	m.mu.Unlock()
	if !ok {
		return syscall.EBADF
	}
	return mh.us.r.CloseHandle(ctx, mh.h)
}

func (m *MultiUser) Unlink(ctx context.Context, p string) error {
	return m.asCaller(ctx, func(r *Reconnector) error { return r.Unlink(ctx, p) })
}

func (m *MultiUser) Rename(ctx context.Context, oldPath, newPath string, flags uint32) error {
	return m.asCaller(ctx, func(r *Reconnector) error { return r.Rename(ctx, oldPath, newPath, flags) })
}

func (m *MultiUser) Symlink(ctx context.Context, target, p string) (session.Attr, error) {
	return asUser(m, ctx, func(r *Reconnector) (session.Attr, error) { return r.Symlink(ctx, target, p) })
}

func (m *MultiUser) Readlink(ctx context.Context, p string) (string, error) {
	return asUser(m, ctx, func(r *Reconnector) (string, error) { return r.Readlink(ctx, p) })
}

func (m *MultiUser) Link(ctx context.Context, oldPath, newPath string) (session.Attr, error) {
	return asUser(m, ctx, func(r *Reconnector) (session.Attr, error) { return r.Link(ctx, oldPath, newPath) })
}

func (m *MultiUser) StatFS(ctx context.Context) (session.StatFS, error) {
	return asUser(m, ctx, func(r *Reconnector) (session.StatFS, error) { return r.StatFS(ctx) })
}

func (m *MultiUser) Fsync(ctx context.Context, h session.Handle, datasync bool) error {
	return m.byHandle(h, func(r *Reconnector, h session.Handle) error { return r.Fsync(ctx, h, datasync) })
}

func (m *MultiUser) GetXattr(ctx context.Context, p, name string) ([]byte, error) {
	return asUser(m, ctx, func(r *Reconnector) ([]byte, error) { return r.GetXattr(ctx, p, name) })
}

func (m *MultiUser) SetXattr(ctx context.Context, p, name string, value []byte, flags int) error {
	return m.asCaller(ctx, func(r *Reconnector) error { return r.SetXattr(ctx, p, name, value, flags) })
}

func (m *MultiUser) ListXattr(ctx context.Context, p string) ([]string, error) {
	return asUser(m, ctx, func(r *Reconnector) ([]string, error) { return r.ListXattr(ctx, p) })
}

func (m *MultiUser) RemoveXattr(ctx context.Context, p, name string) error {
	return m.asCaller(ctx, func(r *Reconnector) error { return r.RemoveXattr(ctx, p, name) })
}

// ReadAt and WriteAt are the session-channel data path of an open file:
// the opener's session.
func (m *MultiUser) ReadAt(ctx context.Context, h session.Handle, p []byte, off int64) (n int, err error) {
	err = m.byHandle(h, func(r *Reconnector, h session.Handle) error { n, err = r.ReadAt(ctx, h, p, off); return err })
	return n, err
}

func (m *MultiUser) WriteAt(ctx context.Context, h session.Handle, p []byte, off int64) (n int, err error) {
	err = m.byHandle(h, func(r *Reconnector, h session.Handle) error { n, err = r.WriteAt(ctx, h, p, off); return err })
	return n, err
}

// Append, and the locks of an open file, go on the opener's session: the
// server keeps a lock with the handle it was taken through.
func (m *MultiUser) Append(ctx context.Context, h session.Handle, p []byte) (n int, end int64, err error) {
	err = m.byHandle(h, func(r *Reconnector, h session.Handle) error { n, end, err = r.Append(ctx, h, p); return err })
	return n, end, err
}

func (m *MultiUser) Lock(ctx context.Context, h session.Handle, lk session.Lock, wait bool) error {
	return m.byHandle(h, func(r *Reconnector, h session.Handle) error { return r.Lock(ctx, h, lk, wait) })
}

func (m *MultiUser) Unlock(ctx context.Context, h session.Handle, owner uint64) error {
	return m.byHandle(h, func(r *Reconnector, h session.Handle) error { return r.Unlock(ctx, h, owner) })
}

func (m *MultiUser) TestLock(ctx context.Context, h session.Handle, lk session.Lock) (got session.Lock, err error) {
	err = m.byHandle(h, func(r *Reconnector, h session.Handle) error { got, err = r.TestLock(ctx, h, lk); return err })
	return got, err
}

// Attach registers an open file on its opener's data path (that session's
// LWIO client).
func (m *MultiUser) Attach(ctx context.Context, h session.Handle, flags int) (df DataFile, err error) {
	err = m.byHandle(h, func(r *Reconnector, h session.Handle) error { df, err = r.Attach(ctx, h, flags); return err })
	return df, err
}

// Server-side copies, space and temporary files (ServerSide): on the
// session of the handles' opener.

// errCrossSession is a copy between files two users opened: the server
// copies only between handles of one session, so the kernel copies
// through its page cache instead (EOPNOTSUPP is its cue), reading as one
// user and writing as the other.
var errCrossSession = syscall.EOPNOTSUPP

func (m *MultiUser) CopyRange(ctx context.Context, src session.Handle, srcOff int64, dst session.Handle, dstOff int64, n int64) (k int64, a session.Attr, err error) {
	m.mu.Lock()
	ms, sok := m.handles[src]
	md, dok := m.handles[dst]
	m.mu.Unlock()
	switch {
	case !sok || !dok:
		return 0, a, syscall.EBADF
	case ms.us != md.us:
		return 0, a, errCrossSession
	}
	err = m.byHandle(dst, func(r *Reconnector, h session.Handle) error {
		k, a, err = r.CopyRange(ctx, ms.h, srcOff, h, dstOff, n)
		return err
	})
	return k, a, err
}

func (m *MultiUser) Allocate(ctx context.Context, h session.Handle, mode uint32, off, n int64) (a session.Attr, err error) {
	err = m.byHandle(h, func(r *Reconnector, h session.Handle) error { a, err = r.Allocate(ctx, h, mode, off, n); return err })
	return a, err
}

func (m *MultiUser) Seek(ctx context.Context, h session.Handle, off int64, whence int) (pos int64, err error) {
	err = m.byHandle(h, func(r *Reconnector, h session.Handle) error { pos, err = r.Seek(ctx, h, off, whence); return err })
	return pos, err
}

// Tmpfile opens an unnamed file as the caller, like Open.
func (m *MultiUser) Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (session.Handle, session.Attr, error) {
	return m.openAs(ctx, func(r *Reconnector) (session.Handle, session.Attr, error) { return r.Tmpfile(ctx, dir, flags, mode) })
}

func (m *MultiUser) LinkHandle(ctx context.Context, h session.Handle, p string) (a session.Attr, err error) {
	err = m.byHandle(h, func(r *Reconnector, h session.Handle) error { a, err = r.LinkHandle(ctx, h, p); return err })
	return a, err
}

// Name is the pinned (mounting user's) session's data path.
func (m *MultiUser) Name() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, us := range m.users {
		if us.pinned {
			return us.r.Name()
		}
	}
	return "multiuser"
}

package fs

import (
	"context"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// Session is one connection's worth of what a mount runs on: the tree
// connected on a session, the data path attached to that session, and a
// channel closed when either has died. Dial makes one.
type Session struct {
	Tree interface {
		Tree
		HandleIO
	}
	Data  DataPath
	Done  <-chan struct{}
	Close func() error
	// LWIO is the LWIO client engine of the data path, nil when file data
	// goes over the session channel (for `lwio stat`).
	LWIO *client.Client
	// ReadOnly says the share refuses changes (its TREE_CONNECT flag).
	ReadOnly bool
	// Account is who the session acts as on the server; nil when the
	// server did not say (see IDMap).
	Account *Account
}

// Dialer establishes a Session from nothing: session setup, tree connect,
// the LWIO negotiate and the RDMA connections' authentication.
type Dialer func(ctx context.Context) (*Session, error)

// Default bounds of a Reconnector.
const (
	// DefaultWaitTimeout is how long a call waits for the server to come
	// back before it fails with ENOTCONN: applications do not hang.
	DefaultWaitTimeout  = 30 * time.Second
	reconnectMinBackoff = 100 * time.Millisecond
	reconnectMaxBackoff = 5 * time.Second
)

// errNotConnected is what a call gets when the server has not come back
// within the wait timeout.
var errNotConnected = syscall.ENOTCONN

// Reconnector is a Tree and a DataPath that outlive the server going away
// (a restart, a reset connection). When the session dies it dials again —
// session setup, tree connect, negotiate, LWIO authentication — in the
// background with backoff, and re-opens and re-registers open files lazily
// on their next use. It keeps, per open file, the path and open flags that
// re-opening needs; paths follow renames done through the mount.
//
// Open files are durable handles (durable.go): after a reconnect each is
// reclaimed — the same open, with its locks — or, when the server lost it
// (a restart), re-opened by its identity: the same file or ESTALE, never
// whatever now has its name; a file whose locks were lost that way fails
// its I/O and lock calls with EIO. All of them are re-opened at once after
// the reconnect, before anything else runs, so that locks are reclaimed
// within the server's durable timeout even by an idle program.
//
// What is replayed after a reconnect: every read-only operation (getattr,
// readdir, readlink, statfs, xattr reads), setattr (it sets absolute
// values), fsync, reads and writes at explicit offsets, locks, and opens
// and creates (the server recognises a replayed open by its durable id and
// answers it with the open the first one made). What is not: an append, and
// an operation that changes the namespace (mkdir, unlink, rmdir, rename,
// link, symlink, setxattr, removexattr), whose request may have reached the
// server before the connection broke: it returns an error rather than risk
// doing it twice; if the connection was already known dead before it was
// sent, it waits for the reconnect and runs once.
type Reconnector struct {
	dial Dialer
	log  logrus.FieldLogger
	wait time.Duration

	mu      sync.Mutex
	cur     *Session
	gen     uint64        // generation of cur; bumped by every reconnect
	redial  chan struct{} // closed when the running redial ends; nil: none
	closed  bool
	handles map[session.Handle]*vhandle
	next    session.Handle
	orphans []session.DurableID                 // durable opens closed while disconnected (durable.go)
	breakTo func(session.LeaseBreak) LeaseState // the mount's lease breaks (reconnect_lease.go)
	stats   *Stats                              // CountInto; nil counts nothing
}

// vhandle is an open file as the mount knows it: a handle number stable
// across reconnects, and the session handle of the current generation.
type vhandle struct {
	mu       sync.Mutex
	path     string
	flags    int
	real     session.Handle
	gen      uint64
	unlinked bool

	id     session.DurableID   // zero: not durable (the session offers none)
	fileID []byte              // the file's sealed identity, for a reopen after a restart
	owners map[uint64]struct{} // lock owners that took locks through it
	lost   bool                // its locks are gone with the server: EIO
	stale  bool                // the file is gone or was replaced: ESTALE
}

// NewReconnector dials the first session (its error is returned as is, so
// a wrong password or unknown share fails the mount plainly) and returns
// the Reconnector. wait bounds how long a call waits for a lost server (0
// means DefaultWaitTimeout).
func NewReconnector(ctx context.Context, dial Dialer, wait time.Duration, log logrus.FieldLogger) (*Reconnector, error) {
	s, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	if wait <= 0 {
		wait = DefaultWaitTimeout
	}
	if log == nil {
		log = Options{}.logger()
	}
	r := &Reconnector{dial: dial, log: log, wait: wait, cur: s, gen: 1, handles: map[session.Handle]*vhandle{}}
	go r.watch(s, 1)
	return r, nil
}

// Close ends the current session and stops reconnecting.
func (r *Reconnector) Close() error {
	r.mu.Lock()
	r.closed = true
	s := r.cur
	r.cur = nil
	r.mu.Unlock()
	if s != nil && s.Close != nil {
		return s.Close()
	}
	return nil
}

// CountInto makes the Reconnector count into st: its reconnects, and the
// file data it carries over the session channel (inline writes).
func (r *Reconnector) CountInto(st *Stats) {
	r.mu.Lock()
	r.stats = st
	r.mu.Unlock()
}

// Current is the live session, or nil while reconnecting.
func (r *Reconnector) Current() *Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// Name is the current data path's name.
func (r *Reconnector) Name() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return "disconnected"
	}
	return r.cur.Data.Name()
}

// watch starts a redial when session s of generation gen dies.
func (r *Reconnector) watch(s *Session, gen uint64) {
	<-s.Done
	r.lost(gen)
}

// lost records that generation gen's session is dead and starts a redial
// unless one is running or a newer session is up.
func (r *Reconnector) lost(gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || gen != r.gen || r.redial != nil {
		return
	}
	old := r.cur
	r.cur = nil
	r.redial = make(chan struct{})
	r.log.WithField("generation", gen).Warn("fs: connection to the server lost; reconnecting")
	if fn := r.breakTo; fn != nil {
		go fn(session.LeaseBreak{}) // the session's leases died with it
	}
	go func() {
		if old != nil && old.Close != nil {
			old.Close()
		}
		r.redialLoop()
	}()
}

func (r *Reconnector) redialLoop() {
	backoff := reconnectMinBackoff
	start := time.Now()
	for attempt := 1; ; attempt++ {
		r.mu.Lock()
		closed := r.closed
		r.mu.Unlock()
		if closed {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		s, err := r.dial(ctx)
		cancel()
		if err == nil {
			r.mu.Lock()
			gen := r.gen + 1
			r.mu.Unlock()
			r.reopenAll(s, gen)
			r.mu.Lock()
			if r.closed {
				r.mu.Unlock()
				if s.Close != nil {
					s.Close()
				}
				return
			}
			r.gen = gen
			r.cur = s
			forwardBreaks(s, r.breakTo)
			if r.stats != nil {
				r.stats.reconnects.Add(1)
			}
			close(r.redial)
			r.redial = nil
			r.mu.Unlock()
			r.log.WithFields(logrus.Fields{"generation": gen, "attempts": attempt, "after": time.Since(start).Round(time.Millisecond).String(),
				"data_path": s.Data.Name()}).Warn("fs: reconnected to the server; open files are re-opened on next use")
			go r.watch(s, gen)
			return
		}
		r.log.WithError(err).WithFields(logrus.Fields{"attempt": attempt, "retry_in": backoff.String()}).Warn("fs: reconnect failed")
		time.Sleep(backoff)
		backoff = min(2*backoff, reconnectMaxBackoff)
	}
}

// session returns the live session, waiting up to r.wait for a reconnect.
func (r *Reconnector) session(ctx context.Context) (*Session, uint64, error) {
	var deadline <-chan time.Time // started on the first wait only: the fast path stays cheap
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return nil, 0, errNotConnected
		}
		if s := r.cur; s != nil {
			select {
			case <-s.Done:
			default:
				gen := r.gen
				r.mu.Unlock()
				return s, gen, nil
			}
			gen := r.gen
			r.mu.Unlock()
			r.lost(gen)
			continue
		}
		wait := r.redial
		r.mu.Unlock()
		if deadline == nil {
			t := time.NewTimer(r.wait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-deadline:
			return nil, 0, errNotConnected
		}
	}
}

// do runs op on the live session. A replayable op whose session died under
// it runs again on the next one.
func (r *Reconnector) do(ctx context.Context, replay bool, op func(s *Session, gen uint64) error) error {
	for attempt := 0; ; attempt++ {
		s, gen, err := r.session(ctx)
		if err != nil {
			return err
		}
		err = op(s, gen)
		if err == nil || !protocol.IsConnectionLost(err) || ctx.Err() != nil {
			return err
		}
		r.lost(gen)
		if !replay || attempt == 3 {
			return err
		}
	}
}

// Tree operations.

var (
	_ Tree     = (*Reconnector)(nil)
	_ DataPath = (*Reconnector)(nil)
)

func (r *Reconnector) GetAttr(ctx context.Context, path string) (a session.Attr, err error) {
	err = r.do(ctx, true, func(s *Session, _ uint64) error { a, err = s.Tree.GetAttr(ctx, path); return err })
	return a, err
}

func (r *Reconnector) SetAttr(ctx context.Context, path string, h session.Handle, in session.SetAttrIn) (a session.Attr, err error) {
	err = r.do(ctx, true, func(s *Session, gen uint64) error {
		real := session.Handle(0)
		if h != 0 {
			if real, err = r.realHandle(ctx, s, gen, h); err != nil {
				return err
			}
		}
		a, err = s.Tree.SetAttr(ctx, path, real, in)
		return err
	})
	return a, err
}

func (r *Reconnector) ReadDir(ctx context.Context, path string) (d []session.DirEntry, err error) {
	err = r.do(ctx, true, func(s *Session, _ uint64) error { d, err = s.Tree.ReadDir(ctx, path); return err })
	return d, err
}

func (r *Reconnector) Mkdir(ctx context.Context, path string, mode uint32) (a session.Attr, err error) {
	err = r.do(ctx, false, func(s *Session, _ uint64) error { a, err = s.Tree.Mkdir(ctx, path, mode); return err })
	return a, err
}

func (r *Reconnector) Rmdir(ctx context.Context, path string) error {
	return r.do(ctx, false, func(s *Session, _ uint64) error { return s.Tree.Rmdir(ctx, path) })
}

func (r *Reconnector) Open(ctx context.Context, path string, flags int, mode uint32) (session.Handle, session.Attr, error) {
	h, a, _, err := r.openLeased(ctx, path, flags, mode, 0)
	return h, a, err
}

// openLeased opens path as a handle number that outlives reconnects, with
// a lease of want when want is not 0 and the live session grants leases.
func (r *Reconnector) openLeased(ctx context.Context, path string, flags int, mode uint32, want LeaseState) (session.Handle, session.Attr, LeaseState, error) {
	h := &vhandle{path: path, flags: flags}
	var a session.Attr
	var got LeaseState
	err := r.do(ctx, true, func(s *Session, g uint64) (err error) {
		a, got, err = r.open(ctx, s, g, h, mode, want)
		return err
	})
	if err != nil {
		return 0, a, 0, err
	}
	return r.addHandle(h), a, got, nil
}

// addHandle numbers an open file of the mount.
func (r *Reconnector) addHandle(h *vhandle) session.Handle {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	r.handles[r.next] = h
	return r.next
}

// realHandle is vh's session handle in generation gen, re-opening the file
// by its path after a reconnect.
func (r *Reconnector) realHandle(ctx context.Context, s *Session, gen uint64, vh session.Handle) (session.Handle, error) {
	r.mu.Lock()
	h, ok := r.handles[vh]
	r.mu.Unlock()
	if !ok {
		return 0, syscall.EBADF
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failed(); err != nil {
		return 0, err
	}
	if h.gen == gen {
		return h.real, nil
	}
	if !h.id.IsZero() {
		if err := r.reopen(ctx, s, gen, h); err != nil {
			return 0, err
		}
		return h.real, h.failed()
	}
	if h.unlinked {
		return 0, syscall.ESTALE
	}
	// A session without durable handles (a test's fake): by path. The
	// file exists already (or did): never create, truncate or insist on
	// exclusivity again.
	real, _, err := s.Tree.Open(ctx, h.path, h.flags&^(syscall.O_CREAT|syscall.O_EXCL|syscall.O_TRUNC), 0)
	if err != nil {
		if !protocol.IsConnectionLost(err) {
			r.log.WithError(err).WithField("path", h.path).Warn("fs: re-opening a file after reconnect failed")
			if ntstatus.ToErrno(err) == syscall.ENOENT {
				return 0, syscall.ESTALE
			}
		}
		return 0, err
	}
	h.real, h.gen = real, gen
	return real, nil
}

func (r *Reconnector) CloseHandle(ctx context.Context, vh session.Handle) error {
	r.mu.Lock()
	h, ok := r.handles[vh]
	delete(r.handles, vh)
	s, gen := r.cur, r.gen
	r.mu.Unlock()
	if !ok {
		return syscall.EBADF
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if s == nil || h.gen != gen {
		// It died with its session — or, durable, waits on the server
		// for a reclaim that must close it (closeOrphans).
		r.orphan(h)
		return nil
	}
	err := s.Tree.CloseHandle(ctx, h.real)
	if protocol.IsConnectionLost(err) {
		return nil
	}
	return err
}

func (r *Reconnector) Unlink(ctx context.Context, path string) error {
	err := r.do(ctx, false, func(s *Session, _ uint64) error { return s.Tree.Unlink(ctx, path) })
	if err == nil {
		r.forPaths(func(h *vhandle) {
			if h.path == path {
				h.unlinked = true
			}
		})
	}
	return err
}

func (r *Reconnector) Rename(ctx context.Context, oldPath, newPath string, flags uint32) error {
	err := r.do(ctx, false, func(s *Session, _ uint64) error { return s.Tree.Rename(ctx, oldPath, newPath, flags) })
	if err != nil {
		return err
	}
	const exchange = 2 // RENAME_EXCHANGE
	r.forPaths(func(h *vhandle) {
		if rest, ok := movedPath(h.path, newPath); ok && flags&exchange != 0 {
			h.path = oldPath + rest
		} else if rest, ok := movedPath(h.path, oldPath); ok {
			h.path = newPath + rest
		} else if h.path == newPath {
			h.unlinked = true // replaced
		}
	})
	return nil
}

// movedPath reports whether p is dir or below it, and the rest of p after
// dir ("" or "/...").
func movedPath(p, dir string) (string, bool) {
	if p == dir {
		return "", true
	}
	if strings.HasPrefix(p, dir+"/") {
		return p[len(dir):], true
	}
	return "", false
}

func (r *Reconnector) forPaths(fn func(h *vhandle)) {
	r.mu.Lock()
	hs := make([]*vhandle, 0, len(r.handles))
	for _, h := range r.handles {
		hs = append(hs, h)
	}
	r.mu.Unlock()
	for _, h := range hs {
		h.mu.Lock()
		fn(h)
		h.mu.Unlock()
	}
}

func (r *Reconnector) Symlink(ctx context.Context, target, path string) (a session.Attr, err error) {
	err = r.do(ctx, false, func(s *Session, _ uint64) error { a, err = s.Tree.Symlink(ctx, target, path); return err })
	return a, err
}

func (r *Reconnector) Readlink(ctx context.Context, path string) (t string, err error) {
	err = r.do(ctx, true, func(s *Session, _ uint64) error { t, err = s.Tree.Readlink(ctx, path); return err })
	return t, err
}

func (r *Reconnector) Link(ctx context.Context, oldPath, newPath string) (a session.Attr, err error) {
	err = r.do(ctx, false, func(s *Session, _ uint64) error { a, err = s.Tree.Link(ctx, oldPath, newPath); return err })
	return a, err
}

func (r *Reconnector) StatFS(ctx context.Context) (st session.StatFS, err error) {
	err = r.do(ctx, true, func(s *Session, _ uint64) error { st, err = s.Tree.StatFS(ctx); return err })
	return st, err
}

func (r *Reconnector) Fsync(ctx context.Context, vh session.Handle, datasync bool) error {
	return r.withHandle(ctx, vh, func(s *Session, real session.Handle) error { return s.Tree.Fsync(ctx, real, datasync) })
}

func (r *Reconnector) GetXattr(ctx context.Context, path, name string) (v []byte, err error) {
	err = r.do(ctx, true, func(s *Session, _ uint64) error { v, err = s.Tree.GetXattr(ctx, path, name); return err })
	return v, err
}

func (r *Reconnector) SetXattr(ctx context.Context, path, name string, value []byte, flags int) error {
	return r.do(ctx, flags == 0, func(s *Session, _ uint64) error { return s.Tree.SetXattr(ctx, path, name, value, flags) })
}

func (r *Reconnector) ListXattr(ctx context.Context, path string) (n []string, err error) {
	err = r.do(ctx, true, func(s *Session, _ uint64) error { n, err = s.Tree.ListXattr(ctx, path); return err })
	return n, err
}

func (r *Reconnector) RemoveXattr(ctx context.Context, path, name string) error {
	return r.do(ctx, false, func(s *Session, _ uint64) error { return s.Tree.RemoveXattr(ctx, path, name) })
}

// Data path.

var _ HandleIO = (*Reconnector)(nil)

// ReadAt reads from an open file over the session channel (HandleIO),
// re-opening it after a reconnect; replayed, as the offset is explicit.
func (r *Reconnector) ReadAt(ctx context.Context, vh session.Handle, p []byte, off int64) (n int, err error) {
	err = r.withHandle(ctx, vh, func(s *Session, real session.Handle) error {
		n, err = s.Tree.ReadAt(ctx, real, p, off)
		return err
	})
	r.stats.countRead(n)
	return n, err
}

// WriteAt writes to an open file over the session channel (HandleIO),
// re-opening it after a reconnect; replayed when the offset is explicit,
// not when it appends (off < 0).
func (r *Reconnector) WriteAt(ctx context.Context, vh session.Handle, p []byte, off int64) (n int, err error) {
	err = r.onHandle(ctx, vh, off >= 0, func(s *Session, real session.Handle) error {
		n, err = s.Tree.WriteAt(ctx, real, p, off)
		return err
	})
	r.stats.countWrite(n)
	return n, err
}

// withHandle runs op, replayed, on the live session with vh's handle there,
// re-opening the file by its path after a reconnect.
func (r *Reconnector) withHandle(ctx context.Context, vh session.Handle, op func(s *Session, real session.Handle) error) error {
	return r.onHandle(ctx, vh, true, op)
}

// onHandle is withHandle, replayed only when replay.
func (r *Reconnector) onHandle(ctx context.Context, vh session.Handle, replay bool, op func(s *Session, real session.Handle) error) error {
	return r.do(ctx, replay, func(s *Session, gen uint64) error {
		real, err := r.realHandle(ctx, s, gen, vh)
		if err != nil {
			return err
		}
		return op(s, real)
	})
}

// Attach returns a data file that re-attaches itself (re-open, resume key,
// REGISTER) after a reconnect.
func (r *Reconnector) Attach(ctx context.Context, vh session.Handle, flags int) (DataFile, error) {
	f := &reFile{r: r, vh: vh, flags: flags}
	err := r.do(ctx, true, func(s *Session, gen uint64) error { _, err := f.current(ctx, s, gen); return err })
	if err != nil {
		return nil, err
	}
	return f, nil
}

// reFile is an open file's data path across reconnects.
type reFile struct {
	r     *Reconnector
	vh    session.Handle
	flags int

	mu  sync.Mutex
	df  DataFile
	gen uint64
}

// current is the data file of generation gen, attaching it if needed.
func (f *reFile) current(ctx context.Context, s *Session, gen uint64) (DataFile, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.df != nil && f.gen == gen {
		return f.df, nil
	}
	real, err := f.r.realHandle(ctx, s, gen, f.vh)
	if err != nil {
		return nil, err
	}
	df, err := s.Data.Attach(ctx, real, f.flags)
	if err != nil {
		return nil, err
	}
	f.df, f.gen = df, gen
	return df, nil
}

func (f *reFile) io(ctx context.Context, op func(DataFile) (int, error)) (n int, err error) {
	return f.ioReplay(ctx, true, op)
}

// ioReplay is io, replayed after a lost connection only when replay: an
// append that may have reached the server is not sent twice.
func (f *reFile) ioReplay(ctx context.Context, replay bool, op func(DataFile) (int, error)) (n int, err error) {
	err = f.r.do(ctx, replay, func(s *Session, gen uint64) error {
		df, err := f.current(ctx, s, gen)
		if err != nil {
			return err
		}
		n, err = op(df)
		return err
	})
	return n, err
}

func (f *reFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.io(ctx, func(df DataFile) (int, error) { return df.ReadAt(ctx, p, off) })
}

func (f *reFile) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.ioReplay(ctx, off >= 0, func(df DataFile) (int, error) { return df.WriteAt(ctx, p, off) })
}

func (f *reFile) WriteV(ctx context.Context, pages [][]byte, off int64) (int, error) {
	return f.io(ctx, func(df DataFile) (int, error) { return df.WriteV(ctx, pages, off) })
}

// WriteAsync posts a write on the current generation's file. A write the
// connection lost before its answer is sent again, on the next session,
// by Wait (a write at an explicit offset is safe to repeat). A data file
// that cannot post (the session channel) writes at once.
func (f *reFile) WriteAsync(ctx context.Context, p []byte, off int64) (PendingWrite, error) {
	var pw *client.PendingWrite
	var gen uint64
	n, err := f.io(ctx, func(df DataFile) (int, error) {
		cf, ok := df.(interface {
			WriteAsync(context.Context, []byte, int64) (*client.PendingWrite, error)
		})
		if !ok {
			return df.WriteAt(ctx, p, off)
		}
		f.mu.Lock()
		gen = f.gen
		f.mu.Unlock()
		var err error
		pw, err = cf.WriteAsync(ctx, p, off)
		return 0, err
	})
	if err != nil {
		return nil, err
	}
	if pw == nil {
		return doneWrite(n), nil
	}
	return &rePending{f: f, pw: pw, gen: gen, off: off}, nil
}

// doneWrite is a write already done.
type doneWrite int

func (n doneWrite) Wait(context.Context) (int, error) { return int(n), nil }

// rePending is a posted write that outlives its connection: on a lost
// connection its bytes are written again through the Reconnector.
type rePending struct {
	f   *reFile
	pw  *client.PendingWrite
	gen uint64
	off int64
}

func (p *rePending) Wait(ctx context.Context) (int, error) {
	n, err := p.pw.Wait(ctx)
	if err == nil || !protocol.IsConnectionLost(err) || p.pw.Data() == nil {
		return n, err
	}
	p.f.r.lost(p.gen)
	return p.f.WriteAt(ctx, p.pw.Data(), p.off)
}

func (f *reFile) ReadBuf(ctx context.Context, dest []byte, off int64) (b Buffer, err error) {
	_, err = f.io(ctx, func(df DataFile) (int, error) {
		b, err = df.ReadBuf(ctx, dest, off)
		return 0, err
	})
	return b, err
}

// Cancel cancels the queued requests of the current generation's file:
// those of an older one died with its session.
func (f *reFile) Cancel(ctx context.Context) error {
	f.mu.Lock()
	df := f.df
	f.mu.Unlock()
	if df == nil {
		return nil
	}
	return df.Cancel(ctx)
}

func (f *reFile) Close(ctx context.Context) error {
	f.mu.Lock()
	df, gen := f.df, f.gen
	f.df = nil
	f.mu.Unlock()
	f.r.mu.Lock()
	live := f.r.cur != nil && f.r.gen == gen
	f.r.mu.Unlock()
	if df == nil || !live {
		return nil // died with its session
	}
	err := df.Close(ctx)
	if protocol.IsConnectionLost(err) {
		return nil
	}
	return err
}

package share

import (
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// File is an open file as the servers move its bytes: the LWIO engine
// reads and writes a registered file (a Fid) through it, and the session
// channel's READ and WRITE do too. It is defined here, once; *OpenFile
// implements it, and a test may wrap one (holding requests, counting
// registrations). ReadAt and WriteAt may be called concurrently; their
// errors are protocol.Status values, and ReadAt returns io.EOF at end of
// file as io.ReaderAt does.
type File interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Append writes p at the end of the file as it is at the moment of
	// the write and returns the offset just past the bytes written
	// (append_linux.go).
	Append(p []byte) (n int, end int64, err error)
}

// OpenFile is a file or directory a Tree opened. Its methods are safe for
// concurrent use; after Close they fail with STATUS_FILE_CLOSED.
type OpenFile struct {
	tree     *Tree
	f        *os.File
	readOnly bool   // opened O_RDONLY or on a read-only share
	typ      uint32 // S_IFREG or S_IFDIR: what was opened (never changes)
	lease    openLease

	appendMu sync.Mutex   // an append and the position read after it are one step
	ident    identityOnce // the file's identity, taken once (durable_linux.go)
	lockKey  keyOnce      // the file's device and inode, for locks (lock_linux.go)
	lockGone bool         // released from its LockSpace; guarded by that space's mu
}

var _ File = (*OpenFile)(nil)

// openFlagsAllowed are the open(2) flags a client may pass.
const openFlagsAllowed = unix.O_ACCMODE | unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC |
	unix.O_APPEND | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_SYNC | unix.O_DSYNC |
	unix.O_NOATIME | unix.O_NONBLOCK

// Open opens (with O_CREAT, creates) p with open(2) flags and mode and
// returns it with its attributes, as the tree's user. A final symlink is
// followed, confined to the share, unless flags has O_NOFOLLOW. Only
// regular files and directories are opened: a FIFO, socket or device
// node in a share must neither become a door to the server's hardware nor
// block a server thread (a FIFO's open waits for a writer), so what is
// there is looked at first through an O_PATH descriptor, which opens
// nothing, and refused with STATUS_ACCESS_DENIED at once. Such files can
// still be created (MKNOD) and stat-ed: they are local objects of the
// client, as on NFS. Set-id bits of mode are cleared unless the share
// allows them (setidBits).
func (t *Tree) Open(p string, flags int, mode uint32) (*OpenFile, Attr, error) {
	flags &= openFlagsAllowed
	acc := flags & unix.O_ACCMODE
	if acc == unix.O_ACCMODE {
		return nil, Attr{}, fail(unix.EINVAL)
	}
	if acc != unix.O_RDONLY || flags&(unix.O_CREAT|unix.O_TRUNC) != 0 {
		if err := t.writable(); err != nil {
			return nil, Attr{}, err
		}
	}
	if flags&unix.O_TRUNC != 0 {
		t.recallPath(p)
	}
	mode = t.sh.setidBits(mode&07777, false)
	var fd int
	var st unix.Stat_t
	var id identity
	err := t.as(func() (err error) {
		fd, st, id, err = t.open(p, flags, mode)
		return err
	})
	if err != nil {
		return nil, Attr{}, err
	}
	f := t.newOpenFile(fd, p, acc == unix.O_RDONLY || t.sh.ReadOnly, &st, id)
	a := attrFromStat(&st)
	if t.leaseOpened(f, flags, &st) {
		// What the recall made another client send landed after st.
		if a2, err := f.Stat(); err == nil {
			a = a2
		}
	}
	if flags&unix.O_CREAT != 0 {
		t.createdPath(p)
	}
	return f, a, nil
}

// newOpenFile makes the OpenFile of fd, whose stat and identity its open
// read (opened).
func (t *Tree) newOpenFile(fd int, name string, readOnly bool, st *unix.Stat_t, id identity) *OpenFile {
	f := &OpenFile{tree: t, f: os.NewFile(uintptr(fd), name), readOnly: readOnly, typ: st.Mode & unix.S_IFMT}
	f.ident.id, f.ident.read = id, true
	return f
}

// open opens p and puts back the permission bits the server's umask took
// from a file it created.
func (t *Tree) open(p string, flags int, mode uint32) (int, unix.Stat_t, identity, error) {
	fd, created, err := t.create(p, flags, mode)
	if err != nil {
		return -1, unix.Stat_t{}, identity{}, err
	}
	return t.opened(fd, created, mode)
}

// opened finishes an open of fd, the umask fix-up when it created the
// file, and returns its stat and identity (one statx: statIdent). It
// closes fd when it fails.
func (t *Tree) opened(fd int, created bool, mode uint32) (int, unix.Stat_t, identity, error) {
	st, id, err := statIdent(fd)
	if lost := mode & 0o777 & t.sh.umask; err == nil && created && lost != 0 {
		if err = unix.Fchmod(fd, (st.Mode&07777)|lost); err == nil {
			err = unix.Fstat(fd, &st)
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, unix.Stat_t{}, identity{}, err
	}
	return fd, st, id, nil
}

// create opens p for data, a regular file or a directory only, telling
// whether it created the file. O_CREAT|O_EXCL only ever makes a new
// regular file, so it opens directly; anything else is looked at first
// through an O_PATH probe (which never blocks and opens nothing) and then
// opened through that very descriptor (reopen), so that nothing swapped in
// between is opened; a missing file is created with O_EXCL, and probed
// again if another made it meanwhile.
func (t *Tree) create(p string, flags int, mode uint32) (fd int, created bool, err error) {
	r := t.sh.root
	if flags&(unix.O_CREAT|unix.O_EXCL) == unix.O_CREAT|unix.O_EXCL {
		fd, err = r.open(p, flags, mode)
		return fd, err == nil, err
	}
	for range 4 {
		pfd, err := r.open(p, unix.O_PATH|flags&(unix.O_NOFOLLOW|unix.O_DIRECTORY), 0)
		if err == unix.ENOENT && flags&unix.O_CREAT != 0 {
			fd, err = r.open(p, flags|unix.O_EXCL, mode)
			if err == unix.EEXIST {
				continue // made meanwhile, or a dangling symlink
			}
			return fd, err == nil, err
		}
		if err != nil {
			return -1, false, err
		}
		fd, err = reopen(pfd, flags)
		unix.Close(pfd)
		return fd, false, err
	}
	// A dangling symlink: O_PATH finds no target and O_EXCL finds the
	// link. Create through it as open(2) would, without waiting on a FIFO
	// put there meanwhile, and check what was opened.
	fd, err = r.open(p, flags|unix.O_NONBLOCK, mode)
	if err != nil {
		return -1, false, err
	}
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err == nil {
		err = dataType(st.Mode, flags)
	}
	if err == nil && flags&unix.O_NONBLOCK == 0 {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags&^(unix.O_ACCMODE|unix.O_CREAT|unix.O_EXCL|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_DIRECTORY))
	}
	if err != nil {
		unix.Close(fd)
		return -1, false, err
	}
	return fd, false, nil
}

// reopen opens the file an O_PATH descriptor holds for data, with flags
// (less those that only mean something for a name), after checking its
// type: through /proc/self/fd, so that it is that inode and no other; the
// kernel checks the calling thread's access to it as open(2) would.
func reopen(pfd, flags int) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, err
	}
	if err := dataType(st.Mode, flags); err != nil {
		return -1, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR && flags&unix.O_CREAT != 0 {
		return -1, unix.EISDIR // open(2)'s answer for O_CREAT on a directory
	}
	return unix.Open(procPath(pfd), flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW)|unix.O_CLOEXEC, 0)
}

// dataType refuses to open for data what is neither a regular file nor a
// directory: ELOOP for a symlink met with O_NOFOLLOW (open(2)'s answer),
// EACCES for a FIFO, socket or device node.
func dataType(mode uint32, flags int) error {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFDIR:
		return nil
	case unix.S_IFLNK:
		return unix.ELOOP
	}
	return unix.EACCES
}

// Tree is the tree the file was opened on.
func (f *OpenFile) Tree() *Tree { return f.tree }

// ReadAt reads from the file (pread). As io.ReaderAt: fewer bytes than
// asked come with io.EOF. It runs with the server's credentials, without
// a credential switch: pread(2) on an open descriptor checks no
// permission (the open did, as the user) and changes nothing a credential
// decides, so the data path's reads stay as cheap as they were.
func (f *OpenFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.f.ReadAt(p, off)
	if err == io.EOF {
		return n, err
	}
	return n, fail(err)
}

// WriteAt writes to the file (pwrite). A file opened read-only refuses
// with STATUS_ACCESS_DENIED, as does every file of a read-only share
// (writable).
func (f *OpenFile) WriteAt(p []byte, off int64) (int, error) {
	if f.readOnly {
		return 0, protocol.StatusAccessDenied
	}
	// Not os.File.WriteAt, which refuses files opened with O_APPEND; on
	// Linux pwrite(2) to such a file appends, which is what the opener
	// asked for.
	// As the tree's user, on the LWIO data path too: the kernel clears a
	// set-user-ID bit on a write by anyone without CAP_FSETID, and
	// charges the blocks to quotas without CAP_SYS_RESOURCE's overrides.
	// Through an io_uring personality when it can: no hand-off to an
	// identity thread (uring_linux.go).
	return f.writeAt(p, off, f.tree.writeAs)
}

// WriteAtInRun is WriteAt for a caller inside Tree.Run of the file's tree
// (a BATCH's held-back writes): on the identity thread Run handed it to,
// already in the user's credentials, a plain pwrite(2) is the user's — and
// costs no ring, whose buffered writes the kernel hands to a worker thread
// on filesystems that cannot write without blocking (tmpfs): a wake-up
// and two context switches per write. Anywhere else it is WriteAt.
func (f *OpenFile) WriteAtInRun(p []byte, off int64) (int, error) {
	if f.readOnly {
		return 0, protocol.StatusAccessDenied
	}
	return f.writeAt(p, off, f.tree.writeInRun)
}

// writeAt writes all of p at off through writeAs.
func (f *OpenFile) writeAt(p []byte, off int64, writeAs func(*OpenFile, func(int, userWriter) error) error) (int, error) {
	op := writeOps.Get().(*writeOp)
	op.p, op.off, op.n = p, off, 0
	err := writeAs(f, op.fn)
	n := op.n
	op.p = nil
	writeOps.Put(op)
	return n, err
}

// writeOp is one writeAt in progress. A closure over p, off and the count
// would be allocated per write (writeAs takes it as a func value, which
// escapes); a pooled writeOp, with its method value bound once, is not.
type writeOp struct {
	p   []byte
	off int64
	n   int
	fn  func(fd int, w userWriter) error // run, bound once
}

var writeOps = sync.Pool{New: func() any {
	op := new(writeOp)
	op.fn = op.run
	return op
}}

// run writes op.p at op.off with w, counting what was written in op.n.
func (op *writeOp) run(fd int, w userWriter) error {
	for op.n < len(op.p) {
		k, err := w.pwrite(fd, op.p[op.n:], op.off+int64(op.n))
		if err != nil {
			return err
		}
		if k == 0 {
			return io.ErrShortWrite
		}
		op.n += k
	}
	return nil
}

// Fsync flushes the file to stable storage (fsync, or fdatasync when
// datasync) before it returns; like ReadAt it checks no permission and
// runs as the server.
func (f *OpenFile) Fsync(datasync bool) error {
	return f.withFd(func(fd int) error {
		if datasync {
			return unix.Fdatasync(fd)
		}
		return unix.Fsync(fd)
	})
}

// SetAttr is Tree.SetAttr on the open file itself.
func (f *OpenFile) SetAttr(in SetAttrIn) (a Attr, err error) {
	if err := f.tree.writable(); err != nil {
		return Attr{}, err
	}
	err = f.tree.asFd(f, func(fd int) error { return f.tree.setattrBreaking(fd, f.typ, in, &a) })
	return a, err
}

// Close closes the file.
func (f *OpenFile) Close() error {
	f.leaseClosed()
	return fail(f.f.Close())
}

// withFd runs fn with the file's descriptor, holding it open for the call
// so that a concurrent Close cannot let the number be reused under fn, and
// maps the error.
func (f *OpenFile) withFd(fn func(fd int) error) error {
	rc, err := f.f.SyscallConn()
	if err != nil {
		return fail(err)
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return protocol.StatusFileClosed // the one way Control fails
	}
	return fail(ferr)
}

// asFd is withFd as the tree's user (Tree.as).
func (t *Tree) asFd(f *OpenFile, fn func(fd int) error) error {
	return t.as(func() error { return f.withFd(fn) })
}

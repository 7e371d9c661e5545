package share

import (
	"encoding/binary"
	"errors"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The watcher tells the lease table about changes made on the server host
// by anything but this server: a local process editing a leased file, a
// cron job creating files in a leased directory. It is one fanotify group
// per share (fanotify(7)) reporting file identifiers (FAN_REPORT_FID,
// FAN_REPORT_DFID_NAME, FAN_REPORT_TARGET_FID: Linux 5.17), with one mark
// per watched directory: the directory's own entry and attribute events,
// and its children's modifications (FAN_EVENT_ON_CHILD). A leased file is
// watched through its directory's mark and recognised by its file
// identifier, which survives renames within the directory's view.
//
// Events carry the pid of the process that caused them (or 0 for another
// process, when the server is unprivileged): those of this server are
// skipped, since every change a session makes already broke the other
// sessions' leases synchronously (lease_linux.go), and the session that
// made it must keep its own.
type watcher struct {
	f    *os.File // the fanotify descriptor, non-blocking, read through Go's poller
	self int32
	// on handles a read's events (other processes' only) and reports
	// whether they broke or revoked any lease.
	on   func([]watchEvent) bool
	done chan struct{}
	// failed is set when reading events failed: local changes may go
	// unseen, so every lease was revoked and none is granted any more.
	failed atomic.Bool
}

// watchEvent is one fanotify event, reduced to what the lease table needs.
type watchEvent struct {
	mask     uint64
	fid      string // the object's file identifier; "" when not reported
	dir      string // the directory of a directory-entry event (DFID_NAME)
	name     string // the entry's name; "." for an event on dir itself
	overflow bool   // events were lost (FAN_Q_OVERFLOW)
}

// watchDirMask is what a watched directory reports: entries created,
// removed or moved in it, its own attribute changes, deletion and move,
// and its children's data and attribute changes.
const watchDirMask = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO |
	unix.FAN_ATTRIB | unix.FAN_MODIFY | unix.FAN_DELETE_SELF | unix.FAN_MOVE_SELF |
	unix.FAN_ONDIR | unix.FAN_EVENT_ON_CHILD

// newWatcher starts a fanotify group whose events go to on, from one
// goroutine, in the order the kernel queued them. It fails where fanotify
// cannot report file identifiers (kernels before 5.17, or an unprivileged
// server before 5.13): the share then grants no leases.
func newWatcher(on func([]watchEvent) bool) (*watcher, error) {
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|
		unix.FAN_REPORT_FID|unix.FAN_REPORT_DFID_NAME|unix.FAN_REPORT_TARGET_FID, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return nil, err
	}
	w := &watcher{f: os.NewFile(uintptr(fd), "fanotify"), self: int32(os.Getpid()), on: on, done: make(chan struct{})}
	go w.run()
	return w, nil
}

// close stops the watcher; its marks go with the group.
func (w *watcher) close() {
	w.f.Close()
	<-w.done
}

// markDir watches the directory fd refers to (an O_PATH descriptor). ENOSPC means the marks limit (fs.fanotify.max_user_marks).
func (w *watcher) markDir(fd int) error { return w.mark(unix.FAN_MARK_ADD, fd) }

// unmarkDir stops watching the directory fd refers to, with the server's
// own credentials: fanotify_mark wants read permission on the object to
// remove a mark as well as to add one, and the last user of a directory
// to go (its close runs as that user) may be one who can only search it.
func (w *watcher) unmarkDir(fd int) error {
	return asServer(func() error { return w.mark(unix.FAN_MARK_REMOVE, fd) })
}

func (w *watcher) mark(op uint, fd int) error {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	var merr error
	if err := rc.Control(func(gfd uintptr) {
		// "." relative to fd: the directory itself. (A NULL pathname
		// would need fd to be more than an O_PATH descriptor.)
		merr = unix.FanotifyMark(int(gfd), op, watchDirMask, fd, ".")
	}); err != nil {
		return err
	}
	return merr
}

// fidOf is the file identifier fanotify reports for the object (dirfd,
// base) — base "" is dirfd itself —: the filesystem id and the file handle
// (name_to_handle_at(2), not following a final symlink; or known, hk,
// when not nil). fsids caches the filesystem ids by device (dev, dirfd's).
func fidOf(dirfd int, base string, dev uint64, fsids map[uint64]string, hk *unix.FileHandle) (string, error) {
	var h unix.FileHandle
	if hk != nil {
		h = *hk
	} else {
		flags := 0
		if base == "" {
			flags = unix.AT_EMPTY_PATH
		}
		var err error
		if h, _, err = unix.NameToHandleAt(dirfd, base, flags); err != nil {
			return "", err
		}
	}
	fsid, ok := fsids[dev]
	if !ok {
		var sfs unix.Statfs_t
		if err := unix.Fstatfs(dirfd, &sfs); err != nil {
			return "", err
		}
		b := binary.LittleEndian.AppendUint32(nil, uint32(sfs.Fsid.Val[0]))
		fsid = string(binary.LittleEndian.AppendUint32(b, uint32(sfs.Fsid.Val[1])))
		fsids[dev] = fsid
	}
	b := make([]byte, 0, 12+len(h.Bytes()))
	b = append(b, fsid...)
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Type()))
	return string(append(b, h.Bytes()...)), nil
}

func (w *watcher) run() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			w.failed.Store(true)
			w.on([]watchEvent{{overflow: true}})
			return
		}
		if evs := w.decode(buf[:n]); len(evs) == 0 || !w.on(evs) {
			// Nothing that broke a lease: the server's own events (a
			// FAN_MODIFY per write to a file in a watched directory),
			// or another process's changes to what nobody holds (a
			// second server's or a local program's writes to a file
			// beside a leased one). Read again after a pause, so that
			// a stream of such writes wakes this goroutine once per
			// watchQuiet rather than once per write — the kernel
			// merges the events that queue meanwhile (same object,
			// same pid) into one. A local change is noticed up to
			// watchQuiet later.
			watchPause()
		}
	}
}

// watchQuiet is how long the watcher waits after a read that broke no
// lease.
const watchQuiet = 5 * time.Millisecond

// watchPause is the watcher's pause after a read that broke no lease (a
// variable for tests, which count the pauses).
var watchPause = func() { time.Sleep(watchQuiet) }

// Layout of fanotify's records (fanotify(7)).
const (
	fanMetaSize = int(unsafe.Sizeof(unix.FanotifyEventMetadata{}))
	// An info record: type u8, pad u8, len u16, fsid [8], then a
	// file_handle {handle_bytes u32, handle_type i32, f_handle}, then for
	// the DFID_NAME types a NUL-terminated name.
	fanInfoFid      = 1 // FAN_EVENT_INFO_TYPE_FID
	fanInfoDfidName = 2 // FAN_EVENT_INFO_TYPE_DFID_NAME
	fanInfoDfid     = 3 // FAN_EVENT_INFO_TYPE_DFID
)

// decode parses a read's worth of events, leaving out this server's own.
func (w *watcher) decode(b []byte) []watchEvent {
	var out []watchEvent
	for len(b) >= fanMetaSize {
		m := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&b[0]))
		if int(m.Event_len) < fanMetaSize || int(m.Event_len) > len(b) {
			break
		}
		ev, rec := watchEvent{mask: m.Mask}, b[m.Metadata_len:m.Event_len]
		b = b[m.Event_len:]
		if m.Mask&unix.FAN_Q_OVERFLOW != 0 {
			out = append(out, watchEvent{overflow: true})
			continue
		}
		if m.Pid == w.self {
			continue
		}
		for len(rec) >= 4 {
			typ, l := rec[0], int(binary.LittleEndian.Uint16(rec[2:]))
			if l < 20 || l > len(rec) {
				break
			}
			r := rec[:l]
			rec = rec[l:]
			hb := int(binary.LittleEndian.Uint32(r[12:]))
			if 20+hb > len(r) {
				continue
			}
			// Key: fsid, handle type, handle bytes (fidOf's layout).
			fid := string(r[4:12]) + string(r[16:20]) + string(r[20:20+hb])
			switch typ {
			case fanInfoFid:
				ev.fid = fid
			case fanInfoDfidName:
				ev.dir = fid
				name := r[20+hb:]
				for i, c := range name {
					if c == 0 {
						name = name[:i]
						break
					}
				}
				ev.name = string(name)
			case fanInfoDfid:
				ev.dir, ev.name = fid, "."
			}
		}
		out = append(out, ev)
	}
	return out
}

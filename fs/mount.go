package fs

import (
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/quietlog"
)

// Defaults of the caching options, as cmd/lwio-mount applies them.
const (
	DefaultAttrTimeout  = time.Second
	DefaultEntryTimeout = time.Second
)

// Request sizes the kernel is told it may send: FUSE's own ceiling on this
// kernel (256 pages), so a 1 MiB application read or write is one LWIO
// request, not eight.
const (
	MaxWrite      = 1 << 20
	MaxReadAhead  = 1 << 20
	MaxBackground = 64
)

// Options shape a mount.
type Options struct {
	// AttrTimeout and EntryTimeout are how long the kernel may trust
	// attributes and names without asking; zero means it never does
	// (every stat is a round trip). cmd/lwio-mount defaults both to 1s.
	AttrTimeout  time.Duration
	EntryTimeout time.Duration
	// ReadOnly mounts read-only (MS_RDONLY).
	ReadOnly bool
	// NoExec mounts noexec (MS_NOEXEC): nothing on the mount may be
	// executed. The mount is always nosuid and nodev.
	NoExec bool
	// AllowOther lets users other than the mounting one use the mount.
	AllowOther bool
	// DefaultPermissions has the kernel check the mode bits of the owners
	// shown (Owners) before any request reaches the server; without it
	// the server alone decides, as the account each caller acts as (see
	// docs/usage.md, "Who owns what").
	DefaultPermissions bool
	// Owners maps file owners between the server's ids and this host's;
	// nil shows the server's ids.
	Owners *IDMap
	// Debug logs every FUSE request and reply (go-fuse's debug output).
	Debug bool
	// FsName is the "source" column of /proc/mounts, e.g. "//host/share";
	// empty means "lwio".
	FsName string
	// MaxBackground bounds asynchronous requests the kernel keeps in
	// flight (readahead, O_DIRECT with ASYNC_DIO); 0 means MaxBackground.
	MaxBackground int
	// WriteBehind is how many writes of one file a buffered writer keeps
	// in flight: a WRITE is answered once posted, and close, fsync and
	// anything reading from the server wait for them (writebehind.go). 0
	// means DefaultWriteBehind; negative writes through (every WRITE
	// answered once the server has it).
	WriteBehind int
	// ReadAhead is the mount's readahead window in bytes: buffered
	// sequential reads reach the daemon as requests this large (up to
	// MaxWrite). The kernel offers FUSE only its default (128 KiB) at
	// INIT, so Mount raises it afterwards through the mount's
	// backing-device setting; 0 means MaxReadAhead, negative leaves the
	// kernel's default.
	ReadAhead int
	// NoLeases asks the server for no leases: only the attribute and
	// entry timeouts cache (lease.go).
	NoLeases bool
	// SyncClose makes close(2) wait until what a Write lease held back is
	// on the server, as NFS's close does; without it close(2) returns at
	// once and the changes follow in the background (asyncclose.go).
	SyncClose bool
	// Logger receives the filesystem's logs; nil means quiet.
	Logger logrus.FieldLogger

	// releasePace bounds how long a release with changes to send waits
	// for the next exclusive create to carry them (asyncclose.go); 0 means
	// releasePace, negative none. Tests set it.
	releasePace time.Duration
}

// logger is o.Logger, or a quiet one.
func (o Options) logger() logrus.FieldLogger { return quietlog.Or(o.Logger) }

// NewRoot returns the root node of a mount over tree with file data on data.
// A tree that grants leases (a SessionLeaser) is asked for them unless
// opts.NoLeases.
func NewRoot(tree Tree, data DataPath, opts Options) *Node {
	fs := &filesystem{tree: tree, data: data, opts: opts, log: opts.logger(), wb: newAsyncWrites(opts.writeBehind()), idle: make(chan func())}
	if sl, ok := tree.(SessionLeaser); ok && !opts.NoLeases {
		fs.lease = newLeaseCtl(fs, sl)
	}
	return &Node{fs: fs}
}

// setting is the value of an Options field whose zero means def and whose
// negative values turn the feature off (0).
func setting[T ~int | ~int64](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func (o Options) writeBehind() int { return setting(o.WriteBehind, DefaultWriteBehind) }

// MountOptions returns the go-fuse options of a mount: timeouts, and the
// settings that make the kernel send large and parallel requests. Without
// CAP_ASYNC_DIO, O_DIRECT I/O at queue depth 16 reaches the daemon one
// request at a time; MaxBackground bounds how many asynchronous requests
// the kernel keeps in flight (its default, 12, is below a qd16 job).
func (o Options) MountOptions() *gofs.Options {
	attr, entry := o.AttrTimeout, o.EntryTimeout
	var negative time.Duration // no negative caching: a file created elsewhere shows up at once
	bg := o.MaxBackground
	if bg <= 0 {
		bg = MaxBackground
	}
	name := o.FsName
	if name == "" {
		name = "lwio"
	}
	mo := fuse.MountOptions{
		FsName:        name,
		Name:          "lwio",
		AllowOther:    o.AllowOther,
		Debug:         o.Debug,
		MaxWrite:      MaxWrite,
		MaxReadAhead:  MaxReadAhead,
		MaxBackground: bg,
		// Read replies are engine buffers handed over as slices
		// (bufResult.Slices) or plain memory, never file descriptors:
		// go-fuse's splice path would only grow a pipe, copy the header
		// into it and give up (logging "trySplice: … max pipe size" for
		// every 1 MiB reply) before writing the reply as a plain writev.
		DisableSplice: true,
		// ASYNC_DIO: O_DIRECT at queue depth N arrives as N parallel
		// requests, which is what makes credits matter. PARALLEL_DIROPS is
		// in go-fuse's defaults. WRITEBACK_CACHE is not asked for: with it
		// the kernel keeps its own size and mtime of a cached file and
		// ignores the server's, so another client's changes would not show
		// (a lease could allow it); buffered writes keep several requests in
		// flight by write-behind in this daemon instead (writebehind.go).
		// DIRECT_IO_ALLOW_MMAP: files opened O_APPEND are direct I/O
		// (append.go) and may still be mapped shared.
		// HANDLE_KILLPRIV_V2: the server clears set-user-ID and
		// set-group-ID bits (and file capabilities) when it writes,
		// truncates or changes owners — it acts as the user, without
		// CAP_FSETID (protocol/share) — so the kernel need not: it marks
		// the superblock SB_NOSEC and stops asking for security.capability
		// (a FUSE round trip, answered locally, before every write: ~20 µs
		// of a 4 KiB O_DIRECT write's ~120, issue 16). A tree acting as
		// root (allow_root) keeps CAP_FSETID: there the mount clears the
		// bits itself for a caller without it, as the kernel flags
		// (killpriv.go). test/setid_write_test.go.
		ExtraCapabilities: fuse.CAP_ASYNC_DIO | fuse.CAP_DIRECT_IO_ALLOW_MMAP | fuse.CAP_HANDLE_KILLPRIV_V2,
		// Passthrough would hand the kernel a local fd; there is none.
		DisabledCapabilities: fuse.CAP_PASSTHROUGH,
		// As root, mount(2) directly: no fusermount needed.
		DirectMount: true,
		// The kernel asks for security.capability before every write (to
		// drop file capabilities) and ls -l for the POSIX ACLs of every
		// file: a session round trip each, doubling the cost of a write.
		// Answered ENODATA locally. The server's own kernel still drops
		// capabilities when it writes; ACLs are not enforced on this
		// client (no CAP_POSIX_ACL) and so are not shown either.
		IgnoreSecurityLabels: true,
		// fcntl and flock locks go to the server (lock.go), which holds
		// them against every other client and local process.
		EnableLocks: true,
	}
	// Set-user-ID programs and device nodes on a network share must not
	// act on this host (go-fuse's direct mount sets both by default; say
	// so for the fusermount path too).
	mo.Options = append(mo.Options, "nosuid", "nodev")
	if o.NoExec {
		mo.Options = append(mo.Options, "noexec")
	}
	if o.ReadOnly {
		mo.Options = append(mo.Options, "ro")
	}
	if o.DefaultPermissions {
		mo.Options = append(mo.Options, "default_permissions")
	}
	if o.Debug {
		mo.Logger = log.New(logWriter{o.logger()}, "", 0)
	}
	return &gofs.Options{
		MountOptions:    mo,
		AttrTimeout:     &attr,
		EntryTimeout:    &entry,
		NegativeTimeout: &negative,
		NullPermissions: true,
	}
}

// logWriter feeds go-fuse's debug lines into logrus.
type logWriter struct{ l logrus.FieldLogger }

func (w logWriter) Write(p []byte) (int, error) {
	w.l.WithField("component", "fuse").Debug(string(trimNL(p)))
	return len(p), nil
}

func trimNL(p []byte) []byte {
	for len(p) > 0 && p[len(p)-1] == '\n' {
		p = p[:len(p)-1]
	}
	return p
}

// Mount mounts tree at mountpoint and returns once the kernel has the
// mount; the caller runs until Wait returns or calls Unmount.
// It builds what go-fuse's fs.Mount would, with rawFS between the kernel
// and the node tree.
func Mount(mountpoint string, tree Tree, data DataPath, opts Options) (*Server, error) {
	return mountRoot(mountpoint, NewRoot(tree, data, opts), opts)
}

// mountRoot mounts the node tree under root at mountpoint.
func mountRoot(mountpoint string, root *Node, opts Options) (*Server, error) {
	mo := opts.MountOptions()
	root.fs.extras = newRequestExtras()
	raw := &rawFS{RawFileSystem: gofs.NewNodeFS(root, mo), x: root.fs.extras}
	srv, err := fuse.NewServer(raw, mountpoint, &mo.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	if ra := opts.readAhead(); ra > 0 {
		if err := setReadAhead(mountpoint, ra); err != nil {
			root.fs.log.WithError(err).WithField("readahead", ra).Info("fs: readahead stays at the kernel's default")
		}
	}
	return &Server{Server: srv, fs: root.fs}, nil
}

func (o Options) readAhead() int { return min(setting(o.ReadAhead, MaxReadAhead), MaxWrite) }

// setReadAhead sets the readahead of the mount at mountpoint to n bytes:
// the read_ahead_kb of its backing device (/sys/class/bdi/MAJ:MIN), which
// the kernel caps a FUSE mount's at INIT to its own default. It needs
// root, as mounting directly does.
func setReadAhead(mountpoint string, n int) error {
	var st unix.Stat_t
	if err := unix.Stat(mountpoint, &st); err != nil {
		return err
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	return os.WriteFile(p, []byte(strconv.Itoa(n/1024)), 0)
}

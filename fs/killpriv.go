package fs

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// Set-user-ID and set-group-ID bits on writes (HANDLE_KILLPRIV_V2).
//
// The mount asks the kernel for HANDLE_KILLPRIV_V2 (mount.go): the kernel
// then neither asks for security.capability before each write nor sends
// the SETATTR that cleared a file's set-id bits when a caller without
// CAP_FSETID wrote, truncated or chowned it. It flags those requests
// instead — WRITE_KILL_SUIDGID on a WRITE, FATTR_KILL_SUIDGID on a
// SETATTR, OPEN_KILL_SUIDGID on an OPEN or CREATE with O_TRUNC — and the
// filesystem clears the bits. A server acting as an ordinary account does
// so by itself: its kernel clears them when that account, which has no
// CAP_FSETID, writes. A caller acting as root (a share with allow_root)
// has the server's own credentials there, which keep them: for such a
// caller the mount clears them, as the local kernel did before —
// S_ISUID always, S_ISGID when group execute is set (should_remove_suid).
//
// The common case costs nothing on the wire: only a node whose last
// attributes seen had such bits (Node.setID) is looked at (the raw wrapper
// still notes the flag of every flagged request, a map insert and delete
// under a mutex). A held-back write (a Write
// lease, writebehind.go) holds the chmod back ahead of it, in the same
// BATCH; a truncate or chown carries the mode in its own SETATTR; a write
// sent at once, or an open with O_TRUNC, sends one SETATTR first (after
// an fstat when the attributes at hand are not fresh). A FALLOCATE or
// COPY_FILE_RANGE does too, though the kernel flags neither: it clears
// the bits before them for a caller without CAP_FSETID (file_modified),
// but its SETATTR for that arrives empty under HANDLE_KILLPRIV_V2, so the
// caller's capabilities are read from /proc (callerHasFSETID). go-fuse does not
// ask for ATOMIC_O_TRUNC, so the kernel truncates for open(O_TRUNC) with a
// SETATTR, flagged as a truncate is; the OPEN and CREATE flags are
// honoured should that change. A CREATE cannot tell a file it made from
// one it opened: with allow_setid, a set-id file an unprivileged caller
// creates with O_TRUNC (not O_EXCL) loses the bits, which locally it
// would keep. The bits looked at are those of the attributes this mount
// last saw — each open brings them, or a lease vouches for them — as the
// kernel used its cached mode before: a chmod u+s by another client
// between an open and a write through it is missed.

// setIDCleared returns mode without the bits a write by a caller without
// CAP_FSETID clears, and whether there were any.
func setIDCleared(mode uint32) (uint32, bool) {
	if mode&syscall.S_IFMT != syscall.S_IFREG {
		return mode, false
	}
	m := mode &^ syscall.S_ISUID
	if m&syscall.S_IXGRP != 0 {
		m &^= syscall.S_ISGID
	}
	return m, m != mode
}

// sawMode records whether attributes seen for n (shown to the kernel, or
// answered by the server) have set-id bits a write would clear.
func (n *Node) sawMode(mode uint32) {
	_, has := setIDCleared(mode)
	if n.setID.Load() != has {
		n.setID.Store(has)
	}
}

// clearsSetID reports whether the mount must clear set-id bits itself for
// the caller of ctx, whose request the kernel flagged: the caller acts as
// root on the server (which keeps them), or as an account the server did
// not name (known false: the chmod is then tried, and its refusal
// ignored).
func (n *Node) clearsSetID(ctx context.Context) (clears, known bool) {
	c, _ := fuse.FromContext(ctx)
	acct, known := n.fs.opts.Owners.accountOf(c)
	return !known || acct.Uid == 0, known
}

// killFlagged reports whether the request of ctx was flagged by the kernel
// to clear set-id bits (a WRITE, OPEN or CREATE; rawfs.go).
func (n *Node) killFlagged(ctx context.Context) bool {
	e, _ := n.fs.extras.of(ctx)
	return e.killSetID
}

// killSetIDWrite clears n's set-id bits through handle h before the write
// (or O_TRUNC) of ctx when the kernel flagged it, the mount must (see
// clearsSetID) and the file has them. Nothing is sent unless the last
// attributes seen had them.
func (n *Node) killSetIDWrite(ctx context.Context, h session.Handle) error {
	if !n.setID.Load() || !n.killFlagged(ctx) {
		return nil
	}
	return n.killSetID(ctx, h)
}

// killSetIDUnflagged is killSetIDWrite for a FALLOCATE or COPY_FILE_RANGE
// (into n, through h): the kernel clears set-id bits before those
// (file_modified) for a caller without CAP_FSETID, but flags neither
// request — the SETATTR it sends first arrives empty under
// HANDLE_KILLPRIV_V2 — so the caller's capabilities are looked up
// (callerHasFSETID). Only for a file with the bits on a mount that must
// clear them.
func (n *Node) killSetIDUnflagged(ctx context.Context, h session.Handle) error {
	if !n.setID.Load() {
		return nil
	}
	if clears, _ := n.clearsSetID(ctx); !clears || callerHasFSETID(ctx) {
		return nil
	}
	return n.killSetID(ctx, h)
}

// callerHasFSETID reports whether the caller of ctx has CAP_FSETID in
// this process's user namespace, from /proc: its effective set, and its
// user namespace. Unknown (no pid — another pid namespace — or a caller
// gone) counts as without, which clears.
func callerHasFSETID(ctx context.Context) bool {
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Pid == 0 {
		return false
	}
	proc := "/proc/" + strconv.FormatUint(uint64(c.Pid), 10)
	b, err := os.ReadFile(proc + "/status")
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), "\nCapEff:")
	if !ok {
		return false
	}
	line, _, _ := strings.Cut(rest, "\n")
	caps, err := strconv.ParseUint(strings.TrimSpace(line), 16, 64)
	if err != nil || caps&(1<<unix.CAP_FSETID) == 0 {
		return false
	}
	theirs, err1 := os.Readlink(proc + "/ns/user")
	ours, err2 := os.Readlink("/proc/self/ns/user")
	return err1 == nil && err2 == nil && theirs == ours
}

// killSetID clears n's set-id bits through h, when the mount must for the
// caller of ctx (clearsSetID) and the file has them.
func (n *Node) killSetID(ctx context.Context, h session.Handle) error {
	clears, known := n.clearsSetID(ctx)
	if !clears {
		return nil
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	a, err := n.currentAttr(ctx, h)
	if err != nil {
		return err
	}
	mode, ok := setIDCleared(a.Mode)
	if !ok {
		return nil
	}
	g := n.dropAttr()
	a, err = n.fs.tree.SetAttr(ctx, "", h, session.SetAttrIn{Valid: session.SetMode, Mode: mode & 07777})
	if err != nil {
		n.dropAttr()
		if !known {
			n.fs.log.WithError(err).WithField("path", n.path()).Debug("fs: clearing set-id bits refused; the server's own write clears them")
			return nil
		}
		return err
	}
	n.rememberAt(g, a) // and sawMode, unless a change overtook the reply
	// The kernel shows the old mode until it asks again. Attributes
	// only: takes no lock a request on this file could hold.
	n.NotifyContent(-1, 0)
	return nil
}

// currentAttr returns n's attributes fresh enough to compute a mode from:
// remembered ones if fresh (or predicted, or held under a lease), else an
// fstat through h (a SETATTR that sets nothing).
func (n *Node) currentAttr(ctx context.Context, h session.Handle) (session.Attr, error) {
	if a, ok := n.freshAttr(); ok {
		return a, nil
	}
	g := n.gen()
	p := ""
	if h == 0 {
		p = n.path()
	}
	a, err := n.fs.tree.SetAttr(ctx, p, h, session.SetAttrIn{})
	if err != nil {
		return a, err
	}
	n.rememberAt(g, a) // and sawMode, unless a change overtook the reply
	return a, nil
}

// killSetIDSetattr adds to a truncate or chown the kernel flagged
// (FATTR_KILL_SUIDGID) the mode without the set-id bits, when the mount
// must clear them and the file has them: one SETATTR does both.
func (n *Node) killSetIDSetattr(ctx context.Context, in *fuse.SetAttrIn, h session.Handle, s *session.SetAttrIn) error {
	if in.Valid&fuse.FATTR_KILL_SUIDGID == 0 || s.Valid&session.SetMode != 0 || !n.setID.Load() {
		return nil
	}
	if clears, known := n.clearsSetID(ctx); !clears || !known {
		return nil // unknown account: a refused chmod would fail the truncate
	}
	a, err := n.currentAttr(ctx, h)
	if err != nil {
		return err
	}
	if mode, ok := setIDCleared(a.Mode); ok {
		s.Valid |= session.SetMode
		s.Mode = mode & 07777
	}
	return nil
}

// killSetIDHold says, for a write of ctx that may be held back, whether
// set-id bits would have to be cleared with it (kill), whether the server
// clears them itself when the write lands (an ordinary account: the
// predicted mode must lose them), and whether it may be held back at all:
// not when the server did not say which account the caller acts as (a
// refused chmod would fail the whole BATCH, and the mode to predict is not
// known).
func (n *Node) killSetIDHold(ctx context.Context) (kill, serverClears, mayHold bool) {
	if !n.setID.Load() {
		return false, false, true
	}
	clears, known := n.clearsSetID(ctx)
	switch {
	case !known:
		return false, false, false
	case !clears:
		return false, true, true
	}
	return n.killFlagged(ctx), false, true
}

// serverClearsSetID reports whether the server clears n's set-id bits
// itself when a truncate or chown of ctx lands: it acts as an ordinary
// account (without CAP_FSETID), and the file has them.
func (n *Node) serverClearsSetID(ctx context.Context) bool {
	if !n.setID.Load() {
		return false
	}
	clears, known := n.clearsSetID(ctx)
	return known && !clears
}

// killSetIDHeld is the held-back form for a write through a handle of n
// under a Write lease: the chmod is held back ahead of the write, in the
// same BATCH, and the predicted mode loses the bits. kill is what
// killSetIDHold said; Node.mu held.
func (n *Node) killSetIDHeld(kill bool, h session.Handle) {
	if !kill {
		return
	}
	mode, ok := setIDCleared(n.fresh.Mode)
	if !ok {
		return
	}
	n.hold(session.BatchOp{Command: session.CmdSetAttr, Handle: h, SetAttr: session.SetAttrIn{Valid: session.SetMode, Mode: mode & 07777}})
	n.fresh.Mode = mode
}

package share

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Per-user identity: every disk operation of a Tree runs with its
// account's fsuid, fsgid and supplementary groups, so that the kernel's
// own permission checks decide what the user may do and new files are
// owned by the user — what Samba's become_user does, per thread.
//
// Linux keeps credentials per thread, but Go's syscall.Setfsuid,
// Setgroups and friends change every thread of the process (they go
// through AllThreadsSyscall, as glibc's do through its setxid signal).
// So each operation runs on an OS thread of its own (an identity thread:
// a goroutine locked to its thread with runtime.LockOSThread and never
// unlocked), which changes that thread's credentials with raw system
// calls (SYS_SETGROUPS, SYS_SETFSGID, SYS_SETFSUID, capset). The Go runtime
// runs nothing else on a locked thread and creates new threads from a
// clean template thread, never by cloning a locked one, so no other
// goroutine ever runs with a user's credentials.
//
// An identity thread is never given back to the scheduler, even with the
// server's credentials restored: the kernel replaces a thread's credential
// structure at every change, and some interfaces refuse a thread whose
// credentials are not the very structure a file was opened with, however
// equal — the RDMA verbs device's write(2) (ib_safe_file_access), through
// which Soft-RoCE posts every work request, answers EACCES. A goroutine
// that had acted for a user and then posted an RDMA WRITE from the same
// thread failed that way in the Soft-RoCE guest. The identity threads keep
// the credentials of the last account they served, so a run of one user's
// operations makes no credential change at all.
//
// Changing the fsuid from 0 to another uid drops the thread's effective
// filesystem capabilities (CAP_CHOWN, CAP_DAC_OVERRIDE,
// CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID, CAP_MKNOD, …): that is what
// makes the kernel's checks apply. Any other capability that could change
// what a file operation may do (CAP_SYS_RESOURCE, which overrides quotas
// and reserved blocks; CAP_SYS_ADMIN, which exceeds file-max and writes
// trusted.* attributes; …) is cleared from the effective set too, with
// capset(2), which also acts on the calling thread only; the permitted set
// is kept so that the server can take them back. The systemd unit's
// bounding set leaves none of those (only CAP_SETUID and CAP_SETGID, which
// a file operation does not use, and CAP_LEASE), so there the two capset
// calls are skipped. An account whose uid is 0 (a share with allow_root)
// keeps the server's capabilities: it acts as root. The kernel drops the
// filesystem capabilities only when the fsuid leaves 0: a server that is
// not root but holds them (User= with AmbientCapabilities=), or runs with
// SECBIT_NO_SETUID_FIXUP, keeps them through setfsuid, so there they count
// as extra and capset drops them — for the server's own uid too, which
// then runs on an identity thread like any other account.
//
// Each credential change costs a few microseconds (the kernel copies the
// credentials and frees the old ones after an RCU grace period); an
// operation makes three to enter and three to leave, fewer when the
// account shares the server's gid or groups, none for the server's own
// account (BenchmarkRun, docs/security.md).
//
// If an identity thread cannot change its credentials back — which cannot
// happen with the permitted set kept, but is checked — it ends with its
// goroutine, locked, and the runtime ends the thread with it.

// cred is an account's credentials, prepared for the raw system calls.
// nil means "the server's own": nothing to change.
type cred struct {
	uid, gid uint32
	groups   []uint32 // gid_t is 32 bits on every Linux ABI Go supports
	// Which changes enter makes: the ones the account differs from the
	// server in.
	setGroups, setGid, dropCaps bool
}

// selfCred is the server's own credentials, read once: what every thread
// returns to after acting for a user.
type selfCred struct {
	uid, gid uint32
	groups   []uint32
	caps     [2]unix.CapUserData
	// perUser: the process may change a thread's credentials
	// (CAP_SETUID and CAP_SETGID effective).
	perUser bool
	// extraCaps: effective capabilities beyond those a thread loses with
	// its fsuid and those no file operation uses (keptCaps), which a
	// user's thread must drop with capset.
	extraCaps bool
	// initialUserNS: the process is in the initial user namespace.
	initialUserNS bool
}

// fsCaps are the capabilities the kernel clears from a thread's effective
// set when its fsuid leaves 0 (CAP_FS_SET in linux/capability.h), and
// keptCaps those a user's thread may keep because no file operation of
// the share consults them: CAP_SETUID and CAP_SETGID (the thread's own
// way back) and CAP_LEASE (leases are taken by the server, never for a
// user).
const (
	fsCaps = 1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH |
		1<<unix.CAP_FOWNER | 1<<unix.CAP_FSETID | 1<<unix.CAP_LINUX_IMMUTABLE | 1<<unix.CAP_MKNOD
	fsCapsHigh = 1 << (unix.CAP_MAC_OVERRIDE - 32)
	keptCaps   = 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID | 1<<unix.CAP_LEASE
)

var (
	self       = readSelf()
	dropCaps   [2]unix.CapUserData // self's permitted and inheritable sets, no effective
	capsHeader = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}

	// restoreFailures counts threads left locked because the server's
	// credentials could not be put back (RestoreFailures).
	restoreFailures atomic.Int64
)

func readSelf() *selfCred {
	s := &selfCred{uid: uint32(unix.Geteuid()), gid: uint32(unix.Getegid()), initialUserNS: initialUserNS()}
	if gs, err := unix.Getgroups(); err == nil {
		for _, g := range gs {
			s.groups = append(s.groups, uint32(g))
		}
		slices.Sort(s.groups) // as newCred's
	}
	hdr := capsHeader
	if err := unix.Capget(&hdr, &s.caps[0]); err == nil {
		const need = 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID
		s.perUser = s.caps[0].Effective&need == need
		// The kernel clears the filesystem capabilities from a thread
		// whose fsuid leaves 0 — from 0 only, and not with
		// SECBIT_NO_SETUID_FIXUP. A server that is not root (a unit with
		// User= and AmbientCapabilities=) or has that bit keeps them
		// through setfsuid: they are extra, dropped with capset.
		low, high := uint32(keptCaps), uint32(0)
		if s.uid == 0 && !noSetuidFixup() {
			low, high = low|fsCaps, fsCapsHigh
		}
		s.extraCaps = s.caps[0].Effective&^low != 0 || s.caps[1].Effective&^high != 0
	}
	dropCaps = s.caps
	dropCaps[0].Effective, dropCaps[1].Effective = 0, 0
	return s
}

// noSetuidFixup reports whether the process has SECBIT_NO_SETUID_FIXUP
// set: then no change of its ids touches its capabilities.
func noSetuidFixup() bool {
	bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0)
	return err == nil && bits&secbitNoSetuidFixup != 0
}

// secbitNoSetuidFixup is SECBIT_NO_SETUID_FIXUP (linux/securebits.h).
const secbitNoSetuidFixup = 1 << 2

// fsCapable reports whether the server has every capability that makes
// the kernel's file permission checks pass without asking the groups:
// CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID
// — and in the initial user namespace: in another (a container) they do
// not apply to a file whose owner or group the namespace does not map,
// and the kernel's check asks the groups there.
func (s *selfCred) fsCapable() bool {
	const need = 1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH |
		1<<unix.CAP_FOWNER | 1<<unix.CAP_FSETID
	return s.caps[0].Effective&need == need && s.initialUserNS
}

// initialUserNS reports whether the process is in the initial user
// namespace: its uid and gid maps are the identity over every id.
func initialUserNS() bool {
	for _, m := range []string{"/proc/self/uid_map", "/proc/self/gid_map"} {
		b, err := os.ReadFile(m)
		if err != nil || !slices.Equal(strings.Fields(string(b)), []string{"0", "0", "4294967295"}) {
			return false
		}
	}
	return true
}

// PerUser reports whether this process can act as each user (it has
// CAP_SETUID and CAP_SETGID, as root does). Without it every Tree acts
// with the server's own credentials, whoever logged on.
func PerUser() bool { return self.perUser }

// RestoreFailures is how many threads could not be given back the
// server's credentials after acting for a user and were retired with
// their goroutine. Anything but 0 is a bug worth a log line.
func RestoreFailures() int64 { return restoreFailures.Load() }

// newCred prepares a's credentials; nil when the process cannot act per
// user, or a is the server's own identity.
func newCred(a Account) *cred {
	if !self.perUser {
		return nil
	}
	c := &cred{uid: a.Uid, gid: a.Gid, groups: append([]uint32(nil), a.Groups...)}
	if len(c.groups) > maxGroups {
		c.groups = c.groups[:maxGroups]
	}
	// In the kernel's order: setgroups(2) sorts the list, and getgroups(2)
	// answers it sorted, which threadHas compares with. An account's own
	// order (the primary group first, then /etc/group's) would never
	// compare equal, and every operation inside a Tree.Run would be
	// handed off again.
	slices.Sort(c.groups)
	c.setGroups = !slices.Equal(c.groups, self.groups)
	c.setGid = c.gid != self.gid
	c.dropCaps = c.uid != 0 && self.extraCaps
	if c.uid == self.uid && !c.setGid && !c.dropCaps && (!c.setGroups || c.uid == 0 && self.fsCapable()) {
		// The server's own credentials: nothing to change. Also root's
		// account (root in its own group, say) run by a root server
		// whose own group list differs: with the file capabilities
		// effective no permission check of the share consults the
		// supplementary groups — and each request would cost a hand-off
		// to an identity thread and back for nothing.
		return nil
	}
	return c
}

// maxGroups is the kernel's NGROUPS_MAX.
const maxGroups = 65536

// run runs fn with c's credentials (nil c: as the server, on the calling
// goroutine) on one of the identity threads (identity_threads_linux.go)
// and returns what fn returns.
func (c *cred) run(fn func() error) error {
	if c == nil {
		if runsActive.Load() > 0 && self.perUser && !selfInPlace() {
			// Inside Tree.Run, on an identity thread: the server's
			// own operation runs on a goroutine of its own.
			return runAsServer(fn)
		}
		return fn()
	}
	return runAs(c, fn)
}

// asServer runs fn with the server's own credentials: on the calling
// thread when it has them, else — the caller is on an identity thread — on
// a goroutine of its own (runAsServer).
func asServer(fn func() error) error {
	if !self.perUser || selfInPlace() {
		return fn()
	}
	return runAsServer(fn)
}

// inPlace reports whether the calling thread has c's credentials now: its
// fsuid, fsgid and groups are c's (its capabilities follow from the fsuid:
// enter drops them for every uid but 0). True only on an identity thread
// in c's credentials — c differs from the server's in one of the three at
// least (newCred), and no other thread ever has anything but the server's —
// and then the caller is that thread's own goroutine, locked to it: the
// answer cannot go stale (identity_threads_linux.go, "Nested runs").
//
// The one account whose ids can all be the server's is the server's own
// uid on a server that is not root but holds capabilities to drop
// (dropCaps): its identity thread differs from the server's threads only
// in its effective capabilities, which are asked of the kernel then too.
func (c *cred) inPlace() bool {
	if !threadHas(c.uid, c.gid, c.groups) {
		return false
	}
	return !c.dropCaps || !sameIDsAsSelf(c) || threadCapsDropped()
}

// selfInPlace reports whether the calling thread has the server's own
// credentials (it is not an identity thread in a user's).
func selfInPlace() bool {
	if !threadHas(self.uid, self.gid, self.groups) {
		return false
	}
	return !(self.uid != 0 && self.extraCaps) || !threadCapsDropped()
}

// sameIDsAsSelf reports whether c's fsuid, fsgid and groups are the
// server's.
func sameIDsAsSelf(c *cred) bool {
	return c.uid == self.uid && !c.setGid && !c.setGroups
}

// threadCapsDropped reports whether the calling thread's effective
// capabilities are cleared (capget of the calling thread).
func threadCapsDropped() bool {
	var caps [2]unix.CapUserData
	hdr := capsHeader
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		return false
	}
	return caps[0].Effective == 0 && caps[1].Effective == 0
}

// threadHas reports whether the calling thread's fsuid, fsgid and
// supplementary groups are these, reading them from the kernel (setfsuid
// and setfsgid with an invalid id change nothing and return the current
// one; getgroups reads the calling thread's own).
func threadHas(uid, gid uint32, groups []uint32) bool {
	if cur, _, _ := unix.RawSyscall(sysSetfsuid, ^uintptr(0), 0, 0); uint32(cur) != uid {
		return false
	}
	if cur, _, _ := unix.RawSyscall(sysSetfsgid, ^uintptr(0), 0, 0); uint32(cur) != gid {
		return false
	}
	var small [32]uint32
	buf := small[:]
	if len(groups) > len(small) {
		buf = make([]uint32, len(groups))
	}
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	// size len(groups): EINVAL when the thread has more, the count else.
	n, _, e := unix.RawSyscall(sysGetgroups, uintptr(len(groups)), uintptr(p), 0)
	if e != 0 || int(n) != len(groups) {
		return false
	}
	return slices.Equal(buf[:n], groups)
}

// errCred is what a failed credential change returns; the client sees
// ACCESS_DENIED (it maps through EACCES).
type errCred struct {
	call  string
	errno unix.Errno
}

func (e *errCred) Error() string {
	return fmt.Sprintf("share: %s on this thread: %v", e.call, e.errno)
}

func (e *errCred) Unwrap() error { return unix.EACCES }

// enter switches the calling (locked) thread to c: groups and fsgid
// first, while the thread still has CAP_SETGID; then fsuid, which drops
// the filesystem capabilities; then the rest of the effective set.
func (c *cred) enter() error {
	if c.setGroups {
		if err := setgroups(c.groups); err != nil {
			return err
		}
	}
	if c.setGid {
		if err := setfsid(sysSetfsgid, "setfsgid", c.gid); err != nil {
			return err
		}
	}
	if err := setfsid(sysSetfsuid, "setfsuid", c.uid); err != nil {
		return err
	}
	if c.dropCaps {
		hdr := capsHeader
		if err := unix.Capset(&hdr, &dropCaps[0]); err != nil {
			return &errCred{"capset", err.(unix.Errno)}
		}
	}
	return nil
}

// restore gives the calling thread the server's credentials back after c:
// the capabilities first (setgroups needs CAP_SETGID), then fsuid, fsgid
// and groups — what c changed. A failed enter restores everything. The
// fs ids are not read back here, unlike in enter: the kernel always lets
// a thread set its fsuid and fsgid to its own effective ids, so these
// calls cannot fail (and a thread left with a user's ids would only have
// less privilege); capset and setgroups report their errors.
func (s *selfCred) restore(c *cred) error {
	all := c == nil
	if all || c.dropCaps {
		hdr := capsHeader
		if err := unix.Capset(&hdr, &s.caps[0]); err != nil {
			return &errCred{"capset", err.(unix.Errno)}
		}
	}
	unix.RawSyscall(sysSetfsuid, uintptr(s.uid), 0, 0)
	if all || c.setGid {
		unix.RawSyscall(sysSetfsgid, uintptr(s.gid), 0, 0)
	}
	if all || c.setGroups {
		return setgroups(s.groups)
	}
	return nil
}

// setfsid sets the thread's fsuid or fsgid with the raw system call and
// checks that it took: setfsuid(2) reports no error, only the previous
// value, so the id is read back with an invalid argument (-1), which
// changes nothing and returns the current one.
func setfsid(nr uintptr, name string, id uint32) error {
	unix.RawSyscall(nr, uintptr(id), 0, 0)
	if cur, _, _ := unix.RawSyscall(nr, ^uintptr(0), 0, 0); uint32(cur) != id {
		return &errCred{name, unix.EPERM}
	}
	return nil
}

// setgroups sets the calling thread's supplementary groups with the raw
// system call (glibc's setgroups, and Go's, change every thread).
func setgroups(gs []uint32) error {
	var p unsafe.Pointer
	if len(gs) > 0 {
		p = unsafe.Pointer(&gs[0])
	}
	if _, _, e := unix.RawSyscall(sysSetgroups, uintptr(len(gs)), uintptr(p), 0); e != 0 {
		return &errCred{"setgroups", e}
	}
	return nil
}

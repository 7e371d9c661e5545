package fs

import (
	"context"
	"slices"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lwiofs/lwiofs/protocol/session"
)

var _ = (gofs.NodeAccesser)((*Node)(nil))

// Access answers access(2), faccessat(2) and chdir's check, which the
// kernel asks the daemon for only on a mount without default_permissions.
// There the server decides every operation as the account the caller acts
// as, not as the caller's local uid, so go-fuse's default — the caller's
// uid against the owner shown — would refuse other local users what the
// server lets them do (chdir into a 0700 directory they just made, a
// `test -w` on their own file). The answer is the mode bits as the
// server's kernel checks them for that account: the owner's bits for the
// owner, the group's for a member of the file's group (primary or
// supplementary), the others' otherwise; where the account's
// supplementary groups are unknown, the group's or the others' —
// generous. It only advises: the server's own check on the operation is
// what counts (ACLs included). A caller acting as no known account (a
// server that did not say which) is answered by whether the node exists;
// a multiuser caller without credentials gets EACCES from that lookup.
func (n *Node) Access(ctx context.Context, mask uint32) syscall.Errno {
	c, _ := fuse.FromContext(ctx)
	acct, known := n.fs.opts.Owners.accountOf(c)
	a, errno := n.serverAttr(ctx)
	if errno != 0 || !known {
		return errno
	}
	if !mayAccess(acct, a, mask) {
		return syscall.EACCES
	}
	return 0
}

// serverAttr is the node's attributes as the server has them (owner
// unmapped), remembered ones if fresh.
func (n *Node) serverAttr(ctx context.Context) (session.Attr, syscall.Errno) {
	if a, ok := n.freshAttr(); ok {
		return a, 0
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	p := n.path()
	g := n.gen()
	a, err := n.fs.tree.GetAttr(ctx, p)
	if err != nil {
		return a, n.errno("access", p, err)
	}
	n.rememberAt(g, a)
	return a, 0
}

// mayAccess is the mode-bit check of mask (R_OK 4, W_OK 2, X_OK 1; 0 is
// existence) for account acct on a file with attributes a, generous where
// groups are unknown (see Access).
func mayAccess(acct Account, a session.Attr, mask uint32) bool {
	mask &= 7
	if acct.Uid == 0 {
		// root: anything but executing a file no one may execute.
		return mask&1 == 0 || a.Mode&syscall.S_IFMT == syscall.S_IFDIR || a.Mode&0o111 != 0
	}
	var bits uint32
	switch {
	case a.Uid == acct.Uid:
		bits = a.Mode >> 6
	case a.Gid == acct.Gid || slices.Contains(acct.Groups, a.Gid):
		bits = a.Mode >> 3
	case acct.Groups == nil:
		bits = a.Mode>>3 | a.Mode
	default:
		bits = a.Mode
	}
	return bits&mask == mask
}

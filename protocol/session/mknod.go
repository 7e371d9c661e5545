package session

import "context"

// CmdMknod creates a FIFO, a UNIX-domain socket, a regular file or — where
// the share allows device nodes — a character or block device
// (docs/session.md). FIFOs and sockets are named objects on the server
// only: a client opens them locally, as NFS clients do, so the server
// never opens one for data.
const CmdMknod Command = 37

// mknodReq is a MKNOD request: Mode holds the S_IFMT type and the
// permission bits (the client's umask already applied), Rdev the device
// number (Linux new_encode_dev, as FUSE and stat(2) carry it) of a device
// node, 0 otherwise. The response is the new entry's Attr.
type mknodReq struct {
	Path string
	Mode uint32
	Rdev uint32
}

func (m *mknodReq) code(c coder) { c.str(&m.Path); c.u32(&m.Mode); c.u32(&m.Rdev) }

func init() {
	register(CmdMknod, "MKNOD", func() message { return new(mknodReq) }, func() message { return new(attrMsg) })
}

// Mknod creates path as a FIFO, socket, regular file or device node (mode
// holds the type and the permission bits; rdev the device number) and
// returns its attributes. A device node on a share that does not allow
// them is STATUS_PRIVILEGE_NOT_HELD (EPERM).
func (t *Tree) Mknod(ctx context.Context, path string, mode, rdev uint32) (Attr, error) {
	var r attrMsg
	err := t.call(ctx, CmdMknod, &mknodReq{Path: path, Mode: mode, Rdev: rdev}, &r)
	return r.Attr, err
}

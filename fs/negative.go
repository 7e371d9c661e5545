package fs

import "github.com/hanwen/go-fuse/v2/fuse"

// negativeFS lets a lookup's ENOENT become a negative entry the kernel
// keeps for the timeout the node set in the reply (Node.negative: under a
// directory's Read lease). go-fuse v2.12 caches absent names only with
// one mount-wide NegativeTimeout, which would hide files created by other
// clients for that long in every directory; the kernel caches a negative
// entry when LOOKUP succeeds with node id 0 and an entry timeout.
type negativeFS struct{ fuse.RawFileSystem }

func (r negativeFS) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	st := r.RawFileSystem.Lookup(cancel, header, name, out)
	if st == fuse.ENOENT && out.EntryTimeout() > 0 {
		out.NodeId, out.Generation = 0, 0
		out.Attr = fuse.Attr{}
		return fuse.OK
	}
	return st
}

package fs

import (
	"time"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// validator is what the kernel's page cache of a file was filled under:
// the file's mtime and size as the server reported them at open. Close-to-
// open consistency: an open whose fresh attributes match keeps the cache
// (FOPEN_KEEP_CACHE); any difference, or no validator, drops it.
type validator struct {
	mtime time.Time
	size  uint64
	ok    bool
}

func validatorOf(a session.Attr) validator {
	return validator{mtime: a.Mtime, size: a.Size, ok: true}
}

// freshNode records the validator of an empty file a CREATE returned on a
// node never opened before: the kernel can hold no pages of it and has
// the attributes from the reply, so unlike openFlags it drops nothing (a
// notification saved per created file). False otherwise: openFlags then
// decides.
func (n *Node) freshNode(a session.Attr) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cache.ok || a.Size != 0 {
		return false
	}
	n.cache = validatorOf(a)
	return true
}

// keepCache decides close-to-open: keep the kernel's cached pages only if
// the file is unchanged since they were cached.
func keepCache(cached validator, fresh session.Attr) bool {
	return cached.ok && cached.size == fresh.Size && cached.mtime.Equal(fresh.Mtime)
}

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

// keepCache decides close-to-open: keep the kernel's cached pages only if
// the file is unchanged since they were cached.
func keepCache(cached validator, fresh session.Attr) bool {
	return cached.ok && cached.size == fresh.Size && cached.mtime.Equal(fresh.Mtime)
}

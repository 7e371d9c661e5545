package cli

import (
	"fmt"
	"os"
	"syscall"
)

// CheckPrivate refuses a file that holds secrets — a password, or NT
// hashes, which are password equivalents — when users other than its
// owner may read or change it, or when it belongs to someone other than
// this process's user or root: the way ssh refuses a private key that is
// "too open". what says what the file holds; the message names the file
// and the fix.
func CheckPrivate(path, what string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	mode := st.Mode().Perm()
	if mode&0o066 != 0 {
		return fmt.Errorf("%s holds %s and is open to group or others (mode %04o): refusing it; run chmod 600 %s", path, what, mode, path)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		if euid := uint32(os.Geteuid()); sys.Uid != euid && sys.Uid != 0 {
			return fmt.Errorf("%s holds %s and belongs to uid %d, who can change it: refusing it; run chown %d %s", path, what, sys.Uid, euid, path)
		}
	}
	return nil
}

package ctl

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
)

// FSType is the file system type of an lwiofs mount in /proc/self/mountinfo.
const FSType = "fuse.lwio"

// Mount is an lwiofs mount as the kernel lists it.
type Mount struct {
	Point      string // the mount point
	Source     string // //HOST/SHARE
	Dev        string // MAJOR:MINOR, the st_dev of its files
	Owner      int    // the uid that mounted it (FUSE's user_id)
	AllowOther bool
}

// Socket is the path of the mount's control socket.
func (m Mount) Socket() string { return filepath.Join(Dir(m.Owner), SocketName(m.Dev)) }

// Mounts lists the lwiofs mounts of this process's mount namespace, from
// /proc/self/mountinfo: nothing is asked of the mounts themselves, so a
// hung or foreign mount does not hang or refuse the listing.
func Mounts() ([]Mount, error) {
	infos, err := procfs.GetMounts()
	if err != nil {
		return nil, fmt.Errorf("reading /proc/self/mountinfo: %w", err)
	}
	var out []Mount
	for _, mi := range infos {
		if mi.FSType != FSType {
			continue
		}
		_, ao := mi.SuperOptions["allow_other"]
		out = append(out, Mount{
			Point:      unescape(mi.MountPoint),
			Source:     unescape(mi.Source),
			Dev:        mi.MajorMinorVer,
			Owner:      Owner(mi.SuperOptions["user_id"]),
			AllowOther: ao,
		})
	}
	return out, nil
}

// Find returns the lwiofs mount at path (a mount point, as given or made
// absolute).
func Find(path string) (Mount, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return Mount{}, err
	}
	ms, err := Mounts()
	if err != nil {
		return Mount{}, err
	}
	var found *Mount
	for i := range ms {
		if ms[i].Point == abs {
			found = &ms[i] // the last one listed is the one on top
		}
	}
	if found == nil {
		return Mount{}, fmt.Errorf("%s is not an lwiofs mount point (no %s mount there in /proc/self/mountinfo)", abs, FSType)
	}
	return *found, nil
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash ("\040").
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

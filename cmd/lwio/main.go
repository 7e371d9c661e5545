// Command lwio is lwio-mount under the name mount.fuse3 runs for an fstab
// entry of type fuse.lwio:
//
//	//server/share  /mnt/share  fuse.lwio  credentials=/etc/lwio/cred,_netdev  0 0
//
// mount.fuse3 then calls `lwio //server/share /mnt/share -o OPTIONS`, and
// lwio returns once the share is mounted. See docs/usage.md.
package main

import (
	"os"

	"github.com/lwiofs/lwiofs/cmd/internal/cli"
	"github.com/lwiofs/lwiofs/cmd/internal/mountcmd"
)

func main() {
	cli.HandleVersion("lwio", os.Args[1:])
	mountcmd.Main("lwio")
}

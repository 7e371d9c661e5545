// Command lwio-mount mounts an LWIO share with FUSE:
//
//	lwio-mount //HOST[:PORT]/SHARE MOUNTPOINT [-o opts]
//	lwio-mount -providers
//
// See docs/usage.md.
package main

import (
	"os"

	"github.com/lwiofs/lwiofs/cmd/internal/cli"
	"github.com/lwiofs/lwiofs/cmd/internal/mountcmd"
)

func main() {
	cli.HandleVersion("lwio-mount", os.Args[1:])
	cli.TraceFromEnv("lwio-mount")
	mountcmd.Main("lwio-mount")
}

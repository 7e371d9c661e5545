// Command lwio-mount mounts an LWIO share with FUSE:
//
//	lwio-mount //HOST[:PORT]/SHARE MOUNTPOINT [-o opts]
//	lwio-mount -providers
//
// See docs/usage.md.
package main

import "github.com/lwiofs/lwiofs/cmd/internal/mountcmd"

func main() { mountcmd.Main("lwio-mount") }

// Command nullfs is the no-op FUSE baseline of `make bench`: go-fuse's
// loopback filesystem over a directory, with the settings lwio-mount uses
// (1 MiB requests, CAP_ASYNC_DIO, MaxBackground 64, 1s attribute and entry
// timeouts) and kernel FUSE passthrough disabled, so every read and write
// goes through this process. It is the ceiling for any userspace FUSE
// daemon on this machine (docs/bench.md, "What is measured").
//
//	nullfs [-debug] [-max-background N] DIR MOUNTPOINT
//
// It stays in the foreground until SIGINT/SIGTERM, then unmounts.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	debug := flag.Bool("debug", false, "log every FUSE request")
	bg := flag.Int("max-background", 64, "FUSE max_background")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: nullfs [flags] DIR MOUNTPOINT\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 2 {
		flag.Usage()
		os.Exit(2)
	}
	dir, mnt := flag.Arg(0), flag.Arg(1)
	root, err := gofs.NewLoopbackRoot(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nullfs: %v\n", err)
		os.Exit(1)
	}
	sec := time.Second
	var zero time.Duration
	opts := &gofs.Options{
		AttrTimeout:     &sec,
		EntryTimeout:    &sec,
		NegativeTimeout: &zero,
		NullPermissions: true,
		MountOptions: fuse.MountOptions{
			FsName:            dir,
			Name:              "nullfs",
			Debug:             *debug,
			MaxWrite:          1 << 20,
			MaxReadAhead:      1 << 20,
			MaxBackground:     *bg,
			ExtraCapabilities: fuse.CAP_ASYNC_DIO,
			// Passthrough would let the kernel read the backing file
			// itself: that measures the disk, not FUSE.
			DisabledCapabilities: fuse.CAP_PASSTHROUGH,
			DirectMount:          true,
		},
	}
	server, err := gofs.Mount(mnt, root, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nullfs: mount %s: %v\n", mnt, err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		if err := server.Unmount(); err != nil {
			fmt.Fprintf(os.Stderr, "nullfs: unmount: %v\n", err)
		}
	}()
	server.Wait()
}

package cli

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
)

// VersionFlags are the arguments that make every program print its
// version and exit (as the first argument; the man pages list them, and
// docs/man's test checks that every program under cmd/ handles them).
var VersionFlags = []string{"-version", "--version"}

// HandleVersion prints prog's version on stdout and exits 0 when the first
// argument is a version flag; otherwise it returns. Each main calls it
// first, so the flag works whatever else the program parses.
func HandleVersion(prog string, args []string) {
	if len(args) > 0 && slices.Contains(VersionFlags, args[0]) {
		bi, _ := debug.ReadBuildInfo()
		WriteVersion(os.Stdout, prog, bi)
		os.Exit(0)
	}
}

// WriteVersion writes one line: the program, the main module's version and
// the VCS revision, time and dirty flag the go command stamped into the
// build (make build passes -buildvcs), and the Go release:
//
//	lwio-server v0.0.0-20261101120000-c9f6938a1b2c+dirty (revision c9f6938a1b2c…, 2026-11-01T12:00:00Z, modified) go1.26.8 linux/amd64
//
// A build without that information (go run, go test, -buildvcs=false)
// says "(devel)" and "revision unknown" rather than guessing.
func WriteVersion(w io.Writer, prog string, bi *debug.BuildInfo) {
	version, rev, when, modified := "(devel)", "unknown", "", false
	if bi != nil {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	detail := "revision " + rev
	if when != "" {
		detail += ", " + when
	}
	if modified {
		detail += ", modified"
	}
	fmt.Fprintf(w, "%s %s (%s) %s %s/%s\n", prog, version, detail, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

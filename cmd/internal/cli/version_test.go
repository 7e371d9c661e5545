package cli

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestWriteVersion(t *testing.T) {
	stamped := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/lwiofs/lwiofs", Version: "v0.0.0-20261101120000-c9f6938a1b2c+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "-buildmode", Value: "exe"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "c9f6938a1b2c3d4e5f60718293a4b5c6d7e8f901"},
			{Key: "vcs.time", Value: "2026-11-01T12:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	clean := &debug.BuildInfo{
		Main:     debug.Module{Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "false"}},
	}
	tail := " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	for _, tc := range []struct {
		bi   *debug.BuildInfo
		want string
	}{
		{stamped, "lwio-server v0.0.0-20261101120000-c9f6938a1b2c+dirty (revision c9f6938a1b2c3d4e5f60718293a4b5c6d7e8f901, 2026-11-01T12:00:00Z, modified)" + tail},
		{clean, "lwio-server v1.2.3 (revision abc)" + tail},
		{&debug.BuildInfo{}, "lwio-server (devel) (revision unknown)" + tail},
		{nil, "lwio-server (devel) (revision unknown)" + tail},
	} {
		var b bytes.Buffer
		WriteVersion(&b, "lwio-server", tc.bi)
		if b.String() != tc.want {
			t.Errorf("WriteVersion:\n got %q\nwant %q", b.String(), tc.want)
		}
	}
}

// TestWriteVersionOwnBuild reads this test binary's own build info: go
// test stamps the module path but no VCS data, so the line must still be
// well formed rather than empty or panicking.
func TestWriteVersionOwnBuild(t *testing.T) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build info in a module-mode test binary")
	}
	var b bytes.Buffer
	WriteVersion(&b, "lwio", bi)
	if !strings.HasPrefix(b.String(), "lwio ") || !strings.Contains(b.String(), "(revision ") || strings.Count(b.String(), "\n") != 1 {
		t.Errorf("WriteVersion = %q", b.String())
	}
}

package verbs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartsWithoutLibraries proves that a binary built with verbs support
// starts on a host without rdma-core's runtime libraries and says so: it
// re-runs this test binary in a private mount namespace where
// libibverbs.so.1 is /dev/null, and the child checks Available's error.
func TestStartsWithoutLibraries(t *testing.T) {
	if os.Getenv("LWIOFS_VERBS_NOLIB") == "1" {
		err := New(Options{}).Available()
		if err == nil || !strings.Contains(err.Error(), "rdma-core runtime libraries not loadable") {
			t.Fatalf("with libibverbs hidden, Available = %v; want the libraries reported missing", err)
		}
		t.Logf("without libibverbs: %v", err)
		return
	}
	if !Built {
		t.Skip("SKIP: stub build; it never loads the libraries")
	}
	var lib string
	for _, dir := range []string{"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"} {
		if _, err := os.Stat(filepath.Join(dir, "libibverbs.so.1")); err == nil {
			lib = filepath.Join(dir, "libibverbs.so.1")
			break
		}
	}
	if lib == "" {
		t.Skipf("SKIP: libibverbs.so.1 is not installed, so this host is already the case (Available: %v)", New(Options{}).Available())
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIP: hiding libibverbs needs root (a private mount namespace)")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("SKIP: no unshare(1) to make a private mount namespace")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unshare, "-m", "--propagation", "private", "sh", "-c",
		`mount --bind /dev/null "$1" || exit 99; exec "$2" -test.run '^TestStartsWithoutLibraries$' -test.v`, "sh", lib, self)
	cmd.Env = append(os.Environ(), "LWIOFS_VERBS_NOLIB=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 99 {
		t.Skipf("SKIP: cannot bind-mount over %s here: %s", lib, out)
	}
	if err != nil {
		t.Fatalf("child with %s hidden: %v\n%s", lib, err, out)
	}
	if !strings.Contains(string(out), "without libibverbs: verbs: rdma-core runtime libraries not loadable") {
		t.Fatalf("child did not report the missing libraries:\n%s", out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "without libibverbs") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

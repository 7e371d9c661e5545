package dist

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// verify runs systemd-analyze verify on unit files (man pages not looked
// up: they are installed only by make install) and returns its output,
// which is empty for a clean unit: verify exits 0 on unknown keys and bad
// values, and only says so.
func verify(t *testing.T, units ...string) string {
	t.Helper()
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed (make test-install verifies the installed unit where it is)")
	}
	out, err := exec.Command(sa, append([]string{"verify", "--man=no"}, units...)...).CombinedOutput()
	if err != nil && len(out) == 0 {
		t.Fatalf("systemd-analyze verify: %v", err)
	}
	return string(out)
}

// renderUnit fills in the template as dist/install.sh does, with SBINDIR a
// directory holding an executable stand-in for lwio-server (verify checks
// that ExecStart is executable).
func renderUnit(t *testing.T, dir string, edit func(string) string) string {
	t.Helper()
	tmpl, err := os.ReadFile("lwio-server.service.in")
	if err != nil {
		t.Fatal(err)
	}
	sbin := filepath.Join(dir, "sbin")
	if err := os.MkdirAll(sbin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sbin, "lwio-server"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	unit := strings.NewReplacer("@SBINDIR@", sbin, "@SYSCONFDIR@", "/etc").Replace(string(tmpl))
	if placeholder.MatchString(unit) {
		t.Fatalf("template has a placeholder install.sh does not fill in:\n%s", unit)
	}
	path := filepath.Join(dir, "lwio-server.service")
	if err := os.WriteFile(path, []byte(edit(unit)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

var placeholder = regexp.MustCompile(`@[A-Z]+@`)

func TestServiceUnitVerifies(t *testing.T) {
	path := renderUnit(t, t.TempDir(), func(s string) string { return s })
	if out := verify(t, path); out != "" {
		t.Errorf("systemd-analyze verify lwio-server.service:\n%s", out)
	}
}

// TestServiceUnitVerifyCatches proves the check above can fail: the unit
// with a misspelt sandboxing key and a bad restart value must draw
// complaints.
func TestServiceUnitVerifyCatches(t *testing.T) {
	path := renderUnit(t, t.TempDir(), func(s string) string {
		s = strings.Replace(s, "\nProtectSystem=full", "\nProtectSystm=full", 1)
		return strings.Replace(s, "\nRestart=on-failure", "\nRestart=on-falure", 1)
	})
	out := verify(t, path)
	for _, want := range []string{"ProtectSystm", "on-falure"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify of a broken unit does not mention %q:\n%s", want, out)
		}
	}
}

// TestDocumentedMountUnitVerifies checks the systemd.mount example in
// lwio-mount(8): its name matches its Where= and it verifies.
func TestDocumentedMountUnitVerifies(t *testing.T) {
	f, err := os.Open("../docs/man/lwio-mount.8.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var name string
	var body strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if n, ok := strings.CutPrefix(line, "    # /etc/systemd/system/"); ok && strings.HasSuffix(n, ".mount") {
			name = n
			continue
		}
		if name == "" {
			continue
		}
		if line != "" && !strings.HasPrefix(line, "    ") {
			break
		}
		body.WriteString(strings.TrimPrefix(line, "    ") + "\n")
	}
	if name == "" || !strings.Contains(body.String(), "[Mount]") {
		t.Fatalf("lwio-mount.8.md has no mount unit example (a code block starting \"# /etc/systemd/system/NAME.mount\")")
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := verify(t, path); out != "" {
		t.Errorf("systemd-analyze verify of the documented %s:\n%s\n%s", name, out, body.String())
	}
}

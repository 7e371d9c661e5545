package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckPrivate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CheckPrivate(p, "a password"); err != nil {
		t.Errorf("0600: %v", err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604, 0o644, 0o620, 0o602} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		err := CheckPrivate(p, "a password")
		if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "chmod 600 "+p) {
			t.Errorf("mode %04o: %v, want a refusal naming the file and the fix", mode, err)
		}
	}
	if os.Geteuid() == 0 {
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 4321, 4321); err != nil {
			t.Fatal(err)
		}
		if err := CheckPrivate(p, "a password"); err == nil || !strings.Contains(err.Error(), "uid 4321") {
			t.Errorf("owned by another user: %v", err)
		}
	}
}

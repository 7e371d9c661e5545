package test

import (
	"testing"
)

// The reference tests run the suites where they must pass by definition —
// a plain local directory, and bench/nullfs (go-fuse's loopback through
// FUSE) — so that a failing check in the lwiofs tests is a finding about
// lwiofs, not about the check.

func TestReferencePlainDir(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: the reference runs only check the checks")
	}
	dir := t.TempDir()
	t.Run("POSIX", func(t *testing.T) { runPOSIXSuite(t, dir, dir) })
	t.Run("RandomModel", func(t *testing.T) { testRandomModel(t, dir, dir) })
	t.Run("DirectModel", func(t *testing.T) { testDirectModel(t, dir, dir) })
	t.Run("Tar", func(t *testing.T) { testTarDiff(t, dir) })
	t.Run("Git", func(t *testing.T) { testGit(t, dir) })
	t.Run("SQLite", func(t *testing.T) { testSQLite(t, dir) })
}

func TestReferenceNullFS(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: the reference runs only check the checks")
	}
	backing := t.TempDir()
	m := mountNullFS(t, backing)
	t.Run("POSIX", func(t *testing.T) { runPOSIXSuite(t, m.Dir, m.Backing) })
	t.Run("DirectModel", func(t *testing.T) { testDirectModel(t, m.Dir, m.Backing) })
	t.Run("FIOVerify", func(t *testing.T) {
		cs := fioCases()
		runFIOVerify(t, m.Dir, append(cs[:2:2], cs[len(cs)-1]))
	})
}

package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// sourceTree returns a real source tree to unpack: the Go standard
// library's net package (about 450 files, 5 MB, with nested directories
// and a few symlink-free testdata trees).
func sourceTree(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(goTool(), "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	src := filepath.Join(strings.TrimSpace(string(out)), "src", "net")
	if _, err := os.Stat(src); err != nil {
		t.Fatalf("source tree: %v", err)
	}
	return src
}

// testTarDiff unpacks a tarball of a real source tree with tar -x on the
// mount and compares the result with the original with diff -r.
func testTarDiff(t *testing.T, dir string) {
	needTool(t, "tar")
	needTool(t, "diff")
	src := sourceTree(t)
	tarball := filepath.Join(t.TempDir(), "src.tar")
	runCmd(t, filepath.Dir(src), nil, "tar", "-cf", tarball, filepath.Base(src))
	dst := filepath.Join(dir, "untar")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	runCmd(t, dst, nil, "tar", "-xf", tarball)
	runCmd(t, dir, nil, "diff", "-r", src, filepath.Join(dst, filepath.Base(src)))
	// tar -t of a tarball made from the mount lists the same members.
	again := filepath.Join(t.TempDir(), "again.tar")
	runCmd(t, dst, nil, "tar", "-cf", again, filepath.Base(src))
	a := runCmd(t, dir, nil, "tar", "-tf", tarball)
	b := runCmd(t, dir, nil, "tar", "-tf", again)
	if len(strings.Split(a, "\n")) != len(strings.Split(b, "\n")) {
		t.Errorf("tar of the unpacked tree lists %d members, the original %d",
			len(strings.Split(b, "\n")), len(strings.Split(a, "\n")))
	}
	runCmd(t, dir, nil, "rm", "-rf", dst)
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("after rm -rf: %v", err)
	}
}

// gitEnv keeps git away from the machine's and the user's configuration.
func gitEnv(t *testing.T) []string {
	home := t.TempDir()
	return []string{
		"HOME=" + home, "XDG_CONFIG_HOME=" + home, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=e2e", "GIT_AUTHOR_EMAIL=e2e@example.org",
		"GIT_COMMITTER_NAME=e2e", "GIT_COMMITTER_EMAIL=e2e@example.org",
	}
}

// testGit runs git init/add/commit/log/fsck on the mount.
func testGit(t *testing.T, dir string) {
	needTool(t, "git")
	env := gitEnv(t)
	repo := filepath.Join(dir, "repo")
	if err := os.Mkdir(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	runCmd(t, repo, env, "git", "init", "-q", "-b", "main")
	for i := 0; i < 3; i++ {
		for j := 0; j < 20; j++ {
			p := filepath.Join(repo, fmt.Sprintf("dir%d", j%4), fmt.Sprintf("file%d.txt", j))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			body := strings.Repeat(fmt.Sprintf("commit %d file %d\n", i, j), 50+j*10)
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		runCmd(t, repo, env, "git", "add", "-A")
		runCmd(t, repo, env, "git", "commit", "-q", "-m", fmt.Sprintf("commit %d", i))
	}
	log := runCmd(t, repo, env, "git", "log", "--format=%s")
	if got := strings.Fields(strings.ReplaceAll(log, "commit ", "")); strings.Join(got, ",") != "2,1,0" {
		t.Errorf("git log: %q", log)
	}
	runCmd(t, repo, env, "git", "fsck", "--full", "--strict")
	if st := runCmd(t, repo, env, "git", "status", "--porcelain"); strings.TrimSpace(st) != "" {
		t.Errorf("git status after commit is not clean:\n%s", st)
	}
	// gc rewrites objects into a pack and renames files over each other.
	runCmd(t, repo, env, "git", "gc", "-q")
	runCmd(t, repo, env, "git", "fsck", "--full")
	clone := filepath.Join(dir, "clone")
	runCmd(t, dir, env, "git", "clone", "-q", repo, clone)
	if out := runCmd(t, clone, env, "git", "log", "--oneline"); len(strings.Split(strings.TrimSpace(out), "\n")) != 3 {
		t.Errorf("clone's log: %q", out)
	}
}

// testSQLite creates, fills and queries a database on the mount.
func testSQLite(t *testing.T, dir string) {
	needTool(t, "sqlite3")
	db := filepath.Join(dir, "test.db")
	var sql strings.Builder
	sql.WriteString("PRAGMA journal_mode=DELETE;\nCREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT, n INTEGER);\nBEGIN;\n")
	for i := 0; i < 5000; i++ {
		fmt.Fprintf(&sql, "INSERT INTO kv VALUES(%d, '%s', %d);\n", i, strings.Repeat("v", i%200), i*3)
	}
	sql.WriteString("COMMIT;\nCREATE INDEX kv_n ON kv(n);\n")
	// Many small transactions: journal files created and deleted each time.
	for i := 0; i < 50; i++ {
		fmt.Fprintf(&sql, "UPDATE kv SET n = n + 1 WHERE k = %d;\n", i)
	}
	runSQL(t, dir, db, sql.String())
	out := runSQL(t, dir, db, "SELECT count(*), sum(n), sum(length(v)) FROM kv;\nPRAGMA integrity_check;\n")
	var want int
	for i := 0; i < 5000; i++ {
		want += i * 3
	}
	want += 50
	var wantLen int
	for i := 0; i < 5000; i++ {
		wantLen += i % 200
	}
	if exp := fmt.Sprintf("5000|%d|%d\nok\n", want, wantLen); out != exp {
		t.Fatalf("sqlite3 query: %q, want %q", out, exp)
	}
	// WAL mode uses shared memory mappings of a -shm file on the mount.
	runSQL(t, dir, db, "PRAGMA journal_mode=WAL;\nDELETE FROM kv WHERE k % 2 = 0;\n")
	if out := runSQL(t, dir, db, "SELECT count(*) FROM kv;\nPRAGMA integrity_check;\n"); out != "2500\nok\n" {
		t.Fatalf("sqlite3 after WAL delete: %q", out)
	}
	runSQL(t, dir, db, "PRAGMA wal_checkpoint(TRUNCATE);\nVACUUM;\n")
	if out := runSQL(t, dir, db, "SELECT count(*) FROM kv;\nPRAGMA integrity_check;\n"); out != "2500\nok\n" {
		t.Fatalf("sqlite3 after VACUUM: %q", out)
	}
}

func runSQL(t *testing.T, dir, db, sql string) string {
	t.Helper()
	return runSQLAs(t, nil, dir, db, sql)
}

// runSQLAs is runSQL run by local account u (nil: this test's root).
func runSQLAs(t *testing.T, u *localUser, dir, db, sql string) string {
	t.Helper()
	sdir := t.TempDir()
	if u != nil {
		sdir = testutil.PublicDir(t, "lwiofs-sql-")
	}
	script := filepath.Join(sdir, "script.sql")
	if err := os.WriteFile(script, []byte(sql), 0o644); err != nil {
		t.Fatal(err)
	}
	var out string
	if u == nil {
		out = runCmd(t, dir, nil, "sqlite3", "-bail", "-batch", db, ".read "+script)
	} else {
		out = mustShAs(t, u, dir, fmt.Sprintf("exec sqlite3 -bail -batch %q %q", db, ".read "+script))
	}
	// journal_mode pragmas echo the mode; drop those lines.
	var keep []string
	for _, l := range strings.SplitAfter(out, "\n") {
		if l == "delete\n" || l == "wal\n" || l == "0|0|0\n" || l == "" {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "")
}

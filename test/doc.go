// Package test holds lwiofs's end-to-end tests: the real lwio-server and
// lwio-mount binaries, built once per run by TestMain, a real server on a
// free loopback port exporting a t.TempDir() share, a real FUSE mount of it
// at a t.TempDir() mountpoint, and real tools (fio, tar, diff, git,
// sqlite3) on it. Every mount and server is stopped by t.Cleanup (SIGTERM,
// which must give a clean unmount and exit 0; a lazy unmount otherwise),
// and gets SIGTERM if the test binary dies first.
//
//	go test ./test/                          # all of it (root, /dev/fuse)
//	go test ./test/ -run 'TestPOSIX/polling'  # one suite in one mode
//	go test ./test/ -run TestPOSIX -v         # each named check
//	LWIOFS_POSIX_DIR=/mnt/x/d go test ./test/ -run TestPOSIXAt  # on a mount made elsewhere
//
// Files:
//
//   - harness_test.go: TestMain (builds the binaries), servers, mounts,
//     mountinfo, process handling.
//   - posix_test.go: the named POSIX suite (a map name → check) that every
//     configuration runs.
//   - integrity_test.go: random I/O against a model file, buffered and
//     O_DIRECT; fio --verify=crc32c over psync/io_uring, buffered/O_DIRECT,
//     sequential/random, and four concurrent writers.
//   - apps_test.go: tar -x + diff -r of a real source tree, git, sqlite3.
//   - lwio_test.go: the lwiofs configurations: the suites in interrupt and
//     polling completion mode, two mounts of one share (close-to-open),
//     read-only shares and mounts, a server crash and restart, and mounts
//     that must fail with one line (wrong password, unknown share,
//     unreachable server, non-empty mountpoint, mountpoint not a directory);
//     TestPOSIXAt, the suite on a mount made elsewhere ($LWIOFS_POSIX_DIR:
//     the verbs mount in the Soft-RoCE guest, test/vm/e2e-guest.sh).
//   - restart_test.go: why a restarted server is exec'ed in a spare process
//     started with the server (the test's own fork would wait, in execve,
//     for its files on the mount), and the check that it holds none.
//   - reference_test.go: the same checks on a plain directory and on
//     bench/nullfs (go-fuse loopback), where they must pass by definition.
//   - mutation_test.go: the data checks on a FUSE filesystem that flips a
//     bit per read (served by this test binary re-executed), where they
//     must fail.
//
// The tests skip, saying why, when /dev/fuse is missing, a tool is not
// installed, or the binaries' sources are not in the tree; they fail when
// the sources are there and do not build. -short skips the reference and
// mutation runs.
package test

#!/usr/bin/env bash
# run.sh — `make bench`: one exported directory, on a tmpfs and then (full
# mode) on disk, served through the export itself, the no-op FUSE
# passthrough (bench/nullfs), sshfs over 127.0.0.1 and lwiofs (softrdma;
# auto, interrupt and polling, plus any -lwio configuration); fio, cp and
# metadata jobs interleaved and repeated; the pieces of a 4 KiB read
# measured on their own (bench/latency, the engine benchmark). Results in
# results/ (results.md, bench.png, raw.json). BENCH_QUICK=1 for the CI size.
#
# Environment: BENCH_QUICK=1, BENCH_BIN (lwio binaries, default bin),
# BENCH_OUT (default results), BENCH_LABEL, BENCH_EXPORTS (tmpfs,disk),
# BENCH_LWIO (more lwio targets, e.g. "lwio-auto=completion=auto"),
# BENCH_LWIO_BIN_OLD (a directory of older binaries: its lwio targets too).
# Extra arguments go to bench/runner (e.g. -targets dir,nullfs -jobs meta).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/deps.sh bench
if [ "$(id -u)" != 0 ]; then
	echo "bench: run as root (drop_caches, a tmpfs export, FUSE mounts, a throwaway sshd)" >&2
	exit 1
fi
if [ -z "${BENCH_LABEL:-}" ] && [ -z "${BENCH_BIN:-}" ] && git rev-parse --git-dir >/dev/null 2>&1; then
	# make bench builds bin/ from the working tree: say which.
	BENCH_LABEL="binaries built from the working tree at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- cmd fs protocol transport smbauth || echo ' with uncommitted changes')"
	export BENCH_LABEL
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/runner" ./bench/runner
go build -o "$tmp/nullfs" ./bench/nullfs
go build -o "$tmp/latency" ./bench/latency
go test -c -o "$tmp/client.test" ./protocol/client
"$tmp/runner" -bin "${BENCH_BIN:-bin}" -nullfs "$tmp/nullfs" -latency "$tmp/latency" -engine "$tmp/client.test" \
	-out "${BENCH_OUT:-results}" "$@"

#!/usr/bin/env bash
# run.sh — `make bench`: fio and metadata jobs through the exported directory,
# the no-op FUSE passthrough (bench/nullfs), sshfs over 127.0.0.1 and lwiofs
# (softrdma; interrupt and polling), interleaved and repeated; results in
# results/ (results.md, bench.svg, raw.json). BENCH_QUICK=1 for the CI size.
# Extra arguments go to bench/runner (e.g. -targets dir,nullfs -jobs meta).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/deps.sh bench
if [ "$(id -u)" != 0 ]; then
	echo "bench: run as root (drop_caches, FUSE mounts, a throwaway sshd)" >&2
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
"$tmp/runner" -bin "${BENCH_BIN:-bin}" -nullfs "$tmp/nullfs" -out "${BENCH_OUT:-results}" "$@"

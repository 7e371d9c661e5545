#!/usr/bin/env bash
# meta.sh DIR TARBALL NFILES — the metadata job of `make bench`: create
# NFILES empty files, `ls -l` them cold and again warm, `tar -x` a real
# source tree, `ls -lR` it, `rm -rf` everything; caches are dropped before
# each step but the warm `ls -l` (when root). Prints one line:
# create_s=… ls_s=… ls_warm_s=… tar_s=… lsr_s=… rm_s=… (wall-clock seconds
# per step).
set -euo pipefail
dir=$1 tarball=$2 n=$3
work="$dir/meta.$$"
drop() { sync; [ -w /proc/sys/vm/drop_caches ] && echo 3 >/proc/sys/vm/drop_caches || true; }
now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b - a) / 1e9 }'; }
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/files" "$work/tar"
drop; t0=$(now)
# xargs: a few processes creating many files, so the filesystem is measured, not fork.
(cd "$work/files" && seq -f 'f%05g' 1 "$n" | xargs touch)
t1=$(now); create=$(secs "$t0" "$t1")
drop; t0=$(now)
ls -l "$work/files" >/dev/null
t1=$(now); ls=$(secs "$t0" "$t1")
# Warm: what a client's attribute and entry caches (or leases) save.
t0=$(now)
ls -l "$work/files" >/dev/null
t1=$(now); lswarm=$(secs "$t0" "$t1")
drop; t0=$(now)
tar -xf "$tarball" -C "$work/tar"
t1=$(now); tarx=$(secs "$t0" "$t1")
drop; t0=$(now)
ls -lR "$work/tar" >/dev/null
t1=$(now); lsr=$(secs "$t0" "$t1")
drop; t0=$(now)
rm -rf "$work"
t1=$(now); rm=$(secs "$t0" "$t1")
echo "create_s=$create ls_s=$ls ls_warm_s=$lswarm tar_s=$tarx lsr_s=$lsr rm_s=$rm"

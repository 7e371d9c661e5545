#!/usr/bin/env bash
# profile.sh [JOB] [DIRECT] — where lwiofs spends its CPU during one fio job:
# starts lwio-server and lwio-mount (softrdma, COMPLETION=interrupt|polling),
# runs bench/fio/JOB.fio (default randread-qd1, O_DIRECT unless DIRECT=0) on
# the mount while `perf record -g` samples both processes, and writes the
# hottest symbols per process to results/profile-JOB-MODE.txt. JOB=meta
# profiles the metadata job (bench/meta.sh) instead. The export is a tmpfs, as
# in `make bench`'s first table; EXPORT=disk puts it on /var/tmp instead.
#   BENCH_BIN=bin BENCH_OUT=results SECONDS_=5 bench/profile.sh seqread-qd1 1
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
job=${1:-randread-qd1} direct=${2:-1} mode=${COMPLETION:-interrupt}
bin=${BENCH_BIN:-bin} out=${BENCH_OUT:-results} secs=${SECONDS_:-5}
command -v perf >/dev/null || { echo "profile: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
work=$(mktemp -d /var/tmp/lwiofs-prof-XXXXXX)
server_pid= mount_pid=
cleanup() {
	[ -n "$mount_pid" ] && kill -TERM "$mount_pid" 2>/dev/null && wait "$mount_pid" 2>/dev/null || true
	grep -q " $work/mnt " /proc/self/mountinfo && umount -l "$work/mnt" || true
	[ -n "$server_pid" ] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
	grep -q " $work/export " /proc/self/mountinfo && umount -l "$work/export" || true
	rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/export" "$work/mnt" "$out"
[ "${EXPORT:-tmpfs}" = tmpfs ] && mount -t tmpfs -o mode=0755 lwiofs-prof "$work/export"
port=$((20000 + RANDOM % 20000))
export LWIO_PASSWORD=profile-password
start_server bench bench "$work/server.log"
"$bin/lwio-mount" //127.0.0.1:$port/bench "$work/mnt" -o username=bench,completion="$mode" >"$work/mount.log" 2>&1 &
mount_pid=$!
for _ in $(seq 100); do grep -q " $work/mnt " /proc/self/mountinfo && break; sleep 0.1; done
grep -q " $work/mnt " /proc/self/mountinfo || { cat "$work/server.log" "$work/mount.log" >&2; exit 1; }
fio --name=layout --directory="$work/export" --filename=bench.dat --size=256m --rw=write --bs=1m \
	--direct=1 --output-format=terse >/dev/null
sync; echo 3 >/proc/sys/vm/drop_caches
if [ "$job" = meta ]; then
	# The metadata job in a loop: creates, ls -l, tar -x, rm -rf.
	tar -cf "$work/tree.tar" -C "$(go env GOROOT 2>/dev/null || echo /usr/local/go)/src" net
	(end=$((SECONDS + secs + 2)); while [ $SECONDS -lt $end ]; do bench/meta.sh "$work/mnt" "$work/tree.tar" 2000 >/dev/null; done) &
else
	# Time-based here, whatever the job file says: a one-pass sequential job
	# would end before perf has sampled anything.
	{ cat "bench/fio/$job.fio"; echo "time_based=1"; } >"$work/job.fio"
	BENCH_DIR="$work/mnt" BENCH_SIZE=256m BENCH_RUNTIME=$((secs + 2)) BENCH_DIRECT=$direct \
		fio --output-format=json --output="$work/fio.json" "$work/job.fio" &
fi
fio_pid=$!
# Context switches of every thread of a process (voluntary + involuntary).
ctxsw() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { n += $2 } END { print n + 0 }'; }
sleep 1
cs_m0=$(ctxsw "$mount_pid") cs_s0=$(ctxsw "$server_pid")
perf record -q -F 499 -g -p "$server_pid,$mount_pid" -o "$work/perf.data" -- sleep "$secs" 2>/dev/null
cs_m1=$(ctxsw "$mount_pid") cs_s1=$(ctxsw "$server_pid")
wait "$fio_pid"
report="$out/profile-$job-$mode.txt"
{
	echo "# perf profile of lwio-mount and lwio-server, $job direct=$direct completion=$mode, ${secs}s at 499 Hz"
	echo "# $(jq -r '.jobs[0] | "read \(.read.iops|floor) IOPS \(.read.bw_bytes/1048576|floor) MiB/s, write \(.write.iops|floor) IOPS \(.write.bw_bytes/1048576|floor) MiB/s"' "$work/fio.json" 2>/dev/null)"
	if [ -s "$work/fio.json" ]; then
		ios=$(jq '.jobs[0] | (.read.iops + .write.iops)' "$work/fio.json")
		awk -v m=$((cs_m1 - cs_m0)) -v s=$((cs_s1 - cs_s0)) -v ios="$ios" -v t="$secs" 'BEGIN {
			printf "# context switches per I/O (over the %ss sampled): lwio-mount %.1f, lwio-server %.1f\n", t, m / (ios * t), s / (ios * t) }'
	fi
	echo; echo "## Inclusive time of lwiofs and go-fuse functions (children included)"
	perf report -i "$work/perf.data" --children --sort comm,symbol --stdio -g none 2>&1 \
		| grep -E 'lwiofs|go-fuse' | head -40 || true
	echo; echo "## Hottest symbols by self time (percent of all samples of both processes)"
	perf report -i "$work/perf.data" --no-children --sort comm,dso,symbol --stdio -g none 2>&1 \
		| grep -v '^#' | grep -v '^$' | head -60 || true
} >"$report"
echo "profile: wrote $report"

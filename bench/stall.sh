#!/usr/bin/env bash
# stall.sh [RUNS] — back-to-back fio runs on one lwiofs mount, each under a
# watchdog, to show the data path never hangs (issue 16: "no stall in 200
# back-to-back fio runs"). Run i cycles through every combination of
# O_DIRECT or buffered, psync / io_uring / libaio, and read, write,
# randread, randwrite, randrw at 4 KiB, 64 KiB and 1 MiB blocks; writes
# verify what they wrote (crc32c) where fio can. The mount alternates
# completion modes: interrupt for the first half, polling for the second.
#
# A run that outlives its watchdog (WATCHDOG, default 60 s, for a job of
# 2 s) is a stall: lwio-mount and lwio-server are sent SIGQUIT (the Go
# runtime prints every goroutine into their logs), fio's kernel stacks are
# printed, everything is kept under $out, and the script goes on with a
# fresh mount. It ends with one line, e.g.
#   stall: 200 runs (100 interrupt, 100 polling): 0 stalls, 0 failed
# and exits 1 if any run stalled or failed.
#
# SECOND=MODE adds a second mount of the same server (completion=MODE:
# auto, interrupt or polling) writing all along: 1 MiB O_DIRECT io_uring
# writes at queue depth 16, 5 s fio runs back to back, each under the same
# watchdog, so the server's memory budget takes credits back from one
# mount and grants them to the other while the runs go on (make bench's
# hang of 40f0bd7 was on a server serving other mounts). Its runs' stalls
# and failures count too, and the last line adds
#   …; second mount (polling): 41 runs, 0 stalls, 0 failed
#
#   BENCH_BIN=bin RUNS=200 WATCHDOG=60 SECOND=polling bench/stall.sh
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
runs=${1:-${RUNS:-200}} bin=${BENCH_BIN:-bin} watchdog=${WATCHDOG:-60} second=${SECOND:-}
case $second in '' | auto | interrupt | polling) ;; *) echo "stall: SECOND=$second: want auto, interrupt or polling" >&2; exit 1 ;; esac
[ "$(id -u)" = 0 ] || { echo "stall: run as root (a tmpfs export, FUSE mounts, drop_caches)" >&2; exit 1; }
command -v fio >/dev/null || { echo "stall: fio is not installed" >&2; exit 1; }
work=$(mktemp -d /var/tmp/lwiofs-stall-XXXXXX)
out=${STALL_OUT:-$work/out}
mkdir -p "$work/export" "$work/mnt" "$work/mnt2" "$out"
server_pid= mount_pid= second_pid= second_loop=
stop_mount() {
	[ -n "$mount_pid" ] && kill -TERM "$mount_pid" 2>/dev/null && wait "$mount_pid" 2>/dev/null
	grep -q " $work/mnt " /proc/self/mountinfo && umount -l "$work/mnt"
	mount_pid=
}
# The second mount and its writer loop (SECOND): each fio run's exit
# status goes to second.rc.
start_second() {
	[ -n "$second" ] || return 0
	"$bin/lwio-mount" //127.0.0.1:$port/s "$work/mnt2" -o "username=stall,completion=$second" >>"$out/mount2-$second.log" 2>&1 &
	second_pid=$!
	for _ in $(seq 100); do grep -q " $work/mnt2 " /proc/self/mountinfo && break; sleep 0.1; done
	(
		f=
		trap '[ -n "$f" ] && kill -TERM "$f" 2>/dev/null; exit 0' TERM
		for ((n = 0; ; n++)); do
			timeout -k 5 "$watchdog" fio --name=second --directory="$work/mnt2" --filename=g --size=64m \
				--rw=write --bs=1m --ioengine=io_uring --iodepth=16 --direct=1 --time_based --runtime=5 \
				--output="$out/second-$n.txt" >/dev/null 2>&1 &
			f=$!
			wait "$f"
			echo "$n $?" >>"$out/second.rc"
			f=
		done
	) &
	second_loop=$!
}
stop_second() {
	[ -n "$second_loop" ] && kill -TERM "$second_loop" 2>/dev/null && wait "$second_loop" 2>/dev/null
	[ -n "$second_pid" ] && kill -TERM "$second_pid" 2>/dev/null && wait "$second_pid" 2>/dev/null
	grep -q " $work/mnt2 " /proc/self/mountinfo && umount -l "$work/mnt2"
	second_loop= second_pid=
}
cleanup() {
	stop_mount
	stop_second
	[ -n "$server_pid" ] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
	grep -q " $work/export " /proc/self/mountinfo && umount -l "$work/export"
	[ "$keep" = 1 ] || rm -rf "$work"
}
keep=0
trap cleanup EXIT
mount -t tmpfs -o mode=0755 lwiofs-stall "$work/export"
port=$((20000 + RANDOM % 20000))
export LWIO_PASSWORD=stall-password
: >"$out/server.log"
start_server s stall "$out/server.log"
start_mount() {
	"$bin/lwio-mount" //127.0.0.1:$port/s "$work/mnt" -o "username=stall,completion=$1" >>"$out/mount-$1.log" 2>&1 &
	mount_pid=$!
	for _ in $(seq 100); do grep -q " $work/mnt " /proc/self/mountinfo && return 0; sleep 0.1; done
	echo "stall: lwio-mount did not mount" >&2
	cat "$out/mount-$1.log" >&2
	exit 1
}
start_second
directs=(1 0)
engines=(psync io_uring libaio)
rws=(read write randread randwrite randrw)
bss=(4k 64k 1m)
stalls=0 failed=0 n_int=0 n_poll=0 mode=
for ((i = 0; i < runs; i++)); do
	want=interrupt
	[ $((2 * i)) -ge "$runs" ] && want=polling
	if [ "$want" != "$mode" ]; then
		stop_mount
		mode=$want
		start_mount "$mode"
	fi
	direct=${directs[i % 2]} engine=${engines[i / 2 % 3]} rw=${rws[i / 6 % 5]} bs=${bss[i / 30 % 3]}
	depth=16
	[ "$engine" = psync ] && depth=1
	verify=
	case $rw in write | randwrite) verify="--verify=crc32c --do_verify=1 --verify_state_save=0" ;; esac
	name="run $i: $mode direct=$direct $engine qd$depth $rw bs=$bs"
	# libaio is only asynchronous with O_DIRECT; buffered it still runs.
	timeout -k 5 "$watchdog" fio --name=stall --directory="$work/mnt" --filename=f$((i % 4)) --size=64m \
		--rw="$rw" --bs="$bs" --ioengine="$engine" --iodepth="$depth" --direct="$direct" \
		--time_based --runtime=2 $verify --output="$out/fio-$i.txt" >/dev/null 2>&1 &
	fio_pid=$!
	wait "$fio_pid"
	rc=$?
	case $mode in interrupt) n_int=$((n_int + 1)) ;; *) n_poll=$((n_poll + 1)) ;; esac
	if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
		stalls=$((stalls + 1)) keep=1
		echo "stall: STALL in $name (no end within ${watchdog}s); goroutines in $out/*.log" >&2
		for p in $(pgrep -x fio); do echo "== fio $p"; cat /proc/"$p"/stack 2>/dev/null; done >"$out/stall-$i-fio-stacks.txt"
		[ -n "$second_loop" ] && kill -TERM "$second_loop" 2>/dev/null && wait "$second_loop" 2>/dev/null
		kill -QUIT "$mount_pid" "$server_pid" $second_pid 2>/dev/null
		sleep 1
		# SIGQUIT ended them: a fresh server and mounts for the rest.
		mount_pid= server_pid= second_pid= second_loop=
		grep -q " $work/mnt " /proc/self/mountinfo && umount -l "$work/mnt"
		grep -q " $work/mnt2 " /proc/self/mountinfo && umount -l "$work/mnt2"
		start_server s stall "$out/server.log"
		start_mount "$mode"
		start_second
	elif [ "$rc" != 0 ]; then
		failed=$((failed + 1)) keep=1
		echo "stall: FAILED $name (fio exit $rc): $(grep -m1 -i 'err' "$out/fio-$i.txt")" >&2
	fi
done
also=
if [ -n "$second" ]; then
	stop_second
	s_runs=0 s_stalls=0 s_failed=0
	if [ -f "$out/second.rc" ]; then
		# A run cut short by stop_second (exit 143) is neither.
		read -r s_runs s_stalls s_failed < <(awk '$2 != 143 { r++ } $2 == 124 || $2 == 137 { s++ }
			$2 != 0 && $2 != 124 && $2 != 137 && $2 != 143 { f++ } END { print r + 0, s + 0, f + 0 }' "$out/second.rc")
	fi
	[ "$s_stalls" = 0 ] && [ "$s_failed" = 0 ] || keep=1
	stalls=$((stalls + s_stalls)) failed=$((failed + s_failed))
	also="; second mount ($second): $s_runs runs, $s_stalls stalls, $s_failed failed"
fi
kept=
[ "$keep" = 1 ] && kept=" (logs kept in $out)"
echo "stall: $runs runs ($n_int interrupt, $n_poll polling): $stalls stalls, $failed failed$also$kept"
[ "$stalls" = 0 ] && [ "$failed" = 0 ]

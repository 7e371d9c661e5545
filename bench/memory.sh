#!/usr/bin/env bash
# memory.sh [MOUNTS] — lwio-server's resident memory as mounts arrive and
# write (issue 20: "8 mounts each writing 1 MiB blocks at queue depth 16,
# lwio-server's resident growth at most 8 MiB per mount"). One server on a
# tmpfs export with its default limits (max_buffer_memory 32 MiB); MOUNTS
# mounts (default 8) added one by one, each running fio (O_DIRECT, libaio,
# 1 MiB blocks, queue depth 16, 4 s) and staying mounted; then all of them
# write at once. VmRSS of lwio-server is read after startup, after each
# mount's run and after the run of all; it prints one line per step and
#   memory: 8 mounts: lwio-server RSS 21.3 → 98.1 MiB, 9.6 MiB per mount
# A figure, not a pass/fail test (the machine's load moves it); it exits 1
# only if something failed. Run under the bench lock:
#   flock /tmp/lwiofs-bench.lock bench/memory.sh
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
mounts=${1:-${MOUNTS:-8}} bin=${BENCH_BIN:-bin}
[ "$(id -u)" = 0 ] || { echo "memory: run as root (a tmpfs export, FUSE mounts)" >&2; exit 1; }
command -v fio >/dev/null || { echo "memory: fio is not installed" >&2; exit 1; }
work=$(mktemp -d /var/tmp/lwiofs-memory-XXXXXX)
mkdir -p "$work/export" "$work/out"
server_pid= pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	for ((i = 0; i < mounts; i++)); do grep -q " $work/m$i " /proc/self/mountinfo && umount -l "$work/m$i"; done
	[ -n "$server_pid" ] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
	grep -q " $work/export " /proc/self/mountinfo && umount -l "$work/export"
	if [ "$failed" = 1 ]; then
		rm -rf /tmp/lwiofs-memory-out && cp -r "$work/out" /tmp/lwiofs-memory-out
		echo "memory: logs kept in /tmp/lwiofs-memory-out" >&2
	fi
	rm -rf "$work"
}
failed=0
trap cleanup EXIT
mount -t tmpfs -o mode=0755,size=3g lwiofs-memory "$work/export"
port=$((20000 + RANDOM % 20000))
export LWIO_PASSWORD=memory-password
start_server s memory "$work/out/server.log" -metrics 127.0.0.1:$((port + 2))
rss() { awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$server_pid/status"; }
# metrics: what the server's /metrics says its memory is (MiB): receive
# buffers registered, credits granted of the budget, Go heap in use.
metrics() {
	curl -s "http://127.0.0.1:$((port + 2))/metrics" | awk '
		/^lwio_recv_buffer_bytes / { rb = $2 } /^lwio_credits_granted / { g = $2 } /^lwio_credit_budget / { b = $2 }
		/^go_memstats_heap_inuse_bytes / { h = $2 } /^go_memstats_heap_sys_bytes / { hs = $2 }
		END { printf "receive buffers %.1f MiB, %d of %d credits granted, Go heap in use %.1f MiB (of %.1f from the OS)", rb / 1048576, g, b, h / 1048576, hs / 1048576 }'
}
write() { # write DIR NAME: 1 MiB O_DIRECT writes at queue depth 16
	fio --name="$2" --directory="$1" --filename="$2" --size=256m --rw=write --bs=1m \
		--ioengine=libaio --iodepth=16 --direct=1 --time_based --runtime=4 \
		--output="$work/out/fio-$2.txt" >"$work/out/fio-$2.err" 2>&1
}
base=$(rss)
echo "memory: lwio-server started: RSS $base MiB"
failed=0
for ((i = 0; i < mounts; i++)); do
	mkdir -p "$work/m$i"
	"$bin/lwio-mount" //127.0.0.1:$port/s "$work/m$i" -o username=memory >"$work/out/mount-$i.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 100); do grep -q " $work/m$i " /proc/self/mountinfo && break; sleep 0.1; done
	write "$work/m$i" "f$i" || { echo "memory: fio on mount $i failed" >&2; failed=1; }
	echo "memory: mount $((i + 1)) wrote: RSS $(rss) MiB ($(grep -o 'bw=[^ ]*' "$work/out/fio-f$i.txt" | head -1)); $(metrics)"
done
fios=()
for ((i = 0; i < mounts; i++)); do
	write "$work/m$i" "f$i" & # the same files: the export is a tmpfs
	fios+=($!)
done
for ((i = 0; i < mounts; i++)); do
	wait "${fios[i]}" || { echo "memory: fio on mount $i (with the others) failed: $(tail -3 "$work/out/fio-f$i.err")" >&2; failed=1; }
done
all=$(rss)
echo "memory: all $mounts mounts wrote at once: RSS $all MiB; $(metrics)"
sleep 3
echo "memory: 3 s later (idle connections give credits back): RSS $(rss) MiB; $(metrics)"
echo "memory: $mounts mounts: lwio-server RSS $base → $all MiB, $(awk -v a="$all" -v b="$base" -v n="$mounts" 'BEGIN { printf "%.1f", (a - b) / n }') MiB per mount"
exit $failed

#!/usr/bin/env bash
# run.sh is `make run`: build if needed, serve a demo share on 127.0.0.1
# over the software RDMA provider, mount it, and stay in the foreground
# until Ctrl-C (or SIGTERM); then unmount cleanly and stop the server.
#
#   LWIO_DEMO_DIR   where the demo share and mountpoint go (/tmp/lwiofs-demo)
#   LWIO_PORT       session port (4450); softrdma listens on LWIO_PORT+1
#   LWIO_MOUNT_OPTS extra -o options for lwio-mount (e.g. completion=polling)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
export PATH=$PATH:/usr/local/go/bin
bin=$root/bin
demo=${LWIO_DEMO_DIR:-/tmp/lwiofs-demo}
port=${LWIO_PORT:-4450}
soft=$((port + 1))
share=$demo/share
mnt=$demo/mnt
user=demo
export LWIO_PASSWORD=${LWIO_PASSWORD:-demo-password}

# Build when a binary is missing or older than a Go source file.
need_build=0
for b in lwio-server lwio-mount; do
	if [ ! -x "$bin/$b" ] || [ -n "$(find "$root" -name '*.go' -newer "$bin/$b" -print -quit)" ]; then
		need_build=1
	fi
done
if [ $need_build = 1 ]; then
	echo "run.sh: building" >&2
	(cd "$root" && go build -o "$bin/" ./cmd/...)
fi

if [ "$(id -u)" != 0 ] && ! command -v fusermount3 >/dev/null; then
	echo "run.sh: not root and no fusermount3: cannot mount (install fuse3 or run as root)" >&2
	exit 1
fi

# A mount left over from an earlier run that was killed hard.
if grep -qs " $mnt fuse" /proc/mounts; then
	umount "$mnt" 2>/dev/null || umount -l "$mnt"
fi
mkdir -p "$share" "$mnt"
if [ -z "$(ls -A "$share")" ]; then
	cat >"$share/README.txt" <<'TXT'
This file lives in the demo share and was read through lwio-mount:
namespace operations over the session channel, data over LWIO on the
software RDMA provider (softrdma).
TXT
	mkdir -p "$share/docs"
	cp "$root/docs/"*.md "$share/docs/" 2>/dev/null || true
	head -c 4194304 /dev/urandom >"$share/random-4MiB.bin"
fi

server_pid= mount_pid= interrupted=
# stop ends one of our programs. After Ctrl-C the terminal sent SIGINT to
# the whole process group, so the program is already stopping: it gets
# up to 3 s to finish on its own, since a SIGTERM now would be its second
# signal, which means "exit at once".
stop() {
	local pid=$1
	[ -n "$pid" ] || return 0
	if [ -n "$interrupted" ]; then
		for _ in $(seq 30); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
	fi
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}
cleanup() {
	trap - INT TERM EXIT
	stop "$mount_pid"
	if grep -qs " $mnt fuse" /proc/mounts; then
		umount "$mnt" 2>/dev/null || umount -l "$mnt" || true
	fi
	stop "$server_pid"
	echo "run.sh: unmounted $mnt and stopped the server" >&2
}
trap cleanup EXIT
trap 'interrupted=1; exit 0' INT
trap 'exit 0' TERM

# The demo user acts as root on the demo share (-account root -allow-root);
# a real server maps each user to its own Unix account (docs/security.md).
"$bin/lwio-server" -share "demo=$share" -listen "127.0.0.1:$port" -soft "127.0.0.1:$soft" -user "$user" \
	-account root -allow-root &
server_pid=$!
for _ in $(seq 100); do
	(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
	kill -0 "$server_pid" 2>/dev/null || { echo "run.sh: lwio-server exited" >&2; exit 1; }
	sleep 0.1
done

opts="username=$user,fg${LWIO_MOUNT_OPTS:+,$LWIO_MOUNT_OPTS}"
"$bin/lwio-mount" "//127.0.0.1:$port/demo" "$mnt" -o "$opts" &
mount_pid=$!
for _ in $(seq 100); do
	grep -qs " $mnt fuse" /proc/mounts && break
	kill -0 "$mount_pid" 2>/dev/null || { echo "run.sh: lwio-mount exited" >&2; exit 1; }
	sleep 0.1
done

cat >&2 <<MSG

  lwiofs demo: share $share
               mounted at $mnt  (//127.0.0.1:$port/demo, user $user, softrdma on 127.0.0.1:$soft)

  try:  ls -l $mnt && cat $mnt/README.txt
        dd if=/dev/zero of=$mnt/zeros bs=1M count=64 oflag=direct
  Ctrl-C to unmount and stop the server.

MSG
# Foreground until Ctrl-C, or until either process ends on its own.
wait -n "$server_pid" "$mount_pid" || true

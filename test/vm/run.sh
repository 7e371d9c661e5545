#!/usr/bin/env bash
# run.sh boots a Debian bookworm guest under qemu (TCG), sets up Soft-RoCE
# (rdma_rxe on a dummy netdev) and runs test binaries inside it.
#
#   test/vm/run.sh [-t SECONDS] [-o OUTDIR] [-f FILE]... BINARY... [-- ARGS...]
#
# Each BINARY is copied into a 9p share and run in the guest, in order, with
# ARGS; its output is printed (and kept in OUTDIR/NAME.log). Each -f FILE is
# copied into the share too but not run: a program a BINARY starts (the
# guest sees the share at $LWIOFS_VM_SHARE, /mnt/share; whatever a BINARY
# writes under $LWIOFS_VM_SHARE/out ends up in OUTDIR). run.sh exits 0
# only if every binary exited 0 inside the guest; 3 if the guest never
# reported (boot failure, timeout), 2 on usage errors.
#
# The guest image is built once with mmdebstrap and cached under
# $LWIOFS_VM_CACHE (default /var/cache/lwiofs-vm, else test/vm/cache),
# keyed by a hash of everything it is built from (package list, apt sources,
# the guest init, this builder's version); a change rebuilds it. The disk is
# attached with snapshot=on, so runs never modify the cached image.
#
# In the guest: modprobe rdma_rxe rdma_ucm; dummy netdev dum0 with
# $LWIOFS_VM_IP (10.77.0.1/24); rdma link add rxe0 type rxe netdev dum0.
# Binaries see LWIOFS_VERBS_ADDR=<that ip>, LWIOFS_VM=1 and
# LWIOFS_VM_SHARE=/mnt/share in their environment.
#
# Environment knobs (all optional):
#   LWIOFS_VM_CACHE    cache directory
#   LWIOFS_VM_MIRROR   apt sources (file, deb822 or one-line) for mmdebstrap;
#                      default: the Debian entries of /etc/apt/sources.list.d
#   LWIOFS_VM_SMP      guest CPUs (default 2, the most the rig should take)
#   LWIOFS_VM_MEM      guest memory in MiB (default 2048)
#   LWIOFS_VM_ACCEL    qemu -accel value (default tcg,thread=multi; KVM
#                      aborts on the machines this was written on)
#   LWIOFS_VM_BUILD_TIMEOUT  seconds allowed for the image build (default 900)
#   LWIOFS_VM_KEEP     1 keeps the work directory (console log, share)
#
# qemu never outlives this script: it runs under timeout(1), and an EXIT
# trap kills it by pid.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
timeout_s=600
outdir=
bins=()
files=()
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	-t) timeout_s=$2; shift 2 ;;
	-o) outdir=$2; shift 2 ;;
	-f) files+=("$2"); shift 2 ;;
	--) shift; args=("$@"); break ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	-*) echo "run.sh: unknown flag $1" >&2; exit 2 ;;
	*) bins+=("$1"); shift ;;
	esac
done
[ ${#bins[@]} -gt 0 ] || { echo "run.sh: no test binaries given (see -h)" >&2; exit 2; }
for b in "${bins[@]}"; do
	[ -x "$b" ] || { echo "run.sh: $b is not an executable file" >&2; exit 2; }
done
for f in "${files[@]+"${files[@]}"}"; do
	[ -f "$f" ] || { echo "run.sh: -f $f is not a file" >&2; exit 2; }
done

log() { echo "vm: $*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

for tool in qemu-system-x86_64 mmdebstrap mke2fs; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool missing; run scripts/deps.sh vm" >&2; exit 2; }
done

# ---------------------------------------------------------------- image ----

# The guest's packages: the kernel, Soft-RoCE and rdma-core for the rig,
# then what the end-to-end phase runs on the mount (e2e-guest.sh: FUSE,
# fio; tar and diff are in every Debian system). The list is part of the
# image's cache key: adding a package rebuilds the image.
packages=linux-image-amd64,initramfs-tools,kmod,iproute2,procps,rdma-core,ibverbs-utils,rdmacm-utils,ibverbs-providers,libibverbs1,librdmacm1
packages+=,fuse3,fio
guest_ip=${LWIOFS_VM_IP:-10.77.0.1}

# The in-image init: mount what a test needs and hand over to the per-run
# script on the share. Kept tiny so it rarely changes the image hash.
read -r -d '' image_init <<'EOF' || true
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /tmp /run /mnt/share
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
modprobe 9pnet_virtio 2>/dev/null; modprobe 9p 2>/dev/null
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /mnt/share; then
	/bin/bash /mnt/share/guest.sh
else
	echo "lwio-init: cannot mount the 9p share"
fi
echo o >/proc/sysrq-trigger
sleep 30
EOF

sources() {
	if [ -n "${LWIOFS_VM_MIRROR:-}" ]; then cat "$LWIOFS_VM_MIRROR"; return; fi
	# deb822 stanzas and one-line entries of Debian bookworm archives only:
	# other (third-party) sources are not reachable from every machine.
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk 'BEGIN{RS=""; ORS="\n\n"} /Types:[^\n]*deb/ && /URIs:[^\n]*debian/ && /Suites:[^\n]*bookworm/' "$f"
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		grep -E '^deb .*debian.* bookworm' "$f" || true
	done
}
srcs=$(sources)
[ -n "$srcs" ] || { echo "run.sh: no Debian bookworm apt sources found (set LWIOFS_VM_MIRROR)" >&2; exit 2; }

builder_version=1
key=$(printf '%s\n' "$builder_version" "$packages" "$srcs" "$image_init" | sha256sum | cut -c1-16)

cache=${LWIOFS_VM_CACHE:-}
if [ -z "$cache" ]; then
	if mkdir -p /var/cache/lwiofs-vm 2>/dev/null && [ -w /var/cache/lwiofs-vm ]; then
		cache=/var/cache/lwiofs-vm
	else
		cache=$here/cache
	fi
fi
mkdir -p "$cache"
img=$cache/$key/rootfs.ext4
kernel=$cache/$key/vmlinuz
initrd=$cache/$key/initrd.img

build_image() {
	local dir=$cache/$key tmp
	tmp=$(mktemp -d "$cache/build.XXXXXX")
	# shellcheck disable=SC2064
	trap "rm -rf '$tmp'" RETURN
	log "building guest image $key (mmdebstrap bookworm minbase; ~90 s and ~700 MB)"
	local t0 mode=root; t0=$(now)
	[ "$(id -u)" = 0 ] || mode=unshare
	printf '%s\n' "$srcs" | timeout "${LWIOFS_VM_BUILD_TIMEOUT:-900}" mmdebstrap \
		--variant=minbase --mode="$mode" --include="$packages" \
		--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		bookworm "$tmp/root" - >"$tmp/mmdebstrap.log" 2>&1 || {
		tail -30 "$tmp/mmdebstrap.log" >&2
		echo "run.sh: mmdebstrap failed" >&2
		return 1
	}
	printf '%s\n' "$image_init" >"$tmp/root/lwio-init"
	chmod 755 "$tmp/root/lwio-init"
	cp "$tmp"/root/boot/vmlinuz-* "$tmp/vmlinuz"
	cp "$tmp"/root/boot/initrd.img-* "$tmp/initrd.img"
	mke2fs -q -t ext4 -L lwiovm -d "$tmp/root" "$tmp/rootfs.ext4" 1500M
	rm -rf "$tmp/root"
	mkdir -p "$dir"
	mv "$tmp/vmlinuz" "$tmp/initrd.img" "$tmp/rootfs.ext4" "$dir/"
	printf '%s\n' "$srcs" >"$dir/sources"
	log "image built in $(elapsed "$t0") s: $dir"
}

(
	flock 9
	if [ ! -f "$img" ] || [ ! -f "$kernel" ] || [ ! -f "$initrd" ]; then
		build_image
	fi
) 9>"$cache/.lock"
# Older images (other keys) are left for a human to remove; say so once.
stale=$(find "$cache" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name 'build.*' | wc -l)
[ "$stale" = 0 ] || log "$stale stale image(s) in $cache (inputs changed); safe to delete"

# ---------------------------------------------------------------- run ------

work=$(mktemp -d /tmp/lwiofs-vm.XXXXXX)
share=$work/share
mkdir -p "$share/out"
qpid=
cleanup() {
	if [ -n "$qpid" ] && kill -0 "$qpid" 2>/dev/null; then
		log "killing qemu (pid $qpid)"
		kill "$qpid" 2>/dev/null || true
		sleep 1
		kill -9 "$qpid" 2>/dev/null || true
	fi
	if [ "${LWIOFS_VM_KEEP:-0}" = 1 ]; then log "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for f in "${files[@]+"${files[@]}"}"; do
	cp -p "$f" "$share/$(basename "$f")"
done
names=()
for b in "${bins[@]}"; do
	n=$(basename "$b")
	cp "$b" "$share/$n"
	names+=("$n")
done
# Per-binary limit inside the guest: the whole budget minus boot time.
inner=$((timeout_s > 120 ? timeout_s - 60 : timeout_s))
{
	echo '#!/bin/bash'
	echo 'exec >/mnt/share/out/guest.log 2>&1'
	echo 'set -x'
	echo 'ip link set lo up'
	echo 'modprobe rdma_rxe && modprobe rdma_ucm || echo "SETUP-FAILED modprobe"'
	echo 'ip link add dum0 type dummy && ip addr add '"$guest_ip"'/24 dev dum0 && ip link set dum0 up || echo "SETUP-FAILED dummy"'
	echo 'rdma link add rxe0 type rxe netdev dum0 || echo "SETUP-FAILED rxe"'
	echo 'rdma link show; ibv_devices; ibv_devinfo -d rxe0 | head -20'
	echo 'ulimit -l unlimited'
	echo 'export LWIOFS_VERBS_ADDR='"$guest_ip"' LWIOFS_VM=1 LWIOFS_VM_SHARE=/mnt/share HOME=/tmp TMPDIR=/tmp'
	echo 'set +x'
	echo 'cd /tmp'
	q=$(printf ' %q' "${args[@]+"${args[@]}"}")
	for n in "${names[@]}"; do
		echo "echo '=== $n start'; t0=\$(date +%s.%N)"
		echo "timeout -k 5 $inner /mnt/share/$n$q >/mnt/share/out/$n.log 2>&1 </dev/null; rc=\$?"
		echo "echo \$rc >/mnt/share/out/$n.rc"
		echo "echo \"=== $n exit \$rc in \$(awk -v a=\$t0 -v b=\$(date +%s.%N) 'BEGIN{printf \"%.1f\", b-a}') s\""
	done
	echo 'sync'
} >"$share/guest.sh"

smp=${LWIOFS_VM_SMP:-2}
mem=${LWIOFS_VM_MEM:-2048}
log "booting guest (TCG, -smp $smp, ${mem} MiB); budget ${timeout_s} s"
t0=$(now)
timeout -k 10 "$timeout_s" qemu-system-x86_64 \
	-accel "${LWIOFS_VM_ACCEL:-tcg,thread=multi}" -cpu max -smp "$smp" -m "$mem" \
	-nographic -no-reboot -nic none \
	-kernel "$kernel" -initrd "$initrd" \
	-append "root=/dev/vda rw console=ttyS0 init=/lwio-init panic=-1 quiet loglevel=4" \
	-drive "file=$img,format=raw,if=virtio,snapshot=on" \
	-virtfs "local,path=$share,mount_tag=share,security_model=none,id=share" \
	</dev/null >"$work/console.log" 2>&1 &
qpid=$!
set +e
wait "$qpid"
qrc=$?
set -e
qpid=
log "guest ran $(elapsed "$t0") s (qemu exit $qrc)"

[ -z "$outdir" ] || { mkdir -p "$outdir"; cp -r "$share/out/." "$outdir/"; cp "$work/console.log" "$outdir/"; }

if [ -f "$share/out/guest.log" ]; then
	sed 's/^/guest: /' "$share/out/guest.log" >&2
fi
status=0
for n in "${names[@]}"; do
	if [ -f "$share/out/$n.rc" ]; then
		rc=$(cat "$share/out/$n.rc")
		echo "=== $n (exit $rc)"
		cat "$share/out/$n.log"
		[ "$rc" = 0 ] || status=1
	else
		echo "=== $n: no result from the guest"
		[ ! -f "$share/out/$n.log" ] || cat "$share/out/$n.log"
		status=3
	fi
done
if [ $status = 3 ] || grep -q SETUP-FAILED "$share/out/guest.log" 2>/dev/null; then
	echo "--- guest console (tail)"
	tail -40 "$work/console.log"
	[ $status != 0 ] || status=3
fi
exit $status

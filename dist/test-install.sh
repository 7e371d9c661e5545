#!/usr/bin/env bash
# test-install.sh installs lwiofs for real, as an administrator would, and
# checks that it works and leaves nothing behind (`make test-install`; CI
# runs it as root on a clean machine):
#
#   1. make install to the default PREFIX (/usr/local): the man pages render
#      with man -l, the installed unit passes systemd-analyze verify (where
#      systemd is installed), -version names the build's revision, the
#      example configuration is mode 0600 and parses;
#   2. the installed lwio-server, under the unit's capability bounding set
#      and no_new_privs, serves a temporary share on 127.0.0.1 (user added
#      with lwio-server adduser);
#   3. mount -t fuse.lwio //127.0.0.1:PORT/share DIR -o credentials=FILE,
#      a file read back whole, umount;
#   4. an fstab line with _netdev,noauto,nofail,x-systemd.automount,
#      `mount DIR`, the read, umount, /etc/fstab restored byte for byte;
#   5. make uninstall: PREFIX and /etc/lwio exactly as before;
#   6. make deb, dpkg -i: the same checks against /usr, a mount through
#      /usr/bin/lwio; dpkg --purge leaves none of the package's files.
#
# Safe on a developer machine: it refuses to start when lwiofs is installed
# already (under PREFIX or as a package), and on any failure it unmounts,
# stops its server, restores /etc/fstab and uninstalls what it installed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin" DEBIAN_FRONTEND=noninteractive
MAKE=${MAKE:-make}

fail() { echo "test-install: FAIL: $*" >&2; exit 1; }
ok() { echo "test-install: ok: $*"; passed=$((passed + 1)); }
passed=0
t0=$(date +%s)

[ "$(id -u)" = 0 ] || fail "run as root: this installs under /usr/local and /usr for real"
[ -z "${DESTDIR:-}" ] || fail "DESTDIR is set; this tests a real install"
PREFIX=${PREFIX:-/usr/local}
[ "$PREFIX" = /usr/local ] || fail "PREFIX=$PREFIX: this tests the default PREFIX, /usr/local (the one mount.fuse3's shell finds)"
# The layout, as the Makefile and dist/install.sh default it.
: "${BINDIR:=$PREFIX/bin}" "${SBINDIR:=$PREFIX/sbin}" "${MANDIR:=$PREFIX/share/man}"
: "${DATADIR:=$PREFIX/share/lwiofs}" "${UNITDIR:=$PREFIX/lib/systemd/system}" "${SYSCONFDIR:=/etc}"
export PREFIX BINDIR SBINDIR MANDIR DATADIR UNITDIR SYSCONFDIR

for f in "$BINDIR/lwio" "$BINDIR/lwio-mount" "$SBINDIR/lwio-server" "$UNITDIR/lwio-server.service" "$DATADIR" \
	/usr/bin/lwio /usr/bin/lwio-mount /usr/sbin/lwio-server; do
	[ ! -e "$f" ] || fail "$f exists: lwiofs is installed already; uninstall it first (make uninstall / dpkg --purge lwiofs)"
done
if dpkg-query -W -f '${Status}' lwiofs 2>/dev/null | grep -q 'installed\|config-files'; then
	fail "the lwiofs package is installed; dpkg --purge lwiofs first"
fi

T=$(mktemp -d /tmp/lwiofs-install-test.XXXXXX)
installed= deb_installed= server_pid= fstab_saved=
config_existed=; [ ! -e "$SYSCONFDIR/lwio/server.toml" ] || config_existed=1

restore_fstab() {
	if [ "$fstab_saved" = yes ]; then
		cp -p "$T/fstab.orig" /etc/fstab
	elif [ "$fstab_saved" = absent ]; then
		rm -f /etc/fstab
	fi
	fstab_saved=
}

stop_server() {
	[ -n "$server_pid" ] || return 0
	kill -TERM "$server_pid" 2>/dev/null || true
	local rc=0
	wait "$server_pid" || rc=$?
	server_pid=
	return $rc
}

cleanup() {
	local rc=$?
	trap - EXIT
	for m in "$T"/mnt*; do
		if mountpoint -q "$m" 2>/dev/null; then umount "$m" 2>/dev/null || umount -l "$m" || true; fi
	done
	stop_server || true
	restore_fstab
	[ -z "$installed" ] || dist/install.sh uninstall >/dev/null 2>&1 || true
	[ -z "$deb_installed" ] || dpkg --purge lwiofs >/dev/null 2>&1 || true
	if [ $rc -ne 0 ]; then
		for l in "$T"/*.log; do [ -s "$l" ] && { echo "--- $l"; tail -20 "$l"; }; done >&2
	fi
	rm -rf "$T"
	exit $rc
}
trap cleanup EXIT

# snapshot lists PREFIX and the configuration directory: path, type, mode.
snapshot() {
	find "$PREFIX" "$SYSCONFDIR/lwio" -xdev -printf '%p %y %m\n' 2>/dev/null | sort || true
}

# port_free reports whether nothing accepts connections on 127.0.0.1:$1.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# check_pages renders each man page with man -l: no warnings, a NAME section.
check_pages() {
	local p out
	for p in "$@"; do
		out=$(MANWIDTH=80 man -l "$p" 2>"$T/man.err") || fail "man -l $p failed: $(cat "$T/man.err")"
		[ ! -s "$T/man.err" ] || fail "man -l $p warns: $(cat "$T/man.err")"
		grep -q '^NAME' <<<"$out" || fail "man -l $p has no NAME section"
	done
	ok "man -l renders $(printf '%s ' "${@##*/}")"
}

# check_unit verifies the installed unit, man pages included, where
# systemd-analyze exists.
check_unit() {
	if ! command -v systemd-analyze >/dev/null; then
		echo "test-install: note: systemd-analyze not installed; unit not verified here (go test ./dist verifies the template where it is)"
		return
	fi
	systemd-analyze verify "$1" >"$T/verify.out" 2>&1 || fail "systemd-analyze verify $1: $(cat "$T/verify.out")"
	[ ! -s "$T/verify.out" ] || fail "systemd-analyze verify $1 warns: $(cat "$T/verify.out")"
	ok "systemd-analyze verify $1"
}

# check_programs: -version on each program, the example configuration.
check_programs() {
	local bindir=$1 sbindir=$2 p line
	for p in "$bindir/lwio" "$bindir/lwio-mount" "$sbindir/lwio-server"; do
		line=$("$p" -version) || fail "$p -version failed"
		[[ $line == "${p##*/} "*"(revision "* ]] || fail "$p -version: $line"
		# A clone (as in CI) stamps the revision; a git worktree does not
		# (the go command's VCS stamping does not read worktrees).
		if [ -d .git ] && rev=$(git rev-parse HEAD 2>/dev/null); then
			[[ $line == *"revision $rev"* ]] || fail "$p -version does not name HEAD $rev: $line"
		fi
	done
	ok "-version: $line"
	local conf=$SYSCONFDIR/lwio/server.toml
	if [ -z "$config_existed" ]; then
		[ "$(stat -c %a "$conf")" = 600 ] || fail "$conf is mode $(stat -c %a "$conf"), want 600"
		local rc=0
		"$sbindir/lwio-server" -config "$conf" >/dev/null 2>"$T/conf.err" || rc=$?
		[ $rc = 2 ] && grep -q "no shares configured" "$T/conf.err" ||
			fail "the example configuration should parse and lack only shares (exit $rc: $(cat "$T/conf.err"))"
		ok "$conf: mode 600, parses (lwio-server: $(cat "$T/conf.err"))"
	fi
}

# start_server runs SBINDIR/lwio-server on a fresh port pair under the
# unit's capability bounding set and no_new_privs.
start_server() {
	local sbindir=$1 unit=$2 caps
	caps=$(sed -n 's/^CapabilityBoundingSet=//p' "$unit" | tr 'A-Z' 'a-z' | sed 's/cap_/+/g; s/ /,/g')
	[ -n "$caps" ] || fail "$unit has no CapabilityBoundingSet"
	for _ in $(seq 50); do
		port=$((20000 + RANDOM % 40000))
		port_free "$port" && port_free $((port + 1)) && break
	done
	cat >"$T/server.toml" <<-EOF
	[listen]
	session = "127.0.0.1:$port"
	softrdma = ["127.0.0.1:$((port + 1))"]

	[shares.share]
	path = "$T/share"
	allow_root = true

	# tester has no Unix account here: it acts as root.
	[users.tester]
	account = "root"
	EOF
	LWIO_PASSWORD=$password "$sbindir/lwio-server" adduser -config "$T/server.toml" tester 2>/dev/null ||
		fail "lwio-server adduser"
	setpriv --bounding-set "-all,$caps" --no-new-privs -- \
		"$sbindir/lwio-server" -config "$T/server.toml" >>"$T/server.log" 2>&1 &
	server_pid=$!
	for _ in $(seq 100); do
		kill -0 "$server_pid" 2>/dev/null || fail "lwio-server exited at start"
		port_free "$port" || break
		sleep 0.1
	done
	port_free "$port" && fail "lwio-server is not listening on 127.0.0.1:$port"
	ok "lwio-server $sbindir (bounding set ${caps//+/}, no_new_privs $(sed -n 's/^NoNewPrivs:\t//p' /proc/$server_pid/status)) on 127.0.0.1:$port"
}

# check_mount mounts with the given command (run with the mount point as its
# last argument), reads the test file back whole, and unmounts.
check_mount() {
	local what=$1 mnt=$2
	shift 2
	mkdir -p "$mnt"
	"$@" || fail "$what: mount failed"
	[ "$(findmnt -n -o FSTYPE "$mnt")" = fuse.lwio ] || fail "$what: $mnt is not a fuse.lwio mount: $(findmnt -n "$mnt")"
	cmp -s "$T/share/data.bin" "$mnt/data.bin" || fail "$what: data.bin read through the mount differs"
	umount "$mnt" || fail "$what: umount failed"
	! mountpoint -q "$mnt" || fail "$what: still mounted after umount"
	ok "$what: //127.0.0.1:$port/share on $mnt, read 1 MiB back, unmounted"
}

password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir -p "$T/share"
head -c 1048576 /dev/urandom >"$T/share/data.bin"
printf 'username=tester\npassword=%s\n' "$password" >"$T/cred"
chmod 600 "$T/cred"
cp -p /etc/fstab "$T/fstab.orig" 2>/dev/null && fstab_state=yes || fstab_state=absent

# 1. make install.
before=$(snapshot)
installed=1
$MAKE -s install >"$T/install.log" 2>&1 || fail "make install: $(tail -5 "$T/install.log")"
ok "make install (PREFIX=$PREFIX)"
check_pages "$MANDIR/man8/lwio-server.8" "$MANDIR/man8/lwio-mount.8" "$MANDIR/man5/lwio.toml.5"
# man lwio shows lwio-mount(8); /usr/local/man may be a link to share/man.
[ "$(realpath "$(man -w lwio)")" = "$(realpath "$MANDIR/man8/lwio-mount.8")" ] &&
	[ "$(realpath "$(man -w lwio-server)")" = "$(realpath "$MANDIR/man8/lwio-server.8")" ] ||
	fail "man does not find the installed pages: $(man -w lwio lwio-server 2>&1)"
ok "man lwio-server, man lwio (lwio-mount(8)) find the installed pages"
check_unit "$UNITDIR/lwio-server.service"
check_programs "$BINDIR" "$SBINDIR"

# 2-4. A server from the install; mounts through mount(8) and fstab.
start_server "$SBINDIR" "$UNITDIR/lwio-server.service"
check_mount "mount -t fuse.lwio" "$T/mnt1" \
	mount -t fuse.lwio "//127.0.0.1:$port/share" "$T/mnt1" -o "credentials=$T/cred,log=$T/mount1.log"
grep -q 'msg=mounted' "$T/mount1.log" || fail "no 'mounted' line in the mount's log"
echo "test-install: the mount's log: $(grep -o 'data_path=[^ ]*' "$T/mount1.log" | head -1)"
fstab_saved=$fstab_state
printf '%s\n' "//127.0.0.1:$port/share $T/mnt2 fuse.lwio credentials=$T/cred,_netdev,noauto,nofail,x-systemd.automount,comment=lwiofs-test-install,log=$T/mount2.log 0 0" >>/etc/fstab
check_mount "fstab line, mount $T/mnt2" "$T/mnt2" mount "$T/mnt2"
restore_fstab
if [ "$fstab_state" = yes ]; then
	cmp -s "$T/fstab.orig" /etc/fstab || fail "/etc/fstab differs from before"
fi
ok "/etc/fstab restored"
stop_server || fail "lwio-server did not exit 0 on SIGTERM"
ok "lwio-server stopped by SIGTERM, exit 0"

# 5. make uninstall leaves PREFIX and /etc/lwio as they were.
$MAKE -s uninstall >"$T/uninstall.log" 2>&1 || fail "make uninstall: $(tail -5 "$T/uninstall.log")"
installed=
after=$(snapshot)
if [ "$before" != "$after" ]; then
	diff <(echo "$before") <(echo "$after") >&2 || true
	fail "make uninstall left the tree different from before install (diff above: < before, > after)"
fi
ok "make uninstall: $PREFIX and $SYSCONFDIR/lwio exactly as before ($(wc -l <<<"$before") entries compared)"

# 6. The Debian package.
deb=$($MAKE -s deb 2>"$T/deb.log" | tail -1) || fail "make deb: $(tail -5 "$T/deb.log")"
[ -f "$deb" ] || fail "make deb printed no package: $deb"
depends=$(dpkg-deb -f "$deb" Depends) recommends=$(dpkg-deb -f "$deb" Recommends)
[[ $depends == *fuse3* && $depends == *libc6* ]] || fail "$deb Depends: $depends"
[ "$recommends" = "libibverbs1, librdmacm1" ] || fail "$deb Recommends: $recommends"
ok "make deb: $deb (Depends: $depends; Recommends: $recommends)"
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' | grep -v '/$' >"$T/deb.files"
for f in /usr/bin/lwio /usr/bin/lwio-mount /usr/sbin/lwio-server /usr/lib/systemd/system/lwio-server.service \
	/usr/share/man/man8/lwio-server.8.gz /usr/share/man/man8/lwio-mount.8.gz /usr/share/man/man8/lwio.8.gz \
	/usr/share/man/man5/lwio.toml.5.gz /usr/share/lwiofs/server.toml; do
	grep -qx "$f" "$T/deb.files" || fail "$deb lacks $f"
done
deb_installed=1
dpkg -i "$deb" >"$T/dpkg.log" 2>&1 || fail "dpkg -i: $(tail -5 "$T/dpkg.log")"
ok "dpkg -i $(basename "$deb")"
check_pages /usr/share/man/man8/lwio-server.8.gz /usr/share/man/man8/lwio-mount.8.gz /usr/share/man/man5/lwio.toml.5.gz
check_unit /usr/lib/systemd/system/lwio-server.service
check_programs /usr/bin /usr/sbin
start_server /usr/sbin /usr/lib/systemd/system/lwio-server.service
check_mount "package: mount -t fuse.lwio" "$T/mnt3" \
	mount -t fuse.lwio "//127.0.0.1:$port/share" "$T/mnt3" -o "credentials=$T/cred,log=$T/mount3.log"
stop_server || fail "lwio-server (package) did not exit 0 on SIGTERM"
dpkg --purge lwiofs >"$T/dpkg.log" 2>&1 || fail "dpkg --purge: $(tail -5 "$T/dpkg.log")"
deb_installed=
while read -r f; do
	[ ! -e "$f" ] && [ ! -L "$f" ] || fail "dpkg --purge left $f"
done <"$T/deb.files"
[ -n "$config_existed" ] || [ ! -e "$SYSCONFDIR/lwio" ] || fail "dpkg --purge left $SYSCONFDIR/lwio"
ok "dpkg --purge lwiofs: none of its $(wc -l <"$T/deb.files") files left, no $SYSCONFDIR/lwio"
rm -f "$deb"

echo "test-install: $passed passed, 0 failed in $(($(date +%s) - t0)) s"

#!/usr/bin/env bash
# install.sh installs and uninstalls lwiofs; `make install` and
# `make uninstall` run it with the Makefile's layout variables:
#
#   DESTDIR PREFIX BINDIR SBINDIR MANDIR DATADIR UNITDIR SYSCONFDIR
#   BIN   where `make build` and `make man` left the programs and pages
#
#   dist/install.sh install     the programs, the man pages, the systemd
#                               unit, the example configuration (and a copy
#                               at SYSCONFDIR/lwio/server.toml, mode 0600,
#                               only if none is there)
#   dist/install.sh uninstall   all of it; the configuration only if this
#                               install created it and it is unchanged
#
# A direct install (no DESTDIR) records in DATADIR/installed every file it
# wrote and every directory it had to create, so that uninstall removes
# exactly those and leaves directories that were there before. A staged
# install (DESTDIR) records nothing: the packager's tool tracks the files.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${PREFIX:=/usr/local}"
: "${BINDIR:=$PREFIX/bin}" "${SBINDIR:=$PREFIX/sbin}" "${MANDIR:=$PREFIX/share/man}"
: "${DATADIR:=$PREFIX/share/lwiofs}" "${UNITDIR:=$PREFIX/lib/systemd/system}"
: "${SYSCONFDIR:=/etc}" "${BIN:=bin}"
D=${DESTDIR:-}
manifest="$D$DATADIR/installed"
config="$SYSCONFDIR/lwio/server.toml"

# files lists what an install writes: "MODE SOURCE TARGET". The unit is
# made from its template; lwio.8 is a link to lwio-mount.8 (`man lwio`).
files() {
	cat <<-EOF
	755 $BIN/lwio-mount $BINDIR/lwio-mount
	755 $BIN/lwio $BINDIR/lwio
	755 $BIN/lwio-server $SBINDIR/lwio-server
	644 $BIN/man/lwio-mount.8 $MANDIR/man8/lwio-mount.8
	644 $BIN/man/lwio-server.8 $MANDIR/man8/lwio-server.8
	644 $BIN/man/lwio.toml.5 $MANDIR/man5/lwio.toml.5
	644 dist/server.toml $DATADIR/server.toml
	644 dist/lwio-server.service.in $UNITDIR/lwio-server.service
	EOF
}

reload_systemd() {
	if [ -z "$D" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
		systemctl daemon-reload || true
	fi
}

created_dirs=()
# makedir creates a directory and its missing parents, remembering each one
# it created, top-down.
makedir() {
	local d=$1 missing=()
	while [ "$d" != / ] && [ ! -d "$D$d" ]; do
		missing=("$d" "${missing[@]}")
		d=$(dirname "$d")
	done
	for d in "${missing[@]}"; do
		install -d -m 755 "$D$d"
		created_dirs+=("$d")
	done
}

do_install() {
	local mode src dst
	[ -z "$D" ] || mkdir -p "$D"
	for src in "$BIN/lwio-mount" "$BIN/lwio" "$BIN/lwio-server" "$BIN/man/lwio-mount.8"; do
		[ -e "$src" ] || { echo "install.sh: $src missing: run make build man first" >&2; exit 1; }
	done
	# A second install keeps the directories the first one created.
	if [ -z "$D" ] && [ -f "$manifest" ]; then
		mapfile -t created_dirs < <(sed -n 's/^dir //p' "$manifest")
	fi
	local written=() made_config=
	while read -r mode src dst; do
		makedir "$(dirname "$dst")"
		if [ "$src" = dist/lwio-server.service.in ]; then
			sed -e "s|@SBINDIR@|$SBINDIR|g" -e "s|@SYSCONFDIR@|$SYSCONFDIR|g" "$src" >"$D$dst.tmp"
			chmod "$mode" "$D$dst.tmp"
			mv -f "$D$dst.tmp" "$D$dst"
		else
			install -m "$mode" "$src" "$D$dst"
		fi
		written+=("$dst")
	done < <(files)
	ln -sfn lwio-mount.8 "$D$MANDIR/man8/lwio.8"
	written+=("$MANDIR/man8/lwio.8")
	if [ -e "$D$config" ] || [ -L "$D$config" ]; then
		echo "install.sh: keeping the existing $D$config"
	else
		makedir "$(dirname "$config")"
		install -m 600 dist/server.toml "$D$config"
		made_config=1
		echo "install.sh: wrote the example configuration $D$config (mode 0600)"
	fi
	if [ -z "$D" ]; then
		# An earlier install's record of the configuration stands.
		if [ -f "$manifest" ] && grep -qx "config $config" "$manifest"; then
			made_config=1
		fi
		{
			printf 'file %s\n' "${written[@]}"
			[ -z "$made_config" ] || printf 'config %s\n' "$config"
			[ ${#created_dirs[@]} -eq 0 ] || printf 'dir %s\n' "${created_dirs[@]}"
		} >"$manifest.tmp"
		mv -f "$manifest.tmp" "$manifest"
	fi
	reload_systemd
	echo "install.sh: installed lwiofs under $D$PREFIX; the unit is $D$UNITDIR/lwio-server.service"
}

do_uninstall() {
	local kind path recorded=()
	if [ -z "$D" ] && [ -f "$manifest" ]; then
		mapfile -t recorded <"$manifest"
	else
		# No record (a staged install, or one made before records were
		# kept): the known files, and the configuration only if it is
		# the untouched example.
		while read -r _ _ path; do recorded+=("file $path"); done < <(files)
		recorded+=("file $MANDIR/man8/lwio.8" "config $config")
	fi
	if [ -e "$D$DATADIR/server.toml" ] && [ -f "$D$config" ] && printf '%s\n' "${recorded[@]}" | grep -qx "config $config"; then
		if cmp -s "$D$config" "$D$DATADIR/server.toml"; then
			rm -f "$D$config"
		else
			echo "install.sh: keeping $D$config: it was changed after install (remove it by hand)"
		fi
	fi
	for kind in "${recorded[@]}"; do
		case $kind in
		"file "*) rm -f "$D${kind#file }" ;;
		esac
	done
	rm -f "$manifest"
	# Directories the install created, deepest first, if now empty.
	local i
	for ((i = ${#recorded[@]} - 1; i >= 0; i--)); do
		case ${recorded[i]} in
		"dir "*) rmdir "$D${recorded[i]#dir }" 2>/dev/null || true ;;
		esac
	done
	if [ -n "$D" ]; then
		rmdir "$D$DATADIR" "$D$SYSCONFDIR/lwio" 2>/dev/null || true
	fi
	reload_systemd
	echo "install.sh: uninstalled lwiofs from $D$PREFIX"
}

case ${1:-} in
install) do_install ;;
uninstall) do_uninstall ;;
*) echo "usage: dist/install.sh install|uninstall" >&2; exit 2 ;;
esac
